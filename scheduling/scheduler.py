"""The batch scheduler's state in Redis: per shape, a FIFO queue of job entries per tier
(interactive `q:<shape>`, batch `qb:<shape>`; an entry names the job, its owner and its images)
and the fair-share deficits carried between takes (`drr:<shape>`); the owners' weights.

Batches are formed when a GPU worker is free (pull), not when jobs arrive. `take` runs as one
Lua script, so two workers never take the same entry; the database's compare-and-set on the
job status is the second guard (a stale or duplicated entry is dropped at claim time).

Redis holds nothing that cannot be rebuilt: `rebuild` re-enqueues every admitted, queued job
from the database when the state is lost.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from functools import lru_cache

from django.conf import settings

from imagegen.redis_client import PREFIX, get_redis
from scheduling import policy


def shape_key(model_version: str, width: int, height: int, steps: int, guidance: float, scheduler: str) -> str:
    return f"{model_version}|{width}x{height}|{steps}|{guidance:g}|{scheduler}"


def parse_shape(key: str) -> dict:
    version, size, steps, guidance, scheduler = key.split("|")
    width, height = (int(v) for v in size.split("x"))
    return {
        "model_version": version,
        "width": width,
        "height": height,
        "steps": int(steps),
        "guidance_scale": float(guidance),
        "scheduler": scheduler,
    }


def caps_table() -> dict[str, int]:
    """Batch caps by size ("WxH") from IMAGEGEN_BATCH_CAPS, and by version and size
    ("version|WxH") from each served model's serving.json (`batch_caps`), which win. Built once
    per configuration: the take and the wait estimate's replay ask for it on every pass."""
    from scheduling import catalogue

    return _caps(tuple(sorted(settings.IMAGEGEN_BATCH_CAPS.items())), catalogue.key())[0]


@lru_cache(maxsize=8)
def _caps(base: tuple, catalogue_key: tuple) -> tuple[dict[str, int], str]:
    """catalogue_key: only the cache key (served() reads the same settings)."""
    from scheduling import catalogue

    table = dict(base)
    for served in catalogue.served().values():
        table.update({f"{served.version}|{size}": cap for size, cap in served.batch_caps.items()})
    return table, json.dumps(table)


def caps_json() -> str:
    """caps_table() as the take script's argument."""
    from scheduling import catalogue

    return _caps(tuple(sorted(settings.IMAGEGEN_BATCH_CAPS.items())), catalogue.key())[1]


def cap_for(width: int, height: int, version: str = "") -> int:
    table = caps_table()
    size = f"{width}x{height}"
    return table.get(f"{version}|{size}", table.get(size, settings.IMAGEGEN_BATCH_CAP))


def fill_wait_for(version: str = "") -> float:
    """Seconds a partial batch of `version` waits for more: its serving.json's `fill_wait`, else
    IMAGEGEN_FILL_WAIT (a model whose batches gain nothing is measured to cap 1 and no wait)."""
    from scheduling import catalogue

    served = catalogue.served().get(version) if version else None
    return served.fill_wait if served is not None and served.fill_wait is not None else settings.IMAGEGEN_FILL_WAIT


def _shapes_key(model: str) -> str:
    return f"{PREFIX}shapes:{model}"


def _bucket_key(shape: str, tier: int = policy.INTERACTIVE) -> str:
    return f"{PREFIX}q:{shape}" if tier == policy.INTERACTIVE else f"{PREFIX}qb:{shape}"


def _deficits_key(shape: str) -> str:
    return f"{PREFIX}drr:{shape}"


WEIGHTS_KEY = f"{PREFIX}weights"


def tier_of(priority: str) -> int:
    return policy.BATCH if priority == "batch" else policy.INTERACTIVE


def member(job_id: str, count: int, owner: str) -> str:
    """A bucket entry: job id, owner (the fair-share flow) and images."""
    return f"{job_id}:{owner}:{count}"


def parse_member(value: str) -> tuple[str, str, int]:
    """(job id, owner, images); an entry written before owners were recorded is its own flow."""
    rest, count = value.rsplit(":", 1)
    job_id, _, owner = rest.partition(":")
    return job_id, owner or job_id, int(count)


# KEYS[1]: the model's set of shapes; KEYS[2]: the owners' weights. ARGV: now, starvation
# seconds, caps JSON, default cap, only_shape ("" for any), max_images (0 for the shape's cap),
# the key prefix, fair ("1"/"0"), entries read per tier. The rules, and their Python twin, are
# in scheduling/policy.py (tiers: 0 interactive in q:<shape>, 1 batch in qb:<shape>; carried
# deficits in drr:<shape>, field "<tier>:<owner>").
_TAKE_LUA = """
local now = tonumber(ARGV[1])
local starvation = tonumber(ARGV[2])
local caps = cjson.decode(ARGV[3])
local default_cap = tonumber(ARGV[4])
local only = ARGV[5]
local max_images = tonumber(ARGV[6])
local prefix = ARGV[7]
local fair = ARGV[8] == "1"
local scan = tonumber(ARGV[9])
local min_weight = 0.1

local function cap_of(shape)
  local version, size = string.match(shape, "^([^|]*)|([^|]*)|")
  local c = caps[version .. "|" .. size] or caps[size]
  if c then return tonumber(c) end
  return default_cap
end

local function qkey(tier, shape)
  if tier == 0 then return prefix .. "q:" .. shape end
  return prefix .. "qb:" .. shape
end

local function count_of(member)
  return tonumber(string.match(member, ":(%d+)$"))
end

local function owner_of(member)
  local rest = string.match(member, "^(.*):%d+$")
  local owner = string.match(rest, "^[^:]*:(.*)$")
  if owner then return owner end
  return rest
end

local function head_of(tier, shape)
  return redis.call('ZRANGE', qkey(tier, shape), 0, scan - 1, 'WITHSCORES')
end

local function ready(head, cap)
  local images = 0
  for i = 1, #head, 2 do
    images = images + count_of(head[i])
    if images >= cap then break end
  end
  if images > cap then images = cap end
  return images
end

local function less(a, b)
  for i = 1, math.max(#a, #b) do
    if a[i] == nil then return true end
    if b[i] == nil then return false end
    if a[i] < b[i] then return true end
    if a[i] > b[i] then return false end
  end
  return false
end

local shapes
if only ~= "" then shapes = {only} else shapes = redis.call('SMEMBERS', KEYS[1]) end
table.sort(shapes)

local best, best_rank = nil, nil
for _, shape in ipairs(shapes) do
  local hi = head_of(0, shape)
  local hb = head_of(1, shape)
  if #hi == 0 and #hb == 0 then
    if only == "" then redis.call('SREM', KEYS[1], shape) end
  else
    local cap = cap_of(shape)
    local rank
    if #hi > 0 then
      local oldest = tonumber(hi[2])
      if (now - oldest) > starvation then
        rank = {0, oldest}
      else
        local r = ready(hi, cap)
        rank = {1, -r, -math.min(cap, r + ready(hb, cap)), oldest}
      end
    else
      local oldest = tonumber(hb[2])
      if (now - oldest) > starvation then rank = {2, oldest} else rank = {3, -ready(hb, cap), oldest} end
    end
    if best_rank == nil or less(rank, best_rank) then best, best_rank = shape, rank end
  end
end
if not best then return nil end

local cap = cap_of(best)
if max_images > 0 and max_images < cap then cap = max_images end
local fill_only = max_images > 0
local dkey = prefix .. "drr:" .. best
local taken = {}
local total = 0

local function take_member(tier, member, score)
  table.insert(taken, member)
  table.insert(taken, score)
  redis.call('ZREM', qkey(tier, best), member)
end

for tier = 0, 1 do
  if total < cap then
    local head = head_of(tier, best)
    if #head > 0 and not fair then
      for i = 1, #head, 2 do
        local n = count_of(head[i])
        if total + n > cap and not (total == 0 and not fill_only) then break end
        take_member(tier, head[i], head[i + 1])
        total = total + n
        if total >= cap then break end
      end
    elseif #head > 0 then
      local order, flows, deficit, weight, blocked = {}, {}, {}, {}, {}
      for i = 1, #head, 2 do
        local o = owner_of(head[i])
        if flows[o] == nil then
          flows[o] = {first = 1, items = {}}
          table.insert(order, o)
        end
        table.insert(flows[o].items, {head[i], head[i + 1], count_of(head[i])})
      end
      for _, o in ipairs(order) do
        deficit[o] = tonumber(redis.call('HGET', dkey, tier .. ":" .. o) or "0")
        local w = tonumber(redis.call('HGET', KEYS[2], o) or "1")
        if w < min_weight then w = min_weight end
        weight[o] = w
      end
      local full = total >= cap
      while not full do
        local active = {}
        for _, o in ipairs(order) do
          local f = flows[o]
          if f.first <= #f.items and not blocked[o] then table.insert(active, o) end
        end
        if #active == 0 then break end
        for _, o in ipairs(active) do
          deficit[o] = deficit[o] + weight[o]
          local f = flows[o]
          while f.first <= #f.items and f.items[f.first][3] <= deficit[o] do
            local item = f.items[f.first]
            local n = item[3]
            if total + n > cap and not (total == 0 and not fill_only) then
              blocked[o] = true
              break
            end
            take_member(tier, item[1], item[2])
            f.first = f.first + 1
            deficit[o] = deficit[o] - n
            total = total + n
            if total >= cap then
              full = true
              break
            end
          end
          if full then break end
        end
      end
      for _, o in ipairs(order) do
        local f = flows[o]
        if f.first <= #f.items then
          redis.call('HSET', dkey, tier .. ":" .. o, string.format("%.17g", deficit[o]))
        else
          redis.call('HDEL', dkey, tier .. ":" .. o)
        end
      end
    end
  end
end
if #taken == 0 then return nil end
if redis.call('ZCARD', qkey(0, best)) == 0 and redis.call('ZCARD', qkey(1, best)) == 0 then
  redis.call('DEL', dkey)
  if only == "" then redis.call('SREM', KEYS[1], best) end
end
table.insert(taken, 1, best)
return taken
"""


@dataclass(frozen=True)
class Entry:
    job_id: str
    count: int
    enqueued_at: float
    owner: str = ""
    tier: int = policy.INTERACTIVE


@dataclass(frozen=True)
class Taken:
    shape: str
    entries: list[Entry]

    @property
    def images(self) -> int:
        return sum(e.count for e in self.entries)


ARRIVAL_WINDOW = 10  # seconds per arrivals counter
ARRIVAL_WINDOWS = 6  # counters the estimate reads: the last minute


def _arrivals_key(model: str, window: int) -> str:
    return f"{PREFIX}arr:{model}:{window}"


def enqueue(model: str, shape: str, job_id: str, count: int, enqueued_at: float | None = None, owner: str = "",
            tier: int = policy.INTERACTIVE, weight: float = 1.0) -> None:
    """Add a job to its shape's bucket (the tier's queue), as a job of `owner`'s flow; `weight`
    is the owner's fair-share weight (IMAGEGEN_USER_WEIGHTS), kept for the take."""
    r = get_redis()
    pipe = r.pipeline()
    pipe.zadd(_bucket_key(shape, tier), {member(job_id, count, owner or job_id): enqueued_at or time.time()}, nx=True)
    pipe.sadd(_shapes_key(model), shape)
    if owner:
        if weight == 1.0:
            pipe.hdel(WEIGHTS_KEY, owner)
        else:
            pipe.hset(WEIGHTS_KEY, owner, repr(float(weight)))
    added = pipe.execute()[0]
    if added:  # a new arrival (a rebuild re-adding a known entry is not one)
        key = _arrivals_key(model, int(time.time() // ARRIVAL_WINDOW))
        pipe = r.pipeline()
        pipe.hincrby(key, shape, count)
        pipe.expire(key, ARRIVAL_WINDOW * (ARRIVAL_WINDOWS + 2))
        pipe.execute()


def arrival_rates(model: str, now: float | None = None) -> dict[str, float]:
    """Images per second entering the queue per shape, over about the last minute."""
    now = time.time() if now is None else now
    current = int(now // ARRIVAL_WINDOW)
    windows = range(current - ARRIVAL_WINDOWS + 1, current + 1)
    pipe = get_redis().pipeline()
    for w in windows:
        pipe.hgetall(_arrivals_key(model, w))
    span = (ARRIVAL_WINDOWS - 1) * ARRIVAL_WINDOW + (now - current * ARRIVAL_WINDOW)
    totals: dict[str, float] = {}
    for counts in pipe.execute():
        for shape, n in counts.items():
            totals[shape] = totals.get(shape, 0.0) + float(n)
    return {shape: n / span for shape, n in totals.items()}


def _members(job_id: str, count: int, owner: str) -> list[str]:
    """The forms the job's entry may have: with its owner, as its own flow, from before owners."""
    return list(dict.fromkeys([member(job_id, count, owner or job_id), member(job_id, count, job_id), f"{job_id}:{count}"]))


def remove(shape: str, job_id: str, count: int, owner: str = "", tier: int = policy.INTERACTIVE) -> None:
    get_redis().zrem(_bucket_key(shape, tier), *_members(job_id, count, owner))


def is_enqueued(shape: str, job_id: str, count: int, owner: str = "", tier: int = policy.INTERACTIVE) -> bool:
    pipe = get_redis().pipeline(transaction=False)
    for value in _members(job_id, count, owner):
        pipe.zscore(_bucket_key(shape, tier), value)
    return any(score is not None for score in pipe.execute())


_script = None


def take(model: str, only_shape: str = "", max_images: int = 0, now: float | None = None) -> Taken | None:
    """Pop the next batch's worth of jobs for a free worker of `model`, or None."""
    global _script
    r = get_redis()
    if _script is None:
        _script = r.register_script(_TAKE_LUA)
    result = _script(
        keys=[_shapes_key(model), WEIGHTS_KEY],
        args=[
            now if now is not None else time.time(),
            settings.IMAGEGEN_STARVATION_SECONDS,
            caps_json(),
            settings.IMAGEGEN_BATCH_CAP,
            only_shape,
            max_images,
            PREFIX,
            "1" if settings.IMAGEGEN_FAIR_SHARE else "0",
            policy.HEAD_SCAN,
        ],
        client=r,
    )
    if not result:
        return None
    shape, flat = result[0], result[1:]
    entries = []
    for value, score in zip(flat[::2], flat[1::2], strict=True):
        job_id, owner, count = parse_member(value)
        entries.append(Entry(job_id=job_id, count=count, enqueued_at=float(score), owner=owner))
    return Taken(shape=shape, entries=entries)


def snapshot(model: str) -> tuple[policy.Buckets, dict[str, float]]:
    """The queued work as the policy sees it (both tiers, the carried deficits) and the owners'
    weights: what the wait estimate replays."""
    r = get_redis()
    shapes = sorted(r.smembers(_shapes_key(model)))
    pipe = r.pipeline()
    for shape in shapes:
        for tier in policy.TIERS:
            pipe.zrange(_bucket_key(shape, tier), 0, -1, withscores=True)
        pipe.hgetall(_deficits_key(shape))
    pipe.hgetall(WEIGHTS_KEY)
    replies = pipe.execute()
    weights = {owner: float(w) for owner, w in replies[-1].items()}
    buckets: policy.Buckets = {}
    for i, shape in enumerate(shapes):
        bucket = policy.Bucket()
        for tier in policy.TIERS:
            for value, score in replies[3 * i + tier]:
                job_id, owner, count = parse_member(value)
                bucket.append((job_id, count, score, owner, tier))
        for key, value in replies[3 * i + 2].items():
            tier, _, owner = key.partition(":")
            bucket.deficits[(int(tier), owner)] = float(value)
        if bucket:
            buckets[shape] = bucket
    return buckets, weights


def queued_entries(model: str) -> dict[str, list[tuple[str, int, float]]]:
    """Per shape: (job id, images, enqueue time), both tiers, oldest first."""
    buckets, _ = snapshot(model)
    return {shape: sorted(((e[0], e[1], e[2]) for e in bucket.entries()), key=lambda e: e[2])
            for shape, bucket in buckets.items()}


# KEYS: the pass's jobs' cancel flags, then the lane's set of shapes. ARGV[1]: the key prefix.
# Returns the flags that are set (1/0 each), then 1 when any shape of the lane has an interactive
# entry waiting: what a GPU worker running a batch-tier pass asks at each step, in one round trip.
_STEP_CHECK_LUA = """
local out = {}
for i = 1, #KEYS - 1 do
  if redis.call('EXISTS', KEYS[i]) == 1 then out[i] = 1 else out[i] = 0 end
end
local waiting = 0
for _, shape in ipairs(redis.call('SMEMBERS', KEYS[#KEYS])) do
  if redis.call('ZCARD', ARGV[1] .. 'q:' .. shape) > 0 then
    waiting = 1
    break
  end
end
out[#KEYS] = waiting
return out
"""
_step_script = None


def step_check(job_ids: list[str], lane: str | None) -> tuple[set[str], bool]:
    """What a running pass asks at a step boundary: which of its jobs were cancelled, and (with
    `lane`: a batch-tier pass that may be preempted) whether interactive work waits in any bucket
    of the lane. One round trip either way."""
    global _step_script
    if lane is None:
        return cancelled_among(job_ids), False
    r = get_redis()
    if _step_script is None:
        _step_script = r.register_script(_STEP_CHECK_LUA)
    replies = _step_script(keys=[*(f"{PREFIX}cancel:{j}" for j in job_ids), _shapes_key(lane)], args=[PREFIX], client=r)
    return {j for j, flag in zip(job_ids, replies, strict=False) if flag}, bool(replies[-1])


def interactive_waiting(lane: str) -> bool:
    """Whether interactive work waits in any bucket of the lane."""
    return step_check([], lane)[1]


def set_cancel_flag(job_id: str) -> None:
    get_redis().set(f"{PREFIX}cancel:{job_id}", "1", ex=24 * 3600)


def cancelled_among(job_ids: list[str]) -> set[str]:
    if not job_ids:
        return set()
    flags = get_redis().mget([f"{PREFIX}cancel:{j}" for j in job_ids])
    return {j for j, flag in zip(job_ids, flags, strict=True) if flag}
