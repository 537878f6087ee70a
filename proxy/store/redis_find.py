"""find_checkpoint in one round trip: a Lua script matches the request's prefix digests against
the conversation's checkpoint index server-side and returns the longest checkpoint.

Every key it touches is one conversation's (one hash slot: fine on Redis Cluster), and a script
runs atomically, so it reads one consistent state. It also says when the conversation's expiry
is due to be pushed back (the rule in codec.refresh_due), with the ref ids whose index entries
must be pushed back first (redis_save.refresh): pointers always outlive the data.
"""

from __future__ import annotations

from typing import Any

from proxy.store.redis_client import Client
from proxy.store.redis_keys import ConversationKeys

# KEYS: originals, refs, checkpoints, index, meta (ConversationKeys.data()).
# ARGV: the prefix digests concatenated, their width (one string, not one argument per
# message: cheaper to pass into Lua). Returns false or {checkpoint, due, ttl, ref ids if due…}.
FIND_SCRIPT = """#!lua flags=no-writes

local idx = redis.call('HGETALL', KEYS[4])
local digests, w = ARGV[1], tonumber(ARGV[2])
local ttl = 0
local found = {}
for i = 1, #idx, 2 do
  local d, v = idx[i], idx[i + 1]
  if d == '~ttl' then
    ttl = tonumber(v)
  else
    local k = tonumber(v)
    if string.sub(digests, k * w + 1, k * w + w) == d then found[#found + 1] = {k, d} end
  end
end
table.sort(found, function(a, b) return a[1] > b[1] end)
for _, c in ipairs(found) do
  local body = redis.call('HGET', KEYS[3], c[2])
  if body then
    if ttl > 0 then
      local remaining = redis.call('PTTL', KEYS[4]) / 1000
      if ttl - remaining > math.min(60, ttl / 100) then
        local out = {body, 1, ttl}
        for _, ref in ipairs(redis.call('HKEYS', KEYS[2])) do out[#out + 1] = ref end
        return out
      end
    end
    return {body, 0, ttl}
  end
end
return false
"""


async def find(
    r: Client, script: Any, k: ConversationKeys, prefix_digests: list[str]
) -> tuple[bytes | None, int, list[str]]:
    """(stored checkpoint or None, the retention due to be refreshed to or 0, its ref ids)."""
    width = len(prefix_digests[0])
    if any(len(d) != width for d in prefix_digests):
        raise ValueError("prefix digests must all have the same length")
    args = ["".join(prefix_digests), width]
    reply = await script(keys=list(k.data()), args=args, client=r)
    if not reply:
        return None, 0, []
    body, due, ttl, *refs = reply
    if not int(due):
        return body, 0, []
    return body, int(ttl), [x.decode() if isinstance(x, bytes) else str(x) for x in refs]
