"""Tokens of tool (function) definitions, by the OpenAI cookbook's function-calling formula.

OpenAI renders tool schemas into the prompt in its own format. The cookbook ("How to count tokens
with tiktoken", section 7) gives a formula that matches the API on its example: per function a
start cost plus "name:description", per property "name:type:description", enums item by item, and
a fixed end. The cookbook's schemas are flat; anything else in a schema (nested properties,
`$defs`, `items`) is counted as its JSON, which errs high.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import orjson

# The per-function start differs by model generation: 7 for o200k_base models, 10 for cl100k_base.
FUNC_INIT = {"o200k_base": 7, "cl100k_base": 10}
PROP_INIT = 3
PROP_KEY = 3
ENUM_INIT = -3
ENUM_ITEM = 3
FUNC_END = 12
_PLAIN_PROPERTY_KEYS = frozenset({"type", "description", "enum"})
_PLAIN_PARAMETER_KEYS = frozenset({"type", "properties", "required", "additionalProperties"})

CountText = Callable[[str], int]


def dump(value: Any) -> str:
    """Compact JSON text of any value (unknown types as their str)."""
    return orjson.dumps(value, default=str).decode()


def _properties(props: Mapping[str, Any], count: CountText) -> int:
    total = PROP_INIT
    for name, schema in props.items():
        total += PROP_KEY
        prop = schema if isinstance(schema, Mapping) else {}
        enum = prop.get("enum")
        if isinstance(enum, list):
            total += ENUM_INIT + sum(ENUM_ITEM + count(str(item)) for item in enum)
        kind = prop.get("type", "")
        kind = "|".join(map(str, kind)) if isinstance(kind, list) else str(kind)
        desc = str(prop.get("description") or "").removesuffix(".")
        total += count(f"{name}:{kind}:{desc}")
        nested = {k: v for k, v in prop.items() if k not in _PLAIN_PROPERTY_KEYS}
        if nested:
            total += count(dump(nested))
    return total


def function_tokens(fn: Mapping[str, Any], count: CountText, func_init: int) -> int:
    """Tokens of one function definition ({"name", "description", "parameters"})."""
    desc = str(fn.get("description") or "").removesuffix(".")
    total = func_init + count(f"{fn.get('name') or ''}:{desc}")
    fmt = fn.get("format")  # custom (free-form) tools carry a grammar instead of parameters
    if fmt is not None:
        total += count(dump(fmt))
    params = fn.get("parameters")
    if not isinstance(params, Mapping):
        return total
    unusual = {k: v for k, v in params.items() if k not in _PLAIN_PARAMETER_KEYS}
    if unusual:
        total += count(dump(unusual))
    props = params.get("properties")
    if isinstance(props, Mapping) and props:
        total += _properties(props, count)
    return total


def tools_tokens(tools: Any, functions: Any, count: CountText, encoding: str) -> int:
    """Tokens of a request's `tools` and legacy `functions` lists."""
    func_init = FUNC_INIT.get(encoding, max(FUNC_INIT.values()))
    defs: list[Any] = list(functions) if isinstance(functions, list) else []
    other = 0
    for tool in tools if isinstance(tools, list) else []:
        inner = tool.get("function", tool.get("custom")) if isinstance(tool, Mapping) else None
        if isinstance(inner, Mapping):
            defs.append(inner)
        else:  # a built-in or unknown tool type: its JSON is the best guess
            other += count(dump(tool))
    total = other
    for fn in defs:
        total += (
            function_tokens(fn, count, func_init) if isinstance(fn, Mapping) else count(dump(fn))
        )
    return total + FUNC_END if (defs or other) else 0
