"""The prompt check's CPU per prompt, one prompt at a time against batched across prompts
(PromptFilter.check_many: one encoder pass for the clauses of every prompt of the batch, what a
cpu worker's drain runs: jobs/pipeline/prompt_batch.py).

    .venv/bin/python bench/prompt_batch.py [--batches 1,4,8,16,32] [--prompts 320] [--rounds 2]

Prompts: the held-out prompts under 300 characters (training/prompt_gate/heldout.jsonl), in a
fixed shuffled order, each batch size over the same prompts. The filter's embedding cache is
cleared before every batch (cold: no clause seen before, the costly case; real traffic repeats
style tags and retries). One thread (torch and OMP at 1), thread CPU time (steady when the
machine is busy with other work), and wall time; the load average is recorded. Sizes run in an
interleaved order each round, so a change in the machine's load falls on all of them.
Writes bench/results/prompt_batch.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")

from safety.prompt_filter import PromptFilter  # noqa: E402

HELDOUT = ROOT / "training" / "prompt_gate" / "heldout.jsonl"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", default="1,4,8,16,32")
    p.add_argument("--prompts", type=int, default=320)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "prompt_batch.json"))
    a = p.parse_args()

    rows = [json.loads(line) for line in HELDOUT.read_text().splitlines() if line.strip()]
    prompts = [r["prompt"] for r in rows if len(r["prompt"]) < 300]
    random.Random(3).shuffle(prompts)
    prompts = prompts[: a.prompts]
    flt = PromptFilter.load(None, use_embeddings=True)
    flt.check_many([(q, "") for q in prompts[:8]])  # warm: torch's first calls, the bf16 copy
    sizes = [int(b) for b in a.batches.split(",")]
    cpu: dict[int, list[float]] = {b: [] for b in sizes}
    wall: dict[int, list[float]] = {b: [] for b in sizes}
    same = True
    load_before = os.getloadavg()[0]
    for round_ in range(a.rounds):
        for b in (sizes if round_ % 2 == 0 else sizes[::-1]):
            for start in range(0, len(prompts) - b + 1, b):
                batch = prompts[start : start + b]
                flt.embedding_cache.clear()
                c0, w0 = time.thread_time(), time.perf_counter()
                if b == 1:
                    verdicts = [flt.check(batch[0])]
                else:
                    verdicts = flt.check_many([(q, "") for q in batch])
                cpu[b].append((time.thread_time() - c0) / b)
                wall[b].append((time.perf_counter() - w0) / b)
                if round_ == 0 and b == sizes[-1]:
                    flt.embedding_cache.clear()
                    alone = [flt.check(q).decision for q in batch]
                    same = same and alone == [v.decision for v in verdicts]  # type: ignore[union-attr]
    result = {
        "command": "python bench/prompt_batch.py " + " ".join(sys.argv[1:]),
        "prompts": len(prompts), "rounds": a.rounds, "cores": os.cpu_count(),
        "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "same_decisions_as_one_at_a_time": same,
        "per_prompt": {str(b): {"cpu_ms_mean": round(1000 * statistics.mean(cpu[b]), 2),
                                "cpu_ms_p50": round(1000 * statistics.median(cpu[b]), 2),
                                "wall_ms_mean": round(1000 * statistics.mean(wall[b]), 2)} for b in sizes},
    }
    base = result["per_prompt"][str(sizes[0])]["cpu_ms_mean"]
    for b in sizes:
        row = result["per_prompt"][str(b)]
        row["cpu_vs_batch_1"] = round(row["cpu_ms_mean"] / base, 3)
        print(f"batch {b:>3}: {row['cpu_ms_mean']:7.2f} ms CPU per prompt (x{row['cpu_vs_batch_1']}), "
              f"{row['wall_ms_mean']:7.2f} ms wall", flush=True)
    print("same decisions as one at a time:", same, "load", result["load_average_1m"])
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print("wrote", a.out)


if __name__ == "__main__":
    main()
