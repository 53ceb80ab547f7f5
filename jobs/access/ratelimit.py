"""Rates counted in the shared Redis: one atomic Lua call per check, so concurrent requests on
any number of web processes cannot all slip past a limit between a read and a write (which a
get-then-set throttle allows).

A sliding-window counter: the count of the current fixed window plus the previous window's
count weighted by how much of it still overlaps the last `window` seconds. Two small keys per
subject, no per-request entries. Redis errors are raised: each caller decides whether its limit
fails open (request throttles, sign-in) or closed (prompt checks, which need Redis anyway).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from imagegen.env import parse_rate
from imagegen.redis_client import PREFIX, get_redis

__all__ = ["Verdict", "clear", "parse_rate", "take"]

_SLIDING = """
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local elapsed = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local consume = ARGV[5] == '1'
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local previous = tonumber(redis.call('GET', KEYS[2]) or '0')
local weighted = previous * (window - elapsed) / window
if weighted + current + cost > limit then
  local wait = window - elapsed
  if current + cost <= limit and previous > 0 then
    -- enough of the previous window slides out before this one ends
    wait = (weighted + current + cost - limit) * window / previous
  end
  return {0, tostring(wait)}
end
if consume and cost > 0 then
  redis.call('INCRBY', KEYS[1], cost)
  redis.call('PEXPIRE', KEYS[1], math.ceil(window * 2000))
end
return {1, '0'}
"""

_script = None


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    retry_after: int  # whole seconds, at least 1 when refused


def take(subject: str, limit: int, window: float, cost: int = 1, consume: bool = True) -> Verdict:
    """Count `cost` against `limit` per `window` seconds for `subject`, if it fits (consume
    False: only ask whether it would). Raises redis errors."""
    global _script
    if _script is None:
        _script = get_redis().register_script(_SLIDING)
    now = time.time()
    index = int(now // window)
    base = f"{PREFIX}rl:{subject}:{int(window)}"
    allowed, wait = _script(keys=[f"{base}:{index}", f"{base}:{index - 1}"], args=[limit, window, now - index * window, cost, "1" if consume else "0"])
    return Verdict(bool(int(allowed)), 0 if int(allowed) else max(1, math.ceil(float(wait))))


def clear(subject: str, window: float) -> None:
    index = int(time.time() // window)
    base = f"{PREFIX}rl:{subject}:{int(window)}"
    get_redis().delete(f"{base}:{index}", f"{base}:{index - 1}")
