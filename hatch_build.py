"""Build hook: compile the optional native fact scan (proxy/providers/_factscan.c).

It is one C file against Python's own headers, built with the compiler Python was built with
(`sysconfig`'s CC), into the package directory (so an editable install imports it too) and
shipped in the wheel, which is then tagged for this platform. Without a compiler, or if the
compile fails, the build goes on pure-Python: facts.py falls back to its own scan (same
results, several times slower). COMPACTD_NO_NATIVE=1 skips it.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sysconfig
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = Path("proxy/providers/_factscan.c")


class NativeScanHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        """Compile the extension next to its source; ship it if that worked."""
        if os.environ.get("COMPACTD_NO_NATIVE") == "1":
            return
        root = Path(self.root)
        source = root / SOURCE
        target = source.with_name("_factscan" + str(sysconfig.get_config_var("EXT_SUFFIX")))
        cc = shlex.split(str(sysconfig.get_config_var("CC") or "cc"))
        command = [
            *cc,
            "-O2",
            "-shared",
            "-fPIC",
            f"-I{sysconfig.get_paths()['include']}",
            str(source),
            "-o",
            str(target),
        ]
        try:
            # The command is sysconfig's compiler and fixed paths, no outside input.
            subprocess.run(command, check=True, capture_output=True, text=True)  # noqa: S603
        except (OSError, subprocess.CalledProcessError) as e:
            target.unlink(missing_ok=True)  # never an older build beside a newer source
            detail = getattr(e, "stderr", "") or str(e)
            self.app.display_warning(f"native fact scan not built (pure Python): {detail}")
            return
        if version == "editable":  # imported from the source tree, where it was built
            return
        relative = target.relative_to(root).as_posix()
        build_data["force_include"][str(target)] = relative
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
