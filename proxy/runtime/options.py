"""Typed options: the one validator for the config file and for every provider's options.

A schema is a dataclass; `parse(schema, table, prefix)` checks a table (the TOML file, the
environment, a policy's options for one provider) against it: unknown keys (with the key a
misspelling was probably meant to be), each value's type, and the bounds a field declares with
`option()`. A problem is an `OptionError` naming the dotted key. While `collecting(problems)` is
active, each problem is noted and the field keeps its default, so one load reports every problem
of a file at once; outside it, the first problem raises. `check` is the same for the checks a
schema makes itself (one field against another).

Standard library only: the plugin API (`proxy.providers.base`) re-exports `option` and builds
`parse_options` on `parse`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import operator
import types
from collections.abc import Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from proxy.errors import OptionError

T = TypeVar("T")

_PROBLEMS: ContextVar[list[str] | None] = ContextVar("compactd_option_problems", default=None)
"""While a load runs: where every problem goes, so all are reported together."""


def option(
    default: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
    below: float | None = None,
    schema: type[Any] | None = None,
    doc: str = "",
) -> Any:
    """A field of an option schema with bounds `parse` checks (`above` and `below` are exclusive;
    `schema` checks a `Mapping` field's table against another option dataclass, e.g. the options
    of a fallback provider, and keeps the table as given).

    ```python
    @dataclass(frozen=True)
    class Options:
        keep_chars: int = option(200, minimum=1, doc="characters kept of a long tool result")
    ```
    """
    bounds = {"minimum": minimum, "maximum": maximum, "above": above, "below": below}
    meta = {
        k: v for k, v in {**bounds, "schema": schema, "doc": doc}.items() if v not in (None, "")
    }
    return dataclasses.field(default=default, metadata=meta)


@contextlib.contextmanager
def collecting(problems: list[str]) -> Iterator[list[str]]:
    """Note problems into `problems` instead of raising them, for the duration."""
    token = _PROBLEMS.set(problems)
    try:
        yield problems
    finally:
        _PROBLEMS.reset(token)


def problem(exc: OptionError) -> None:
    """Note a problem while collecting (raise it otherwise)."""
    problems = _PROBLEMS.get()
    if problems is None:
        raise exc
    problems.append(str(exc))


def check(cond: bool, key: str, why: str) -> None:
    """A schema's own check: a failure is noted while collecting, else raised."""
    if not cond:
        problem(OptionError(key, why))


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """` (did you mean X?)` for the closest known name, or nothing."""
    import difflib  # noqa: PLC0415  (only for a misspelling: ~0.2 MB a worker need not hold)

    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def parse(
    schema: type[T],
    values: Mapping[str, Any],
    prefix: str = "",
    *,
    strings: bool = False,
    noun: str = "key",
) -> T:
    """`values` as an instance of the dataclass `schema`, every key checked.

    Field types may be bool, int, float (an int is accepted), str, a `Literal` of strings,
    `tuple[X, ...]` (from a list), a nested dataclass (from a table), a `dict` or `Mapping`
    (any table; an `option(schema=...)` checks it) or any of these `| None`. With `strings`
    (the environment's values), a string is also read as the bool, number or comma-separated
    list it spells. An unknown key is an "unknown {noun}".
    """
    return _Reading(strings, noun).parse(schema, values, prefix)


_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
_WORDS = {"1": True, "true": True, "yes": True, "on": True}
_WORDS |= {"0": False, "false": False, "no": False, "off": False}
_BOUNDS = (
    ("minimum", ">=", operator.ge),
    ("above", ">", operator.gt),
    ("maximum", "<=", operator.le),
    ("below", "<", operator.lt),
)


@dataclass(frozen=True)
class _Reading:
    """How one `parse` reads its values: whether strings spell other types, and what a key is
    called in an "unknown" error."""

    strings: bool
    noun: str

    def parse(self, schema: type[T], values: Any, prefix: str) -> T:
        if not isinstance(values, Mapping):
            raise OptionError(prefix or "options", "must be a table")
        hints = get_type_hints(schema)
        fields = {f.name: f for f in dataclasses.fields(schema)}  # type: ignore[arg-type]
        kwargs: dict[str, Any] = {}
        for key, raw in values.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            try:
                if key not in fields:
                    hint = did_you_mean(key, fields) or f" (known: {', '.join(sorted(fields))})"
                    raise OptionError(path, f"unknown {self.noun}{hint}")  # noqa: TRY301
                kwargs[key] = self.field(raw, hints[key], fields[key].metadata, path)
            except OptionError as exc:
                problem(exc)  # while collecting, the default stands in and the rest is checked
        try:
            return schema(**kwargs)
        except OptionError:
            raise
        except (TypeError, ValueError) as exc:  # a schema's own __post_init__ checks
            raise OptionError(prefix or "options", str(exc)) from None

    def field(self, raw: Any, tp: Any, meta: Mapping[str, Any], path: str) -> Any:
        """One value, typed, then checked against the field's `option()` schema and bounds."""
        value = self.typed(raw, tp, path)
        if "schema" in meta and value is not None:
            _Reading(strings=False, noun=self.noun).parse(meta["schema"], value, path)
        if isinstance(value, int | float) and not isinstance(value, bool):
            for name, sign, holds in _BOUNDS:
                if name in meta and not holds(value, meta[name]):
                    raise OptionError(path, f"must be {sign} {meta[name]}, not {value!r}")
        return value

    def typed(self, value: Any, tp: Any, path: str) -> Any:
        """`value` as a `tp`, or an OptionError saying what it must be."""
        origin = get_origin(tp)
        if origin in (Union, types.UnionType):
            return self.optional(value, tp, path)
        if origin is Literal:
            if value not in get_args(tp):
                raise OptionError(path, f"must be one of {get_args(tp)}, not {value!r}")
            return value
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            return self.parse(tp, value, path)
        if origin is tuple:
            return self.list(value, get_args(tp)[0], path)
        if origin is not None and issubclass(origin, Mapping):
            if not isinstance(value, Mapping):
                raise OptionError(path, f"must be a table, not {value!r}")
            return dict(value) if origin is dict else value
        return self.scalar(value, tp, path)

    def optional(self, value: Any, tp: Any, path: str) -> Any:
        inner = [a for a in get_args(tp) if a is not type(None)]
        if value is None and len(inner) < len(get_args(tp)):
            return None
        return self.typed(value, inner[0], path) if len(inner) == 1 else value

    def list(self, value: Any, item: Any, path: str) -> tuple[Any, ...]:
        if self.strings and isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list | tuple):
            raise OptionError(path, f"must be a list, not {value!r}")
        return tuple(self.typed(v, item, f"{path}[{i}]") for i, v in enumerate(value))

    def scalar(self, value: Any, tp: Any, path: str) -> Any:
        if self.strings and isinstance(value, str) and tp in (bool, int, float):
            value = _from_string(value, tp, path)
        if tp is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if tp in _NAMES and (type(value) is not tp):
            raise OptionError(path, f"must be {_NAMES[tp]}, not {value!r}")
        return value


def _from_string(text: str, tp: type[Any], path: str) -> Any:
    """What an environment variable's `text` spells for a field of type `tp`."""
    if tp is bool:
        return _WORDS.get(text.lower(), text)
    try:
        return tp(text)
    except ValueError:
        raise OptionError(path, f"must be {_NAMES[tp]}, not {text!r}") from None
