"""Savings accounting: tokens and money per tenant, policy or model, net of prompt caching.

Input is what `Store.usage` returns (one aggregate per tenant, policy, model and day, with other
APIs' counters under `apis`) or plain `UsageRecord`s (one request each). Prices come from the
model table (USD per 1M tokens); how a compaction event costs the cache comes from the cache rule
each API and model follows (`proxy.telemetry.pricing`, the model bench/cost prices with).
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any, Literal, Protocol

from proxy.errors import StatsTimeoutError
from proxy.store.base import DEFAULT_API, UsageRecord
from proxy.telemetry.pricing import ASSUMPTIONS, rule_for
from proxy.telemetry.pricing import Prices as RulePrices

GroupBy = Literal["tenant", "policy", "model", "api", "policy-model"]
GROUP_BY: tuple[GroupBy, ...] = ("tenant", "policy", "model", "api", "policy-model")
UNRECORDED = "unrecorded"
"""The reason of a fail-open counted before reasons were recorded."""
_REASON = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,39}")
_SINCE = re.compile(r"\s*(\d+)\s*([dw])\s*", re.IGNORECASE)
_MILLION = 1_000_000
OTHER = "(other)"
"""The group that adds up every group past `limits.stats_max_groups` (the smallest ones)."""


def _check_deadline(deadline: float | None) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise StatsTimeoutError


class Prices(Protocol):
    """A model's prices in USD per 1M tokens (0 = unknown); `proxy.tokens.budget.ModelInfo` is
    one."""

    @property
    def input_price(self) -> float: ...
    @property
    def cached_input_price(self) -> float: ...
    @property
    def output_price(self) -> float: ...


class PriceTable(Protocol):
    """Anything that prices a model by name; `proxy.tokens.budget.ModelTable` is one."""

    def lookup(self, model: str) -> Prices: ...


@dataclass(frozen=True)
class StatsRow:
    """Accounting for one tenant, policy or model (or the total) over the period."""

    key: str
    requests: int = 0
    compactions: int = 0
    tokens_without: int = 0
    """Prompt tokens the clients sent (what the upstream would have seen without compactd)."""
    tokens_sent: int = 0
    tokens_saved: int = 0
    shadow_requests: int = 0
    shadow_tokens_would_save: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    """What the upstream billed, from its own `usage` (0 where the model has no price)."""
    gross_saved_usd: float = 0.0
    cache_loss_usd: float = 0.0
    saved_usd: float = 0.0
    """gross_saved_usd - cache_loss_usd: may be negative, which is worth knowing."""
    shadow_would_save_usd: float = 0.0
    unpriced_models: tuple[str, ...] = ()
    cache_rules: tuple[str, ...] = ()
    """The cache rules its rows were priced under (`proxy.telemetry.pricing.RULES`)."""
    fail_opens: int = 0
    """Requests forwarded unchanged because something failed (action `error`)."""
    fail_open_reasons: tuple[tuple[str, int], ...] = ()
    """(reason, count) pairs, most frequent first (`provider`, `store`, `timeout` ...)."""

    @property
    def saved_share(self) -> float:
        """Share of prompt tokens compactd removed."""
        return self.tokens_saved / self.tokens_without if self.tokens_without else 0.0

    @property
    def cache_hit_share(self) -> float:
        """cached / prompt tokens, as the upstream reported them."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass
class _Sums:
    requests: int = 0
    compactions: int = 0
    shadow: int = 0
    active: int = 0  # compacted or replayed: requests that really were rewritten
    tokens_before: int = 0
    tokens_after: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    completion_tokens: int = 0
    compacted_tokens_after: int = 0
    has_compacted_after: bool = True
    fail_opens: int = 0
    reasons: dict[str, int] = dataclasses.field(default_factory=dict)

    def add(self, row: Mapping[str, Any]) -> None:
        actions: Mapping[str, int] = row.get("actions") or {}
        self.requests += int(row.get("requests", 0))
        errors = int(actions.get("error", 0))
        self.fail_opens += errors
        told = row.get("fail_opens") or {}
        for reason, n in told.items():
            self.reasons[reason] = self.reasons.get(reason, 0) + int(n)
        if errors > sum(int(n) for n in told.values()):
            untold = errors - sum(int(n) for n in told.values())
            self.reasons[UNRECORDED] = self.reasons.get(UNRECORDED, 0) + untold
        self.compactions += int(actions.get("compacted", 0))
        self.shadow += sum(int(n) for a, n in actions.items() if a.startswith("shadow"))
        self.active += int(actions.get("compacted", 0)) + int(actions.get("replayed", 0))
        for name in (
            "tokens_before",
            "tokens_after",
            "prompt_tokens",
            "cached_tokens",
            "cache_write_tokens",
        ):
            setattr(self, name, getattr(self, name) + int(row.get(name, 0)))
        self.completion_tokens += int(row.get("completion_tokens", 0))
        if "compacted_tokens_after" in row:
            self.compacted_tokens_after += int(row["compacted_tokens_after"])
        else:
            self.has_compacted_after = False


def fail_open_reason(error: str | None) -> str:
    """The bounded label a fail-open is counted under (the metric's reason): `provider` for a
    provider's failure, else the short reason itself (`store`, `timeout`, an exception type)."""
    if not error:
        return UNRECORDED
    if error.startswith("provider"):
        return "provider"
    return error if _REASON.fullmatch(error) else "other"


def _as_rows(item: Mapping[str, Any] | UsageRecord) -> Iterator[Mapping[str, Any]]:
    """One row per API: the aggregate itself (chat completions), then each of its `apis`."""
    if isinstance(item, UsageRecord):
        row = dataclasses.asdict(item)
        row["requests"] = 1
        row["actions"] = {item.action: 1}
        row["fail_opens"] = {item.fail_open: 1} if item.fail_open else {}
        row["compacted_tokens_after"] = item.tokens_after if item.action == "compacted" else 0
        yield row
        return
    yield {**item, "api": DEFAULT_API}
    for api, counters in (item.get("apis") or {}).items():
        keys = {k: item.get(k, "") for k in ("tenant", "policy", "model", "day")}
        yield {**counters, **keys, "api": api}


def _priced(key: str, model: str, s: _Sums, prices: Prices, api: str = DEFAULT_API) -> StatsRow:
    """One (tenant, policy, model) aggregate with its money figures (see `compute_stats`)."""
    # Shadow requests forwarded the original; split a row that mixes modes by request share.
    rewritten = s.active + s.shadow
    shadow_share = s.shadow / rewritten if rewritten else 0.0
    would_save = round(shadow_share * (s.tokens_before - s.tokens_after))
    sent = s.tokens_after + would_save
    saved = s.tokens_before - sent
    p_in, p_cached, p_out = prices.input_price, prices.cached_input_price, prices.output_price
    hit = s.cached_tokens / s.prompt_tokens if s.prompt_tokens else 0.0
    blended = hit * p_cached + (1 - hit) * p_in
    if s.has_compacted_after:
        compacted_after = s.compacted_tokens_after
    else:
        # The store did not keep it: estimate each event's prefix by the mean request size.
        compacted_after = s.compactions * s.tokens_after // s.requests if s.requests else 0
    gross = saved * blended / _MILLION
    # Cache writes are part of the prompt, billed at their own price where there is one.
    p_write = getattr(prices, "cache_write_price", p_in)
    rule = rule_for(api, input_price=p_in, cache_write_price=p_write)
    listed = {"input_price": p_in, "cached_input_price": p_cached, "output_price": p_out}
    per_token = RulePrices.of(rule, cache_write_price=p_write, **listed)
    # The event's prefix, a cache hit at share h otherwise, is written once at the rule's price.
    loss = hit * compacted_after * max(0.0, per_token.written - per_token.cached)
    cost = (
        (s.prompt_tokens - s.cached_tokens - s.cache_write_tokens) * p_in
        + s.cache_write_tokens * p_write
        + s.cached_tokens * p_cached
        + s.completion_tokens * p_out
    ) / _MILLION
    return StatsRow(
        key=key,
        requests=s.requests,
        compactions=s.compactions,
        tokens_without=s.tokens_before,
        tokens_sent=sent,
        tokens_saved=saved,
        shadow_requests=s.shadow,
        shadow_tokens_would_save=would_save,
        prompt_tokens=s.prompt_tokens,
        cached_tokens=s.cached_tokens,
        completion_tokens=s.completion_tokens,
        cost_usd=cost,
        gross_saved_usd=gross,
        cache_loss_usd=loss,
        saved_usd=gross - loss,
        shadow_would_save_usd=would_save * blended / _MILLION,
        unpriced_models=() if p_in > 0 else (model,),
        cache_rules=(rule.name,),
        fail_opens=s.fail_opens,
        fail_open_reasons=_ranked(s.reasons),
    )


def _ranked(counts: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(((k, n) for k, n in counts.items() if n), key=lambda kv: (-kv[1], kv[0])))


_ADDED = tuple(
    f.name
    for f in dataclasses.fields(StatsRow)
    if f.name not in ("key", "unpriced_models", "cache_rules", "fail_open_reasons")
)


def _merge(key: str, rows: Iterable[StatsRow]) -> StatsRow:
    """The rows added up, in one pass: linear in the rows (sorting each step was quadratic)."""
    sums: dict[str, Any] = dict.fromkeys(_ADDED, 0)
    unpriced: set[str] = set()
    rules: set[str] = set()
    counts: dict[str, int] = {}
    for row in rows:
        for name in _ADDED:
            sums[name] += getattr(row, name)
        unpriced.update(row.unpriced_models)
        rules.update(row.cache_rules)
        for reason, n in row.fail_open_reasons:
            counts[reason] = counts.get(reason, 0) + n
    return StatsRow(
        key=key,
        **sums,
        unpriced_models=tuple(sorted(unpriced)),
        cache_rules=tuple(sorted(rules)),
        fail_open_reasons=_ranked(counts),
    )


def compute_stats(
    rows: Iterable[Mapping[str, Any] | UsageRecord],
    *,
    by: GroupBy,
    model_table: PriceTable,
    keep: frozenset[str] | None = None,
) -> list[StatsRow]:
    """Accounting grouped by tenant, policy, model or API, sorted by key.

    Per (tenant, policy, model, API) over the period, then added up into the groups; with that
    model's prices per 1M tokens p_in, p_cached, p_out:

    - sent = tokens_after, except shadow requests, which forwarded tokens_before;
      saved = tokens_before - sent; shadow_would_save = shadow's tokens_before - tokens_after.
    - h = cached_tokens / prompt_tokens (the upstream's own usage): the cache-hit share.
    - cost bills cache writes (Anthropic's `cache_creation_input_tokens`, part of the prompt) at the
      model's cache_write_price, the rest of the uncached prompt at p_in.
    - gross_saved = saved * (h * p_cached + (1 - h) * p_in): a removed token would have been
      cached with probability h, so it is worth the blended price, not the list price.
    - cache_loss = h * compacted_tokens_after * (p_write - p_cached): a compaction event rewrites
      the prefix, so the new prefix (tokens_after of the compaction requests), which would
      otherwise have been a cache hit at share h, is written once at the price of the cache rule
      the API and model follow (`proxy.telemetry.pricing.rule_for`; p_write = p_in where writes
      are free, OpenAI before GPT-5.6).
    - saved_usd = gross_saved - cache_loss.
    - cost = (prompt - cached) * p_in + cached * p_cached + completion * p_out.

    Where the store gives no `compacted_tokens_after`, it is estimated as compactions times the
    mean tokens_after per request. A model priced 0 (unknown) adds tokens but no money and is
    listed in `unpriced_models`. With `keep`, groups outside it are added up as one, OTHER.
    """
    if by not in GROUP_BY:
        raise ValueError(f"by must be one of {GROUP_BY}, not {by!r}")
    # Priced at the finest grain, so every grouping adds up to the same total.
    sums: dict[tuple[str, str, str, str], _Sums] = {}
    for item in rows:
        for row in _as_rows(item):
            grain = tuple(str(row.get(k, "")) for k in ("tenant", "policy", "model", "api"))
            sums.setdefault(grain, _Sums()).add(row)  # type: ignore[arg-type]
    groups: dict[str, list[StatsRow]] = {}
    for grain, s in sums.items():
        key, model = _group_key(grain, by), grain[2]
        if keep is not None and key not in keep:
            key = OTHER
        prices = model_table.lookup(model)
        groups.setdefault(key, []).append(_priced(key, model, s, prices, grain[3]))
    return [_merge(key, parts) for key, parts in sorted(groups.items())]


def _group_key(grain: tuple[str, str, str, str], by: GroupBy) -> str:
    """A row's group: one of tenant, policy, model, API, or "policy / model"."""
    if by == "policy-model":
        return f"{grain[1]} / {grain[2]}"
    return grain[GROUP_BY.index(by)]


def total(rows: Iterable[StatsRow]) -> StatsRow:
    """All rows added up (shares recomputed from the sums)."""
    return _merge("total", rows)


def parse_since(text: str, today: date | None = None) -> date:
    """First UTC day to include: `7d` (7 days ago), `2w`, `0d` (today) or a YYYY-MM-DD date."""
    today = today or datetime.now(UTC).date()
    m = _SINCE.fullmatch(text)
    if m is not None:
        n = int(m.group(1)) * (7 if m.group(2).lower() == "w" else 1)
        try:
            return today - timedelta(days=n)
        except OverflowError:  # before year 1: a bad argument, as the CLI and the API say
            raise ValueError(f"since {text!r} reaches back before the year 1") from None
    try:
        return date.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"since must look like 7d, 2w or 2026-11-01, not {text!r}") from None


def _row_json(row: StatsRow) -> dict[str, Any]:
    out = dataclasses.asdict(row)
    out["unpriced_models"] = list(row.unpriced_models)
    out["cache_rules"] = list(row.cache_rules)
    out["saved_share"] = round(row.saved_share, 4)
    out["cache_hit_share"] = round(row.cache_hit_share, 4)
    for name in ("cost_usd", "gross_saved_usd", "cache_loss_usd", "saved_usd"):
        out[name] = round(out[name], 6)
    out["shadow_would_save_usd"] = round(out["shadow_would_save_usd"], 6)
    out["fail_open_reasons"] = dict(row.fail_open_reasons)
    return out


def stats_json(
    rows: list[StatsRow], *, by: GroupBy | None = None, since: date | None = None
) -> dict[str, Any]:
    """The body of `GET /compactd/v1/stats`: the rows and their total."""
    return {
        "by": by,
        "since": since.isoformat() if since else None,
        "rows": [_row_json(r) for r in rows],
        "total": _row_json(total(rows)),
        "assumptions": ASSUMPTIONS,
    }


def period_json(
    rows: Sequence[Mapping[str, Any]],
    *,
    by: GroupBy,
    since: date,
    model_table: PriceTable,
    max_groups: int,
    deadline: float | None = None,
) -> dict[str, Any]:
    """`stats_json` of the period, the groups past `max_groups` added up as OTHER."""
    model_table = _Remembered(model_table)
    table = compute_stats(rows, by=by, model_table=model_table)
    _check_deadline(deadline)
    keep = largest_groups(table, max_groups)
    if keep is not None:
        table = compute_stats(rows, by=by, model_table=model_table, keep=keep)
    return stats_json(table, by=by, since=since)


SERIES_METRICS = (
    "requests",
    "compactions",
    "tokens_without",
    "tokens_sent",
    "tokens_saved",
    "cache_hit_share",
    "saved_usd",
    "shadow_tokens_would_save",
    "shadow_would_save_usd",
    "fail_opens",
)
"""What `series_json` gives per day for each group (and the total)."""


class _Remembered:
    """A price table that looks each model up once (a lookup of an unknown name is ~70 us:
    20k made-up names, priced again for every day of a series, took minutes)."""

    def __init__(self, table: PriceTable) -> None:
        self._table = table
        self._prices: dict[str, Prices] = {}

    def lookup(self, model: str) -> Prices:
        found = self._prices.get(model)
        if found is None:
            found = self._prices[model] = self._table.lookup(model)
        return found


def largest_groups(table: Sequence[StatsRow], limit: int) -> frozenset[str] | None:
    """The `limit` groups with the most prompt tokens (then requests), or None if all fit."""
    if len(table) <= limit:
        return None
    ranked = sorted(table, key=lambda r: (-r.tokens_without, -r.requests, r.key))
    return frozenset(r.key for r in ranked[:limit])


def series_json(
    rows: Sequence[Mapping[str, Any]],
    *,
    by: GroupBy,
    since: date,
    model_table: PriceTable,
    today: date | None = None,
    max_groups: int | None = None,
    deadline: float | None = None,
) -> dict[str, Any]:
    """Savings over time: `stats_json` for the whole period, plus one value per UTC day from
    `since` through today for every metric in SERIES_METRICS, per group and in total.

    Each day is priced on its own (its own cache-hit share), so the days' money may differ a
    little from the period's, which prices the period as one; tokens and counts add up exactly.
    Past `max_groups` groups, the smallest are added up as one, OTHER (the answer's size is
    groups x days). Past `deadline` (time.monotonic()), StatsTimeoutError.
    """
    today = today or datetime.now(UTC).date()
    model_table = _Remembered(model_table)
    days = [(since + timedelta(days=i)).isoformat() for i in range((today - since).days + 1)]
    days = sorted({*days, *(str(r.get("day", "")) for r in rows)} - {""})
    per_day: dict[str, list[Mapping[str, Any]]] = {d: [] for d in days}
    for row in rows:
        per_day[str(row.get("day", ""))].append(row)
    table = compute_stats(rows, by=by, model_table=model_table)
    _check_deadline(deadline)
    keep = largest_groups(table, max_groups) if max_groups is not None else None
    if keep is not None:
        table = compute_stats(rows, by=by, model_table=model_table, keep=keep)
    keys = [r.key for r in table]
    series: dict[str, dict[str, list[float]]] = {
        k: {m: [] for m in SERIES_METRICS} for k in [*keys, "total"]
    }
    for day in days:
        _check_deadline(deadline)
        day_rows = compute_stats(per_day[day], by=by, model_table=model_table, keep=keep)
        found = {r.key: r for r in day_rows}
        found["total"] = total(day_rows)
        for key, metrics in series.items():
            point = found.get(key, StatsRow(key=key))
            for metric in SERIES_METRICS:
                value = getattr(point, metric)
                metrics[metric].append(round(value, 6) if isinstance(value, float) else value)
    return {**stats_json(table, by=by, since=since), "days": days, "series": series}


_COLUMNS = (
    ("", lambda r: r.key),
    ("requests", lambda r: f"{r.requests:,}"),
    ("compactions", lambda r: f"{r.compactions:,}"),
    ("tokens w/o", lambda r: f"{r.tokens_without:,}"),
    ("tokens sent", lambda r: f"{r.tokens_sent:,}"),
    ("saved", lambda r: f"{r.saved_share:.1%}"),
    ("cache hit", lambda r: f"{r.cache_hit_share:.1%}"),
    ("cost $", lambda r: f"{r.cost_usd:,.2f}"),
    ("saved $ (net)", lambda r: f"{r.saved_usd:,.2f}"),
    ("cache loss $", lambda r: f"{r.cache_loss_usd:,.2f}"),
    ("shadow would save $", lambda r: f"{r.shadow_would_save_usd:,.2f}"),
)


def format_table(rows: list[StatsRow]) -> str:
    """A plain-text table of the rows and their total, for `compactd stats`."""
    body = [*rows, total(rows)]
    cells = [[head for head, _ in _COLUMNS]]
    cells += [[str(fmt(r)) for _, fmt in _COLUMNS] for r in body]
    widths = [max(len(row[i]) for row in cells) for i in range(len(_COLUMNS))]
    lines = []
    for n, row in enumerate(cells):
        first = row[0].ljust(widths[0])
        rest = (c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True))
        lines.append("  ".join([first, *rest]).rstrip())
        if n == 0 or n == len(cells) - 2:
            lines.append("  ".join("-" * w for w in widths))
    every = total(rows)
    if every.cache_rules:
        lines.append(f"cache rules: {', '.join(every.cache_rules)}; {ASSUMPTIONS}")
    unpriced = every.unpriced_models
    if unpriced:
        lines.append(f"no price in the model table (money not counted): {', '.join(unpriced)}")
    return "\n".join(lines)
