"""Rates counted in the shared Redis: one atomic Lua call per check, so concurrent requests on
any number of web processes cannot all slip past a limit between a read and a write (which a
get-then-set throttle allows).

A sliding-window counter: the count of the current fixed window plus the previous window's
count weighted by how much of it still overlaps the last `window` seconds. Two small keys per
subject, no per-request entries. `take_all` checks several limits (the user's scope and the
client address) in one round trip, and counts against all of them only when all allow it.
Redis errors are raised: each caller decides whether its limit fails open (request throttles,
sign-in) or closed (prompt checks, which need Redis anyway).

`now` is the clock (time.time); tests drive it to replay minutes of traffic in seconds.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from imagegen.env import parse_rate
from imagegen.redis_client import PREFIX, get_redis

__all__ = ["Limit", "Verdict", "add", "clear", "parse_rate", "take", "take_all"]

now = time.time

# KEYS: two per limit (current window, previous window). ARGV: consume flag, then per limit
# (limit, window, elapsed in the current window, cost). Returns per limit {allowed, wait,
# remaining}; nothing is counted unless every limit allows it.
_SLIDING = """
local consume = ARGV[1] == '1'
local n = #KEYS / 2
local out = {}
local all = true
for i = 1, n do
  local limit = tonumber(ARGV[2 + (i - 1) * 4])
  local window = tonumber(ARGV[3 + (i - 1) * 4])
  local elapsed = tonumber(ARGV[4 + (i - 1) * 4])
  local cost = tonumber(ARGV[5 + (i - 1) * 4])
  local current = tonumber(redis.call('GET', KEYS[2 * i - 1]) or '0')
  local previous = tonumber(redis.call('GET', KEYS[2 * i]) or '0')
  local weighted = previous * (window - elapsed) / window
  local used = weighted + current + cost
  if used > limit then
    all = false
    local wait = window - elapsed
    if current + cost <= limit and previous > 0 then
      -- enough of the previous window slides out before this one ends
      wait = (used - limit) * window / previous
    end
    out[i] = {0, tostring(wait), '0'}
  else
    out[i] = {1, '0', tostring(limit - used)}
  end
end
if consume and all then
  for i = 1, n do
    local cost = tonumber(ARGV[5 + (i - 1) * 4])
    local window = tonumber(ARGV[3 + (i - 1) * 4])
    if cost > 0 then
      redis.call('INCRBY', KEYS[2 * i - 1], cost)
      redis.call('PEXPIRE', KEYS[2 * i - 1], math.ceil(window * 2000))
    end
  end
end
return out
"""

_script = None


@dataclass(frozen=True)
class Limit:
    subject: str
    limit: int
    window: float
    cost: int = 1


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    retry_after: int  # whole seconds, at least 1 when refused
    remaining: float = 0.0  # what is left of the limit after this one (when allowed)
    reset: int = 0  # seconds until the current window ends


def _keys(subject: str, window: float, at: float) -> tuple[str, str, float]:
    index = int(at // window)
    base = f"{PREFIX}rl:{subject}:{int(window)}"
    return f"{base}:{index}", f"{base}:{index - 1}", at - index * window


def take_all(limits: list[Limit], consume: bool = True) -> list[Verdict]:
    """Check every limit in one round trip; count each one's cost only if all allow it.
    Raises redis errors."""
    global _script
    if _script is None:
        _script = get_redis().register_script(_SLIDING)
    at = now()
    keys: list[str] = []
    args: list = ["1" if consume else "0"]
    elapsed_of = []
    for item in limits:
        current, previous, elapsed = _keys(item.subject, item.window, at)
        keys += [current, previous]
        args += [item.limit, item.window, elapsed, item.cost]
        elapsed_of.append(elapsed)
    verdicts = []
    for item, elapsed, (allowed, wait, remaining) in zip(limits, elapsed_of, _script(keys=keys, args=args), strict=True):
        ok = bool(int(allowed))
        verdicts.append(Verdict(ok, 0 if ok else max(1, math.ceil(float(wait))), float(remaining),
                                max(0, math.ceil(item.window - elapsed))))
    return verdicts


def take(subject: str, limit: int, window: float, cost: int = 1, consume: bool = True) -> Verdict:
    """Count `cost` against `limit` per `window` seconds for `subject`, if it fits (consume
    False: only ask whether it would). Raises redis errors."""
    return take_all([Limit(subject, limit, window, cost)], consume)[0]


def add(subject: str, window: float, cost: int) -> None:
    """Count `cost` more for `subject` whatever the limit (the rest of a charge settled after
    the answer). One round trip."""
    current, _, _ = _keys(subject, window, now())
    pipe = get_redis().pipeline(transaction=False)
    pipe.incrby(current, cost)
    pipe.pexpire(current, math.ceil(window * 2000))
    pipe.execute()


def clear(subject: str, window: float) -> None:
    current, previous, _ = _keys(subject, window, now())
    get_redis().delete(current, previous)
