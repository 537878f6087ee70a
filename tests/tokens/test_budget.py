"""Model table (glob precedence, validation) and request budgets."""

from __future__ import annotations

import copy
import dataclasses
import tomllib
from pathlib import Path
from typing import Any

import pytest

from proxy.config import PolicySettings
from proxy.errors import ConfigError
from proxy.tokens.budget import (
    Budget,
    ModelInfo,
    ModelTable,
    compute_budget,
)
from proxy.tokens.encodings import BUNDLED

REPO_TABLE = Path(__file__).resolve().parents[2] / "config" / "models.toml"


@pytest.fixture(scope="module")
def table() -> ModelTable:
    return ModelTable.load()


def _raw() -> dict[str, Any]:
    return tomllib.loads(REPO_TABLE.read_text())


def test_default_load_reads_the_repository_table(table: ModelTable) -> None:
    assert table.entries == ModelTable.load(REPO_TABLE).entries
    assert len(table.entries) > 30
    assert all(entry.encoding in BUNDLED for entry in (*table.entries, table.default))


def test_every_key_of_the_table_is_documented_in_its_comments() -> None:
    comments = "\n".join(line for line in REPO_TABLE.read_text().splitlines() if "#" in line)
    for field in dataclasses.fields(ModelInfo):
        assert f"#   {field.name}" in comments, field.name


@pytest.mark.parametrize(
    ("model", "window", "max_output", "encoding"),
    [
        ("gpt-5", 400_000, 128_000, "o200k_base"),
        ("gpt-5-mini-2025-08-07", 400_000, 128_000, "o200k_base"),
        ("gpt-5-chat-latest", 128_000, 16_384, "o200k_base"),
        ("gpt-5.4-mini", 400_000, 128_000, "o200k_base"),
        ("gpt-5.5", 1_050_000, 128_000, "o200k_base"),
        ("gpt-4.1-nano-2025-04-14", 1_047_576, 32_768, "o200k_base"),
        ("gpt-4o", 128_000, 16_384, "o200k_base"),
        ("gpt-4o-mini-2024-07-18", 128_000, 16_384, "o200k_base"),
        ("gpt-4o-2024-05-13", 128_000, 4_096, "o200k_base"),
        ("o1-mini", 128_000, 65_536, "o200k_base"),
        ("o1", 200_000, 100_000, "o200k_base"),
        ("o3-mini-2025-01-31", 200_000, 100_000, "o200k_base"),
        ("o4-mini", 200_000, 100_000, "o200k_base"),
        ("gpt-4-turbo-2024-04-09", 128_000, 4_096, "cl100k_base"),
        ("gpt-4-0125-preview", 128_000, 4_096, "cl100k_base"),
        ("gpt-4-32k-0613", 32_768, 8_192, "cl100k_base"),
        ("gpt-4-0613", 8_192, 8_192, "cl100k_base"),
        ("gpt-4", 8_192, 8_192, "cl100k_base"),
        ("gpt-3.5-turbo", 16_385, 4_096, "cl100k_base"),
        ("gpt-3.5-turbo-instruct", 4_096, 4_096, "cl100k_base"),
        ("GPT-4O-Mini", 128_000, 16_384, "o200k_base"),  # model names match case-insensitively
        ("openai/gpt-4.1-mini", 1_047_576, 32_768, "o200k_base"),  # a gateway's provider prefix
        # Fine-tuned models have their base model's window and encoding.
        ("ft:gpt-4o-mini-2024-07-18:acme::9AbCdEf1", 128_000, 16_384, "o200k_base"),
        ("ft:gpt-4.1-2025-04-14:acme:support:9AbCdEf1", 1_047_576, 32_768, "o200k_base"),
        ("ft:gpt-3.5-turbo-0125:acme::9AbCdEf1", 16_385, 4_096, "cl100k_base"),
        ("openai/ft:gpt-4o-2024-08-06:acme::9AbCdEf1", 128_000, 16_384, "o200k_base"),
        ("gpt-4-1106-vision-preview", 128_000, 4_096, "cl100k_base"),
        ("gpt-5.2-chat-latest", 128_000, 16_384, "o200k_base"),
        ("gpt-6-luna", 1_050_000, 128_000, "o200k_base"),
    ],
)
def test_specific_globs_win_over_general_ones(
    table: ModelTable, model: str, window: int, max_output: int, encoding: str
) -> None:
    info = table.lookup(model)
    assert (info.context_window, info.max_output, info.encoding) == (window, max_output, encoding)


def test_prices_are_listed_per_million_tokens(table: ModelTable) -> None:
    info = table.lookup("gpt-4o")
    assert (info.input_price, info.cached_input_price, info.output_price) == (2.5, 1.25, 10.0)


def test_unknown_model_gets_the_conservative_default(table: ModelTable) -> None:
    info = table.lookup("llama-3.3-70b-instruct")
    assert info is table.default
    assert info.context_window <= 32_768


def _with(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    raw = copy.deepcopy(_raw())
    target: Any = raw
    for step in path[:-1]:
        target = target[step]
    if value is ...:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return raw


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        (("models", 3, "context_windw"), 1, "models[3].context_windw: unknown key"),
        (("models", 2, "max_output"), ..., "models[2].max_output: missing"),
        (("models", 0, "context_window"), "big", "models[0].context_window: must be a positive"),
        (("models", 0, "context_window"), 0, "models[0].context_window: must be a positive"),
        (("models", 1, "encoding"), "p50k_base", "models[1].encoding: must be one of"),
        (("models", 1, "input_price"), -1, "models[1].input_price: must be a number >= 0"),
        (("models", 1, "pattern"), "", "models[1].pattern: must be a non-empty string"),
        (("models", 1, "max_input"), 2_000_000, "models[1].max_input: must not exceed"),
        (("models", 1, "max_input"), 0, "models[1].max_input: must be a positive"),
        (("default", "encoding"), "gpt2", "default.encoding"),
        (("default",), ..., "default: missing"),
        (("tiers",), {}, "tiers: unknown key"),
        (("models", 0, "image_rule"), "squares", "models[0].image_rule: must be one of"),
        (("models", 0, "image_rule"), "patches", "models[0].image_multiplier: must be a number"),
        (("models", 0, "image_multiplier"), 1.5, "models[0].image_multiplier: unknown key"),
        (("models", 0, "image_base"), 0, "models[0].image_base: must be a positive integer"),
    ],
)
def test_bad_table_is_rejected_with_the_key_named(
    path: tuple[Any, ...], value: Any, named: str
) -> None:
    with pytest.raises(ConfigError, match=named.replace("[", r"\[").replace("]", r"\]")):
        ModelTable.from_mapping(_with(path, value))


def test_pattern_shadowed_by_an_earlier_one_is_rejected() -> None:
    raw = _raw()
    general = next(m for m in raw["models"] if m["pattern"] == "gpt-4o*")
    raw["models"].insert(0, dict(general))
    with pytest.raises(ConfigError, match=r"'gpt-4o-mini\*' is shadowed by models\[0\] 'gpt-4o\*'"):
        ModelTable.from_mapping(raw)


def test_unreadable_or_invalid_files_name_the_file(tmp_path: Path) -> None:
    broken = tmp_path / "models.toml"
    broken.write_text("[default\n")
    with pytest.raises(ConfigError, match=r"models file .*models.toml"):
        ModelTable.load(broken)
    with pytest.raises(ConfigError, match=r"missing\.toml"):
        ModelTable.load(tmp_path / "missing.toml")
    broken.write_text(REPO_TABLE.read_text().replace("max_output = 16384", "max_output = -1", 1))
    with pytest.raises(ConfigError, match=r"models file .*max_output: must be a positive"):
        ModelTable.load(broken)


def _info(window: int = 128_000, max_output: int = 16_384) -> ModelInfo:
    return ModelInfo("m*", window, max_output, "o200k_base", 0.0, 0.0, 0.0)


POLICY = PolicySettings(budget_tokens=0)
"""No cap: the window arithmetic itself (the shipped default caps the budget at 32k)."""


def test_budget_reserves_the_models_default_output_and_the_margin() -> None:
    assert compute_budget(_info(), {}, POLICY, 64) == Budget(
        window=128_000,
        reserved_output=16_384,
        margin=64,
        budget=111_552,
        trigger=111_552,
        target=78_086,
    )


@pytest.mark.parametrize(
    ("body", "reserved"),
    [
        ({"max_tokens": 1_000}, 1_000),
        ({"max_completion_tokens": 2_000}, 2_000),
        ({"max_completion_tokens": 2_000, "max_tokens": 1_000}, 2_000),
        ({"max_completion_tokens": None, "max_tokens": 1_000}, 1_000),
        ({"max_output_tokens": 3_000}, 3_000),  # the Responses API's name for it
        ({"max_tokens": True}, 16_384),  # a bool is not a token count
        ({"max_tokens": -5}, 16_384),
    ],
)
def test_budget_reserves_what_the_request_asks_for(body: dict[str, Any], reserved: int) -> None:
    budget = compute_budget(_info(), body, POLICY, 64)
    assert budget.reserved_output == reserved
    assert budget.budget == 128_000 - reserved - 64


@pytest.mark.parametrize(
    ("model", "body", "expected"),
    [
        ("gpt-5", {}, 400_000 - 128_000 - 64),
        ("gpt-4.1", {"max_tokens": 4_000}, 1_047_576 - 4_000 - 64),
        ("gpt-4", {"max_tokens": 1_000}, 8_192 - 1_000 - 64),
        ("o3", {"max_completion_tokens": 50_000}, 200_000 - 50_000 - 64),
        # GPT-5 takes at most 272k of input whatever output a request reserves of its 400k.
        ("gpt-5-mini", {"max_completion_tokens": 10_000}, 272_000 - 64),
        ("gpt-5.1", {"max_output_tokens": 2_000}, 272_000 - 64),
    ],
)
def test_budgets_of_real_models(
    table: ModelTable, model: str, body: dict[str, Any], expected: int
) -> None:
    assert compute_budget(table.lookup(model), body, POLICY, 64).budget == expected


def test_the_default_policy_caps_the_budget_at_64k() -> None:
    assert compute_budget(_info(), {}, PolicySettings(), 64).budget == 64_000
    assert compute_budget(
        _info(window=16_000, max_output=4000), {}, PolicySettings(), 64
    ).budget == (16_000 - 4000 - 64)


def test_policy_caps_lower_the_budget_by_tokens_and_by_fraction() -> None:
    by_tokens = compute_budget(_info(), {}, PolicySettings(budget_tokens=50_000), 64)
    assert by_tokens.budget == 50_000
    by_fraction = compute_budget(
        _info(), {}, PolicySettings(budget_tokens=0, budget_fraction=0.5), 64
    )
    assert by_fraction.budget == 64_000
    both = compute_budget(_info(), {}, PolicySettings(budget_tokens=70_000, budget_fraction=0.5), 0)
    assert both.budget == 64_000


def test_trigger_and_target_follow_the_policy_ratios() -> None:
    policy = PolicySettings(trigger_ratio=0.9, target_ratio=0.6, budget_tokens=10_000)
    budget = compute_budget(_info(), {}, policy, 64)
    assert (budget.budget, budget.trigger, budget.target) == (10_000, 9_000, 6_000)


def test_reserving_the_whole_window_leaves_a_small_positive_budget() -> None:
    budget = compute_budget(_info(8_192, 8_192), {}, POLICY, 64)
    assert budget.budget == 8_192 // 32
    assert 0 < budget.target <= budget.trigger <= budget.budget
    tiny = compute_budget(_info(10, 10), {"max_tokens": 100}, POLICY, 1_000)
    assert tiny.budget >= 1
    assert tiny.target >= 1


def test_the_caps_apply_to_the_apis_of_cap_apis_only() -> None:
    default = PolicySettings()
    for api in ("chat.completions", "responses", "messages"):
        assert compute_budget(_info(), {}, default, 64, api).budget == 64_000
    openai_only = PolicySettings(budget_tokens=32_000, cap_apis=("chat.completions", "responses"))
    assert compute_budget(_info(), {}, openai_only, 64, "responses").budget == 32_000
    assert compute_budget(_info(), {}, openai_only, 64, "messages").budget == 111_552  # the window
    claude = PolicySettings(budget_fraction=0.25, cap_apis=("messages",))
    assert compute_budget(_info(), {}, claude, 64, "messages").budget == 32_000
    assert compute_budget(_info(), {}, claude, 64, "chat.completions").budget == 111_552
