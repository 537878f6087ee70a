"""Policy matching: rules by key id, model glob and trusted header; selection; bypass."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.datastructures import Headers

from proxy.chat.policy import PolicyResolver
from proxy.config import PolicySettings, Settings, load_settings
from proxy.errors import ConfigError

KEY_A = "0123456789ab"
KEY_B = "ba9876543210"


def resolver(*policies: PolicySettings, default: PolicySettings | None = None) -> PolicyResolver:
    settings = Settings(default_policy=default or PolicySettings(), policies=policies)
    settings.validate()
    return PolicyResolver(settings)


def test_no_rules_gives_default_policy() -> None:
    d = resolver().resolve(key_fingerprint=KEY_A, model="gpt-4o", headers={})
    assert d.name == "default"
    assert d.matched.name == "default"
    assert not d.bypass
    assert not d.requested_policy_refused


def test_key_fingerprint_rule_matches_only_listed_keys() -> None:
    r = resolver(PolicySettings(name="team-a", match_keys=(KEY_A,)))
    assert r.resolve(key_fingerprint=KEY_A, model="m", headers={}).name == "team-a"
    assert r.resolve(key_fingerprint=KEY_B, model="m", headers={}).name == "default"
    assert r.resolve(key_fingerprint=None, model="m", headers={}).name == "default"


def test_key_fingerprint_in_config_is_case_insensitive() -> None:
    r = resolver(PolicySettings(name="team-a", match_keys=(KEY_A.upper(),)))
    assert r.resolve(key_fingerprint=KEY_A, model="m", headers={}).name == "team-a"


def test_model_globs_match_whole_model_name() -> None:
    r = resolver(PolicySettings(name="minis", match_models=("gpt-4o-mini*", "o[34]-mini")))
    assert r.resolve(key_fingerprint=None, model="gpt-4o-mini-2024-07-18", headers={}).name == (
        "minis"
    )
    assert r.resolve(key_fingerprint=None, model="o3-mini", headers={}).name == "minis"
    assert r.resolve(key_fingerprint=None, model="o3-mini-high", headers={}).name == "default"
    assert r.resolve(key_fingerprint=None, model="gpt-4o", headers={}).name == "default"
    assert r.resolve(key_fingerprint=None, model="xgpt-4o-mini", headers={}).name == "default"


def test_header_rule_with_values_matches_only_those_values() -> None:
    r = resolver(
        PolicySettings(name="search", match_header="X-Team", match_header_values=("search",))
    )
    assert r.resolve(key_fingerprint=None, model="m", headers={"x-team": "search"}).name == (
        "search"
    )
    assert r.resolve(key_fingerprint=None, model="m", headers={"x-team": "ads"}).name == "default"
    assert r.resolve(key_fingerprint=None, model="m", headers={}).name == "default"


def test_header_rule_without_values_matches_any_non_empty_value() -> None:
    r = resolver(PolicySettings(name="teamed", match_header="x-team"))
    assert r.resolve(key_fingerprint=None, model="m", headers={"x-team": "ads"}).name == "teamed"
    assert r.resolve(key_fingerprint=None, model="m", headers={"x-team": " "}).name == "default"


def test_all_criteria_of_one_policy_must_hold() -> None:
    r = resolver(PolicySettings(name="a-minis", match_keys=(KEY_A,), match_models=("*-mini",)))
    assert r.resolve(key_fingerprint=KEY_A, model="o3-mini", headers={}).name == "a-minis"
    assert r.resolve(key_fingerprint=KEY_A, model="gpt-4o", headers={}).name == "default"
    assert r.resolve(key_fingerprint=KEY_B, model="o3-mini", headers={}).name == "default"


def test_first_matching_policy_wins() -> None:
    r = resolver(
        PolicySettings(name="first", match_models=("gpt-*",)),
        PolicySettings(name="second", match_keys=(KEY_A,)),
    )
    assert r.resolve(key_fingerprint=KEY_A, model="gpt-4o", headers={}).name == "first"
    assert r.resolve(key_fingerprint=KEY_A, model="o3", headers={}).name == "second"


def test_policy_without_criteria_is_reachable_only_by_selection() -> None:
    r = resolver(
        PolicySettings(name="aggressive", target_ratio=0.5),
        default=PolicySettings(selectable=("aggressive",)),
    )
    assert r.resolve(key_fingerprint=KEY_A, model="m", headers={}).name == "default"
    picked = r.resolve(
        key_fingerprint=KEY_A, model="m", headers={"x-compactd-policy": "aggressive"}
    )
    assert picked.name == "aggressive"
    assert picked.matched.name == "default"
    assert not picked.requested_policy_refused


def test_requested_policy_not_selectable_is_refused() -> None:
    r = resolver(PolicySettings(name="other", match_keys=(KEY_B,)))
    d = r.resolve(key_fingerprint=KEY_A, model="m", headers={"x-compactd-policy": "other"})
    assert d.name == "default"
    assert d.requested_policy == "other"
    assert d.requested_policy_refused


def test_unknown_requested_policy_is_refused_not_an_error() -> None:
    d = resolver().resolve(key_fingerprint=None, model="m", headers={"x-compactd-policy": "nope"})
    assert d.name == "default"
    assert d.requested_policy_refused


def test_requesting_the_matched_policy_is_not_a_refusal() -> None:
    d = resolver().resolve(
        key_fingerprint=None, model="m", headers={"x-compactd-policy": "default"}
    )
    assert d.name == "default"
    assert not d.requested_policy_refused


def test_selection_is_one_hop_from_the_matched_policy() -> None:
    r = resolver(
        PolicySettings(name="b", selectable=("c",)),
        PolicySettings(name="c"),
        default=PolicySettings(selectable=("b",)),
    )
    assert (
        r.resolve(key_fingerprint=None, model="m", headers={"x-compactd-policy": "b"}).name == "b"
    )
    d = r.resolve(key_fingerprint=None, model="m", headers={"x-compactd-policy": "c"})
    assert d.name == "default"
    assert d.requested_policy_refused


def test_bypass_honoured_when_policy_allows_it() -> None:
    d = resolver().resolve(key_fingerprint=None, model="m", headers={"x-compactd-bypass": "1"})
    assert d.bypass
    assert d.forward_raw
    assert not d.bypass_refused


def test_bypass_refused_when_policy_forbids_it() -> None:
    r = resolver(default=PolicySettings(allow_bypass=False))
    d = r.resolve(key_fingerprint=None, model="m", headers={"x-compactd-bypass": "1"})
    assert not d.bypass
    assert not d.forward_raw
    assert d.bypass_refused


def test_bypass_permission_is_taken_from_the_selected_policy() -> None:
    r = resolver(
        PolicySettings(name="strict", allow_bypass=False),
        default=PolicySettings(allow_bypass=True, selectable=("strict",)),
    )
    d = r.resolve(
        key_fingerprint=None,
        model="m",
        headers={"x-compactd-policy": "strict", "x-compactd-bypass": "1"},
    )
    assert d.name == "strict"
    assert not d.bypass
    assert d.bypass_refused


def test_bypass_header_other_values_do_not_bypass() -> None:
    d = resolver().resolve(key_fingerprint=None, model="m", headers={"x-compactd-bypass": "0"})
    assert not d.bypass
    assert not d.bypass_refused


def test_off_policy_forwards_raw() -> None:
    d = resolver(default=PolicySettings(mode="off")).resolve(
        key_fingerprint=None, model="m", headers={}
    )
    assert d.forward_raw
    assert not d.bypass


def test_bad_fingerprint_in_config_fails_at_construction() -> None:
    with pytest.raises(ConfigError, match=r"policies\[0\]\.match_keys"):
        resolver(PolicySettings(name="x", match_keys=("sk-not-a-fingerprint",)))


def test_header_values_without_header_fails_at_construction() -> None:
    with pytest.raises(ConfigError, match="match_header_values"):
        resolver(PolicySettings(name="x", match_header_values=("a",)))


def test_match_rules_on_default_policy_fail_at_construction() -> None:
    with pytest.raises(ConfigError, match="default_policy"):
        resolver(default=PolicySettings(match_models=("gpt-*",)))


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("max_tool_result_tokens", -1),
        ("reasoning_strip_age_threshold", -1),
        ("providers", []),
        ("match_header", "x team"),  # no request can carry it: the policy would never match
        ("compaction_timeout_ms", 0),  # every compaction would fail open
        ("compaction_timeout_ms", 600_001),  # past any client's patience: a hang by another name
    ],
)
def test_a_policy_value_no_request_can_use_stops_start_up(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=rf"policies\[0\]\.{key}: "):
        load_settings(None, env={}, overrides={"policies": [{"name": "x", key: value}]})


def test_policies_load_from_toml(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        f"""
[default_policy]
selectable = ["shadow-all"]

[[policies]]
name = "team-search"
match_header = "x-team"
match_header_values = ["search"]
mode = "shadow"

[[policies]]
name = "minis"
match_keys = ["{KEY_A}"]
match_models = ["gpt-4o-mini*"]
allow_bypass = false

[[policies]]
name = "shadow-all"
mode = "shadow"
"""
    )
    r = PolicyResolver(load_settings(path, env={}))
    assert r.resolve(key_fingerprint=KEY_A, model="gpt-4o-mini", headers={}).name == "minis"
    assert r.resolve(key_fingerprint=None, model="m", headers={"x-team": "search"}).name == (
        "team-search"
    )
    d = r.resolve(key_fingerprint=None, model="m", headers={"x-compactd-policy": "shadow-all"})
    assert d.policy.mode == "shadow"


def test_default_policy_keys_are_set_by_environment_variables_too() -> None:
    # docs/configuration.md: every scalar key can be set as COMPACTD_<SECTION>_<KEY>, [default_policy]'s too.
    values = {"MODE": "shadow", "BUDGET_TOKENS": "0", "PROVIDERS": "trim, engine"}
    env = {f"COMPACTD_DEFAULT_POLICY_{k}": v for k, v in {**values, "ALLOW_BYPASS": "no"}.items()}
    policy = load_settings(None, env=env).default_policy
    assert (policy.mode, policy.budget_tokens) == ("shadow", 0)
    assert (policy.providers, policy.allow_bypass) == (("trim", "engine"), False)
    with pytest.raises(ConfigError, match=r"default_policy\.mode"):
        load_settings(None, env={"COMPACTD_DEFAULT_POLICY_MODE": "enforcing"})


def test_resolve_reads_starlette_headers_whatever_the_config_case() -> None:
    r = resolver(
        PolicySettings(name="search", match_header="X-Team", match_header_values=("search",)),
        default=PolicySettings(allow_bypass=True),
    )
    # ASGI servers deliver lower-case names; starlette looks them up case-insensitively.
    headers = Headers(raw=[(b"x-team", b"search"), (b"x-compactd-bypass", b"1")])
    d = r.resolve(key_fingerprint=None, model="m", headers=headers)
    assert d.name == "search"
    assert d.bypass


def test_match_apis_picks_a_policy_by_the_api_a_request_came_in_on() -> None:
    from proxy.config import APIS
    from proxy.dialects.apis import API_NAMES

    assert APIS == API_NAMES  # the names config accepts are the adapters' own
    settings = load_settings(
        None,
        env={},
        overrides={"policies": [{"name": "agents", "match_apis": ["responses", "messages"]}]},
    )
    resolver = PolicyResolver(settings)
    pick = lambda api: resolver.resolve(key_fingerprint=None, model="m", headers={}, api=api).name  # noqa: E731
    assert pick("responses") == "agents"
    assert pick("messages") == "agents"
    assert pick("chat.completions") == "default"
    with pytest.raises(ConfigError, match="match_apis"):
        load_settings(None, env={}, overrides={"policies": [{"name": "x", "match_apis": ["chat"]}]})
    with pytest.raises(ConfigError, match="cap_apis"):
        load_settings(None, env={}, overrides={"default_policy": {"cap_apis": ["anthropic"]}})


def test_model_globs_match_as_the_model_table_does_any_case_and_gateway_prefix() -> None:
    # The model table finds `openai/gpt-4o-mini` and `GPT-4o-mini` under gpt-4o-mini's entry;
    # a policy for gpt-4o-mini* must apply to the same requests.
    r = resolver(PolicySettings(name="minis", match_models=("GPT-4o-mini*",)))
    for model in ("gpt-4o-mini", "GPT-4o-Mini", "openai/gpt-4o-mini", "azure/GPT-4o-mini-2024"):
        assert r.resolve(key_fingerprint=None, model=model, headers={}).name == "minis", model
    assert r.resolve(key_fingerprint=None, model="openai/gpt-4o", headers={}).name == "default"


def test_model_globs_can_still_name_a_gateway_prefix() -> None:
    r = resolver(PolicySettings(name="azure", match_models=("azure/*",)))
    assert r.resolve(key_fingerprint=None, model="Azure/gpt-4.1", headers={}).name == "azure"
    assert r.resolve(key_fingerprint=None, model="openai/gpt-4.1", headers={}).name == "default"
