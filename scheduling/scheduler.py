"""The batch scheduler's state in Redis: one FIFO bucket of job ids per shape.

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

from django.conf import settings

from imagegen.redis_client import PREFIX, get_redis


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


def cap_for(width: int, height: int) -> int:
    return settings.IMAGEGEN_BATCH_CAPS.get(f"{width}x{height}", settings.IMAGEGEN_BATCH_CAP)


def _shapes_key(model: str) -> str:
    return f"{PREFIX}shapes:{model}"


def _bucket_key(shape: str) -> str:
    return f"{PREFIX}q:{shape}"


# KEYS[1]: the model's set of shapes. ARGV: now, starvation seconds, caps JSON, default cap,
# only_shape ("" for any), max_images (0 for the shape's cap), bucket key prefix.
# Picks the starving shape with the oldest head if any, else the fullest bucket, then pops
# whole jobs FIFO while they fit (a lone job larger than the cap runs alone).
_TAKE_LUA = """
local now = tonumber(ARGV[1])
local starvation = tonumber(ARGV[2])
local caps = cjson.decode(ARGV[3])
local default_cap = tonumber(ARGV[4])
local only = ARGV[5]
local max_images = tonumber(ARGV[6])
local qprefix = ARGV[7]

local function cap_of(shape)
  local size = string.match(shape, "^[^|]*|([^|]*)|")
  local c = caps[size]
  if c then return tonumber(c) end
  return default_cap
end

local function count_of(member)
  return tonumber(string.match(member, ":(%d+)$"))
end

local shapes
if only ~= "" then shapes = {only} else shapes = redis.call('SMEMBERS', KEYS[1]) end

local best, best_images, best_oldest, starving = nil, -1, nil, false
for _, shape in ipairs(shapes) do
  local q = qprefix .. shape
  local head = redis.call('ZRANGE', q, 0, 63, 'WITHSCORES')
  if #head == 0 then
    if only == "" then redis.call('SREM', KEYS[1], shape) end
  else
    local cap = cap_of(shape)
    local oldest = tonumber(head[2])
    local images = 0
    for i = 1, #head, 2 do
      images = images + count_of(head[i])
      if images >= cap then break end
    end
    if images > cap then images = cap end
    local is_starving = (now - oldest) > starvation
    if is_starving then
      if (not starving) or oldest < best_oldest then
        best, best_images, best_oldest, starving = shape, images, oldest, true
      end
    elseif not starving then
      if images > best_images or (images == best_images and oldest < best_oldest) then
        best, best_images, best_oldest = shape, images, oldest
      end
    end
  end
end
if not best then return nil end

local cap = cap_of(best)
if max_images > 0 and max_images < cap then cap = max_images end
local q = qprefix .. best
local head = redis.call('ZRANGE', q, 0, 63, 'WITHSCORES')
local taken = {}
local total = 0
for i = 1, #head, 2 do
  local n = count_of(head[i])
  if total + n > cap and not (total == 0 and max_images == 0) then break end
  table.insert(taken, head[i])
  table.insert(taken, head[i + 1])
  total = total + n
  redis.call('ZREM', q, head[i])
  if total >= cap then break end
end
if #taken == 0 then return nil end
if redis.call('ZCARD', q) == 0 and only == "" then redis.call('SREM', KEYS[1], best) end
table.insert(taken, 1, best)
return taken
"""


@dataclass(frozen=True)
class Entry:
    job_id: str
    count: int
    enqueued_at: float


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


def enqueue(model: str, shape: str, job_id: str, count: int, enqueued_at: float | None = None) -> None:
    r = get_redis()
    pipe = r.pipeline()
    pipe.zadd(_bucket_key(shape), {f"{job_id}:{count}": enqueued_at or time.time()}, nx=True)
    pipe.sadd(_shapes_key(model), shape)
    added, _ = pipe.execute()
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


def remove(shape: str, job_id: str, count: int) -> None:
    get_redis().zrem(_bucket_key(shape), f"{job_id}:{count}")


def is_enqueued(shape: str, job_id: str, count: int) -> bool:
    return get_redis().zscore(_bucket_key(shape), f"{job_id}:{count}") is not None


_script = None


def take(model: str, only_shape: str = "", max_images: int = 0, now: float | None = None) -> Taken | None:
    """Pop the next batch's worth of jobs for a free worker of `model`, or None."""
    global _script
    r = get_redis()
    if _script is None:
        _script = r.register_script(_TAKE_LUA)
    result = _script(
        keys=[_shapes_key(model)],
        args=[
            now if now is not None else time.time(),
            settings.IMAGEGEN_STARVATION_SECONDS,
            json.dumps(settings.IMAGEGEN_BATCH_CAPS),
            settings.IMAGEGEN_BATCH_CAP,
            only_shape,
            max_images,
            f"{PREFIX}q:",
        ],
        client=r,
    )
    if not result:
        return None
    shape, flat = result[0], result[1:]
    entries = []
    for member, score in zip(flat[::2], flat[1::2], strict=True):
        job_id, count = member.rsplit(":", 1)
        entries.append(Entry(job_id=job_id, count=int(count), enqueued_at=float(score)))
    return Taken(shape=shape, entries=entries)


def queued_entries(model: str) -> dict[str, list[tuple[str, int, float]]]:
    """Per shape: (job id, images, enqueue time) in FIFO order."""
    r = get_redis()
    shapes = sorted(r.smembers(_shapes_key(model)))
    pipe = r.pipeline()
    for shape in shapes:
        pipe.zrange(_bucket_key(shape), 0, -1, withscores=True)
    out = {}
    for shape, members in zip(shapes, pipe.execute(), strict=True):
        if members:
            out[shape] = [(m.rsplit(":", 1)[0], int(m.rsplit(":", 1)[1]), score) for m, score in members]
    return out


def set_cancel_flag(job_id: str) -> None:
    get_redis().set(f"{PREFIX}cancel:{job_id}", "1", ex=24 * 3600)


def cancelled_among(job_ids: list[str]) -> set[str]:
    if not job_ids:
        return set()
    flags = get_redis().mget([f"{PREFIX}cancel:{j}" for j in job_ids])
    return {j for j, flag in zip(job_ids, flags, strict=True) if flag}
