"""The one options validator: types, bounds and unknown keys, for the config file and providers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.errors import CompactdError, ConfigError, OptionError
from proxy.runtime.options import check, collecting, option, parse


@dataclass(frozen=True)
class Inner:
    depth: int = option(2, minimum=0, maximum=5)


@dataclass(frozen=True)
class Schema:
    """Every kind of field a settings section or a provider's options may have."""

    mode: Literal["on", "off"] = "on"
    inner: Inner = field(default_factory=Inner)
    count: int = option(3, minimum=1)
    names: tuple[str, ...] = ()
    ratio: float = option(0.5, above=0, below=1)
    table: dict[str, Any] = field(default_factory=dict)
    flag: bool = False
    label: str | None = None


def test_environment_strings_are_read_as_the_type_they_spell() -> None:
    got = parse(
        Schema,
        {"flag": "Yes", "count": "7", "ratio": "0.25", "names": "a, b,,c", "inner": {"depth": "4"}},
        strings=True,
    )
    assert got == Schema(flag=True, count=7, ratio=0.25, names=("a", "b", "c"), inner=Inner(4))


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ({"flag": "yes"}, "p.flag: must be true or false, not 'yes'"),
        ({"count": "7"}, "p.count: must be an integer, not '7'"),
        ({"names": "a,b"}, "p.names: must be a list, not 'a,b'"),
    ],
)
def test_without_strings_a_string_is_only_a_string(values: dict[str, Any], problem: str) -> None:
    with pytest.raises(OptionError) as caught:
        parse(Schema, values, "p")
    assert str(caught.value) == problem


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ({"count": 0}, "count: must be >= 1, not 0"),
        ({"ratio": 0}, "ratio: must be > 0, not 0.0"),
        ({"ratio": 1}, "ratio: must be < 1, not 1.0"),
        ({"inner": {"depth": 6}}, "inner.depth: must be <= 5, not 6"),
        ({"mode": "of"}, "mode: must be one of ('on', 'off'), not 'of'"),
        ({"count": "x"}, "count: must be an integer, not 'x'"),
        ({"count": True}, "count: must be an integer, not True"),
        ({"table": 3}, "table: must be a table, not 3"),
        ({"label": 3}, "label: must be a string, not 3"),
        ({"inner": [1]}, "inner: must be a table"),
    ],
)
def test_a_bad_value_is_named_by_its_dotted_key(values: dict[str, Any], problem: str) -> None:
    with pytest.raises(OptionError) as caught:
        parse(Schema, values, strings=True)
    assert str(caught.value) == problem


def test_an_unknown_key_names_the_one_it_was_probably_meant_to_be_or_all_of_them() -> None:
    with pytest.raises(OptionError, match=r"^cuont: unknown key \(did you mean count\?\)$"):
        parse(Schema, {"cuont": 1})
    with pytest.raises(OptionError, match=r"^s\.zz: unknown option \(known: count, flag, "):
        parse(Schema, {"zz": 1}, "s", noun="option")


def test_while_collecting_every_problem_is_noted_and_the_defaults_stand_in() -> None:
    problems: list[str] = []
    with collecting(problems):
        got = parse(Schema, {"count": 0, "mode": "x", "inner": {"depth": 9}, "flag": True})
        check(got.count > 5, "count", "must be > 5")
    assert got == Schema(flag=True)
    assert problems == [
        "count: must be >= 1, not 0",
        "mode: must be one of ('on', 'off'), not 'x'",
        "inner.depth: must be <= 5, not 9",
        "count: must be > 5",
    ]


def test_an_option_error_is_a_config_error_and_a_value_error() -> None:
    with pytest.raises(OptionError) as caught:
        check(False, "a.b", "must be c")
    err = caught.value
    assert isinstance(err, ConfigError)
    assert isinstance(err, ValueError)
    assert isinstance(err, CompactdError)
    assert (err.key, err.why, err.problems) == ("a.b", "must be c", ["a.b: must be c"])


@given(st.integers(min_value=-10, max_value=10))
def test_an_integer_passes_exactly_when_it_is_within_its_bounds(depth: int) -> None:
    if 0 <= depth <= 5:
        assert parse(Inner, {"depth": depth}).depth == depth
    else:
        with pytest.raises(OptionError, match=rf"^depth: must be [<>]= [05], not {depth}$"):
            parse(Inner, {"depth": depth})
