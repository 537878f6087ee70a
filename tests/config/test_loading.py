"""Loading the settings: one precedence, every problem at once, each named by its key."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.config import load_settings
from proxy.errors import ConfigError


def test_the_cli_beats_the_environment_which_beats_the_file(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[server]\nport = 9000\nworkers = 3\n[limits]\nmax_connections = 10\n")
    env = {"COMPACTD_SERVER_PORT": "9001", "COMPACTD_SERVER_WORKERS": "4"}
    settings = load_settings(path, env=env, overrides={"server": {"port": 9002}})
    assert (settings.server.port, settings.server.workers) == (9002, 4)
    assert settings.limits.max_connections == 10
    assert settings.server.max_headers == 100  # the default


def test_every_bad_value_of_a_load_is_reported_at_once_with_its_key(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        "[server]\nport = 0\n[limits]\nhead_timeout_seconds = 4000.0\n"
        '[default_policy]\nmin_saving = 1.0\ntarget_ratio = 0.9\ntrigger_ratio = 0.8\nmode = "on"\n'
    )
    with pytest.raises(ConfigError) as caught:
        load_settings(path, env={"COMPACTD_TOKENS_SAFETY_MARGIN": "-1", "COMPACTD_PORT": "1"})
    assert sorted(caught.value.problems) == [
        "COMPACTD_PORT: unknown environment variable (did you mean COMPACTD_SERVER_PORT?)",
        "default_policy.min_saving: must be < 1, not 1.0",
        "default_policy.mode: must be one of ('enforce', 'shadow', 'off'), not 'on'",
        "default_policy.target_ratio: must be <= trigger_ratio",
        "limits.head_timeout_seconds: must be <= 3600, not 4000.0",
        "server.port: must be >= 1, not 0",
        "tokens.safety_margin: must be >= 0, not -1",
    ]


def test_a_policy_list_is_a_list_of_tables() -> None:
    with pytest.raises(ConfigError, match=r"^policies\[0\]: must be a table$"):
        load_settings(None, env={}, overrides={"policies": ["x"]})
    settings = load_settings(None, env={}, overrides={"policies": [{"name": "a"}]})
    assert [p.name for p in settings.all_policies()] == ["a", "default"]
