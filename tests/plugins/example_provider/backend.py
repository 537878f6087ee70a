"""A minimal PEP 517 backend (standard library only): builds this one package into a wheel."""

from __future__ import annotations

import base64
import hashlib
import tomllib
import zipfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent


def _project() -> dict[str, Any]:
    data: dict[str, Any] = tomllib.loads((HERE / "pyproject.toml").read_text())["project"]
    return data


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(
    wheel_directory: str,
    config_settings: dict[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    """Write the wheel and return its file name."""
    project = _project()
    dist = project["name"].replace("-", "_")
    info = f"{dist}-{project['version']}.dist-info"
    entry_points = "".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items())
        for group, eps in project.get("entry-points", {}).items()
    )
    files = {
        f"{p.relative_to(HERE).as_posix()}": p.read_bytes()
        for p in sorted((HERE / "compactd_example_provider").glob("*.py"))
    }
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    ).encode()
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: backend\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    files[f"{info}/entry_points.txt"] = entry_points.encode()
    record = [_record_line(name, data) for name, data in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    name = f"{dist}-{project['version']}-py3-none-any.whl"
    with zipfile.ZipFile(Path(wheel_directory) / name, "w") as wheel:
        for path, data in files.items():
            wheel.writestr(path, data)
    return name
