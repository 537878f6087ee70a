"""Which policy applies to a request: config rules first, then what the client may ask for.

Rules are compiled once when the resolver is built (at start-up, so a bad fingerprint or a
`match_header_values` without `match_header` stops the server there); `resolve` runs on every
request and does only dictionary look-ups and pre-compiled regex matches.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass

from proxy.config import APIS, PolicySettings, Settings
from proxy.errors import ConfigError
from proxy.tokens.budget import model_names

POLICY_HEADER = "x-compactd-policy"
BYPASS_HEADER = "x-compactd-bypass"
_BYPASS_ON = frozenset({"1", "true", "yes", "on"})
_FINGERPRINT = re.compile(r"[0-9a-f]{12}")


@dataclass(frozen=True)
class PolicyDecision:
    """The policy a request runs under, and whether the client's own wishes were honoured."""

    policy: PolicySettings
    """The effective policy (after any client selection)."""
    matched: PolicySettings
    """The policy the config rules chose, before any client selection."""
    bypass: bool
    """The client sent `x-compactd-bypass` and the effective policy allows it."""
    requested_policy: str | None = None
    """The raw `x-compactd-policy` value, if sent."""
    requested_policy_refused: bool = False
    """A policy was requested that the matched policy does not list in `selectable`."""
    bypass_refused: bool = False
    """The client asked to bypass but the effective policy does not allow it."""

    @property
    def name(self) -> str:
        """Name of the effective policy (for headers, metrics, logs and accounting)."""
        return self.policy.name

    @property
    def forward_raw(self) -> bool:
        """Forward the original bytes without looking at them (bypass, or a policy that is off)."""
        return self.bypass or self.policy.mode == "off"


@dataclass(frozen=True)
class _Rule:
    policy: PolicySettings
    keys: frozenset[str]
    models: re.Pattern[str] | None
    header: str
    header_values: frozenset[str]
    apis: frozenset[str]

    def matches(
        self, fingerprint: str | None, model: str, headers: Mapping[str, str], api: str
    ) -> bool:
        # Every criterion given must hold (AND); within one criterion any listed value will do.
        if self.keys and (fingerprint is None or fingerprint not in self.keys):
            return False
        if self.apis and api not in self.apis:
            return False
        if self.models is not None and not any(
            self.models.fullmatch(name) for name in model_names(model)
        ):
            return False
        if self.header:
            value = headers.get(self.header)
            if value is None or not value.strip():
                return False
            if self.header_values and value.strip() not in self.header_values:
                return False
        return True


def _compile_globs(globs: tuple[str, ...]) -> re.Pattern[str] | None:
    if not globs:
        return None
    # fnmatch.translate anchors with \Z; one alternation keeps matching a single regex call.
    # Lower-cased like the names they are matched against (`model_names`), as the table's are.
    return re.compile("|".join(f"(?:{fnmatch.translate(g.lower())})" for g in globs))


def _rule(policy: PolicySettings, where: str) -> _Rule | None:
    keys = frozenset(k.strip().lower() for k in policy.match_keys)
    for key in keys:
        if _FINGERPRINT.fullmatch(key) is None:
            raise ConfigError(
                f"{where}.match_keys: {key!r} is not a key id "
                "(12 hex digits, printed by `compactd key-id`)"
            )
    if policy.match_header_values and not policy.match_header:
        raise ConfigError(f"{where}.match_header_values: needs match_header")
    header = policy.match_header.strip().lower()
    if not (keys or policy.match_models or header or policy.match_apis):
        # A policy without any match criterion is reachable only through `selectable`.
        return None
    return _Rule(
        policy=policy,
        keys=keys,
        models=_compile_globs(policy.match_models),
        header=header,
        header_values=frozenset(v.strip() for v in policy.match_header_values),
        apis=frozenset(policy.match_apis),
    )


class PolicyResolver:
    """Chooses the policy for each request from the configured `[[policies]]` and the default."""

    def __init__(self, settings: Settings) -> None:
        self._default = settings.default_policy
        self._by_name = {p.name: p for p in settings.all_policies()}
        rules = (_rule(p, f"policies[{i}]") for i, p in enumerate(settings.policies))
        self._rules = tuple(r for r in rules if r is not None)
        default = self._default
        if default.match_keys or default.match_models or default.match_header or default.match_apis:
            raise ConfigError("default_policy: match_* keys are not allowed on the default policy")

    def get(self, name: str) -> PolicySettings | None:
        """A policy by name (the default included), or None."""
        return self._by_name.get(name)

    def match(
        self,
        *,
        key_fingerprint: str | None,
        model: str,
        headers: Mapping[str, str],
        api: str = APIS[0],
    ) -> PolicySettings:
        """The first `[[policies]]` entry whose rules hold, else the default policy."""
        for rule in self._rules:
            if rule.matches(key_fingerprint, model, headers, api):
                return rule.policy
        return self._default

    def resolve(
        self,
        *,
        key_fingerprint: str | None,
        model: str,
        headers: Mapping[str, str],
        api: str = APIS[0],
    ) -> PolicyDecision:
        """The effective policy and bypass decision for one request.

        `headers` must answer lower-case names (starlette's `Headers` does, case-insensitively).
        """
        matched = self.match(key_fingerprint=key_fingerprint, model=model, headers=headers, api=api)
        effective = matched
        requested = headers.get(POLICY_HEADER)
        refused = False
        if requested is not None:
            requested = requested.strip()
            if requested != matched.name:
                chosen = self._by_name.get(requested)
                if chosen is not None and requested in matched.selectable:
                    effective = chosen
                else:
                    refused = True
        asked_bypass = headers.get(BYPASS_HEADER, "").strip().lower() in _BYPASS_ON
        bypass = asked_bypass and effective.allow_bypass
        return PolicyDecision(
            policy=effective,
            matched=matched,
            bypass=bypass,
            requested_policy=requested,
            requested_policy_refused=refused,
            bypass_refused=asked_bypass and not bypass,
        )
