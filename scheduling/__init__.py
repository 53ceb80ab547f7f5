"""Scheduling: the batch scheduler's state in Redis and its policy, the cost model, the lanes
and the GPU workers' heartbeats.

It sits below `jobs` (which owns job state) and imports nothing of the project above the
foundation modules (`imagegen.redis_client`, `imagegen.metrics`): .importlinter holds it to that.
"""
