"""find_checkpoint in one round trip: a Lua script matches the request's prefix digests against
the conversation's checkpoint index server-side and returns the longest checkpoint.

Every key it touches is one conversation's (one hash slot: fine on Redis Cluster), and a script
runs atomically, so it reads one consistent state. It also pushes the conversation's expiry
back when that moves it noticeably (the rule in codec.refresh_due), originals first.
"""

from __future__ import annotations

import time
from typing import Any

from redis.asyncio import Redis

from proxy.store.redis_keys import ConversationKeys

# KEYS: originals, refs, checkpoints, index, meta (ConversationKeys.data()).
# ARGV: now, the prefix digests concatenated, their width (one string, not one argument per
# message: cheaper to pass into Lua). Returns false or {checkpoint, refreshed, ttl}.
FIND_SCRIPT = """
local idx = redis.call('HGETALL', KEYS[4])
local digests, w = ARGV[2], tonumber(ARGV[3])
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
    local refreshed = 0
    if ttl > 0 then
      local remaining = redis.call('PTTL', KEYS[4]) / 1000
      if ttl - remaining > math.min(60, ttl / 100) then
        for i = 1, 5 do redis.call('EXPIRE', KEYS[i], ttl) end
        redis.call('HSET', KEYS[5], 'updated_at', ARGV[1])
        refreshed = 1
      end
    end
    return {body, refreshed, ttl}
  end
end
return false
"""


async def find(
    r: Redis, script: Any, k: ConversationKeys, prefix_digests: list[str]
) -> tuple[bytes | None, int]:
    """(stored checkpoint or None, the retention it was refreshed to or 0)."""
    width = len(prefix_digests[0])
    if any(len(d) != width for d in prefix_digests):
        raise ValueError("prefix digests must all have the same length")
    args = [time.time(), "".join(prefix_digests), width]
    reply = await script(keys=list(k.data()), args=args, client=r)
    if not reply:
        return None, 0
    body, refreshed, ttl = reply
    return body, int(ttl) if refreshed else 0
