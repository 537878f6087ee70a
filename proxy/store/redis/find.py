"""find_checkpoint in one round trip: a Lua script matches the request's prefix digests against
the conversation's checkpoint index server-side and returns the longest checkpoint.

A replay usually finds the checkpoint the instance already holds (`proxy.store.decoded`): it
then sends only that checkpoint's source digest, position and version (the SHA-1 of its stored
bytes, which the save script records in the metadata hash as `v:<digest>`), and the script
answers "still stored, same version" with the positions and digests of any LONGER checkpoints
(another instance's), which the caller matches itself. A replayed turn then moves a few hundred
bytes, whatever the size of the conversation or its checkpoint; only a checkpoint not held, or
another version of it, is sent whole (by the full lookup).

Every key it touches is one conversation's (one hash slot: fine on Redis Cluster), and a script
runs atomically, so it reads one consistent state. It also says when the conversation's expiry
is due to be pushed back (the rule in codec.refresh_due), with the ref ids whose index entries
must be pushed back first (redis_save.refresh): pointers always outlive the data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from proxy.store.base import version_length
from proxy.store.redis.client import Client
from proxy.store.redis.keys import ConversationKeys

# KEYS: originals, refs, checkpoints, index, meta (ConversationKeys.data()).
# ARGV: the prefix digests concatenated, their width (one string, not one argument per
# message: cheaper to pass into Lua); then a held checkpoint's source digest, version,
# covered_through and stored length ('' for none: the full lookup). Returns false or
# {checkpoint ('' when the held one stands), its version, due, ttl, state, ref ids if due...}:
# state is '' (full lookup), '!' (the held one is gone or another version: look up in full)
# or the longer checkpoints' `covered_through:digest`, comma-separated, after '='.
FIND_SCRIPT = """#!lua flags=no-writes

local idx = redis.call('HGETALL', KEYS[4])
local digests, w = ARGV[1], tonumber(ARGV[2])
local held, hk = ARGV[3], tonumber(ARGV[5])
local ttl, here = 0, false
local found, longer = {}, {}
for i = 1, #idx, 2 do
  local d, v = idx[i], idx[i + 1]
  if d == '~ttl' then
    ttl = tonumber(v)
  elseif held == '' then
    local k = tonumber(v)
    if string.sub(digests, k * w + 1, k * w + w) == d then found[#found + 1] = {k, d} end
  elseif d == held then
    here = true
  elseif tonumber(v) > hk then
    longer[#longer + 1] = v .. ':' .. d
  end
end
local function due(out)
  if ttl > 0 then
    local remaining = redis.call('PTTL', KEYS[4]) / 1000
    if ttl - remaining > math.min(60, ttl / 100) then
      out[3] = 1
      for _, ref in ipairs(redis.call('HKEYS', KEYS[2])) do out[#out + 1] = ref end
    end
  end
  return out
end
if held ~= '' then
  if here and redis.call('HGET', KEYS[5], 'v:' .. held) == ARGV[4]
      and redis.call('HSTRLEN', KEYS[3], held) == tonumber(ARGV[6]) then
    return due({'', ARGV[4], 0, ttl, '=' .. table.concat(longer, ',')})
  end
  return {'', '', 0, 0, '!'}
end
table.sort(found, function(a, b) return a[1] > b[1] end)
for _, c in ipairs(found) do
  local body = redis.call('HGET', KEYS[3], c[2])
  if body then
    return due({body, redis.call('HGET', KEYS[5], 'v:' .. c[2]) or '', 0, ttl, ''})
  end
end
return false
"""


@dataclass(frozen=True)
class Found:
    """What the script answered."""

    body: bytes | None = None
    """The stored checkpoint (None: none matched, or the held one stands)."""
    version: str = ""
    """Its version as stored ("" for one written before versions were)."""
    held: bool = False
    """The held checkpoint is still stored, in that version."""
    longer: list[tuple[int, str]] = field(default_factory=list)
    """(covered_through, source digest) of the conversation's longer checkpoints."""
    due_ttl: int = 0
    """The retention due to be refreshed to, or 0."""
    refs: list[str] = field(default_factory=list)
    """The conversation's ref ids, when a refresh is due."""
    stale: bool = False
    """The held checkpoint is gone or stored in another version: look up in full."""


def _text(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


async def find(
    r: Client,
    script: Any,
    k: ConversationKeys,
    prefix_digests: list[str],
    held: tuple[str, str, int] | None = None,
) -> Found:
    """The longest checkpoint matching `prefix_digests`, or with `held` (source digest, version,
    covered_through of a checkpoint the caller has): whether it stands, and what is longer."""
    width = len(prefix_digests[0])
    if any(len(d) != width for d in prefix_digests):
        raise ValueError("prefix digests must all have the same length")
    if held is None:
        args: list[Any] = ["".join(prefix_digests), width, "", "", -1, -1]
    else:
        args = ["", width, *held, version_length(held[1])]
    reply = await script(keys=list(k.data()), args=args, client=r)
    if not reply:
        return Found()
    body, version, due, ttl, state, *refs = reply
    due_ttl = int(ttl) if int(due) else 0
    refreshed = [_text(x) for x in refs] if due_ttl else []
    state = _text(state)
    if state == "!":
        return Found(stale=True)
    if state.startswith("="):
        longer = [(int(p), d) for p, _, d in (x.partition(":") for x in state[1:].split(",") if x)]
        return Found(None, _text(version), True, longer, due_ttl, refreshed)
    return Found(body, _text(version), False, [], due_ttl, refreshed)
