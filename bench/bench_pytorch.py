"""schedlang.pytorch.fit against torch.utils.checkpoint.checkpoint_sequential and plain PyTorch.

    python bench/bench_pytorch.py [--budgets 90 75 60 50 40] [--steps 5] [--device cpu]
                                  [--models gpt cnn] [--json OUT]

Two models written as `nn.Sequential` (so that `checkpoint_sequential` applies to them as it is):
a GPT-like transformer (embedding, blocks, head) and a VGG-like CNN. For each budget, a
percentage of plain execution's peak (predicted from the profile):

* plain: no checkpointing (one row per model, the reference);
* checkpoint_sequential: every segment count is measured once; at a budget the row is the
  fastest segment count whose measured peak fits (none: the smallest peak, marked over);
* schedlang: `fit(model, inputs, budget, loss_fn=...)` (profile + H-Rockmate solve).

Peak: the most tensor bytes live during one training step (forward + backward), measured by
`MemoryTracker` (CPU: live storages; CUDA: max_memory_allocated). Time: median step time over
`--steps` steps after one warm-up, measured without the tracker, in one process, the methods
interleaved per repetition. Ratios are against plain execution.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.checkpoint import checkpoint_sequential  # noqa: E402

from schedlang.pytorch.fit import fit, prepare  # noqa: E402
from schedlang.pytorch.memory import MemoryTracker  # noqa: E402
from schedlang.testing.torch_models import Block  # noqa: E402


# --- models -------------------------------------------------------------------------------------
class Embed(nn.Module):
    def __init__(self, vocab, context, dim, dropout):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(context, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, idx):
        pos = torch.arange(idx.size(1), device=idx.device)
        return self.drop(self.tok(idx) + self.pos(pos))


class Head(nn.Module):
    def __init__(self, dim, vocab):
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, vocab, bias=False)

    def forward(self, x):
        return self.out(self.ln(x))


def make_gpt(batch=8, context=128, dim=128, heads=4, layers=6, vocab=256, dropout=0.1):
    torch.manual_seed(0)
    model = nn.Sequential(Embed(vocab, context, dim, dropout),
                          *[Block(dim, heads, context, dropout) for _ in range(layers)],
                          Head(dim, vocab))
    idx = torch.randint(0, vocab, (batch, context))
    targets = torch.roll(idx, -1, dims=1)

    def loss_fn(logits):
        return F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))

    return model, (idx,), loss_fn


def make_cnn(batch=8, size=64, width=32, blocks=8, classes=10):
    torch.manual_seed(0)
    mods = [nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU())]
    for _ in range(blocks - 1):
        mods.append(nn.Sequential(nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width),
                                  nn.ReLU()))
    mods.append(nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, classes)))
    model = nn.Sequential(*mods)
    x = torch.randn(batch, 3, size, size)
    y = torch.randint(0, classes, (batch,))
    return model, (x,), lambda out: F.cross_entropy(out, y)


MODELS = {"gpt": make_gpt, "cnn": make_cnn}


# --- measuring ----------------------------------------------------------------------------------
def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step(fn, model, loss_fn):
    """One training step, the output held through the backward (`out = model(x);
    loss_fn(out).backward()`, the usual loop, and what fit's budget covers): every method
    runs the same loop; one that dropped `out` first would free the logits before the
    backward."""
    model.zero_grad(set_to_none=True)
    out = fn()
    loss_fn(out).backward()
    del out


def peak_of(fn, model, inputs, loss_fn) -> int:
    model.zero_grad(set_to_none=True)  # before the tracker: it sees only what the step makes
    with MemoryTracker(resident=[model, *inputs]) as mt:
        step(fn, model, loss_fn)
    return mt.peak


def time_of(fn, model, loss_fn, device) -> float:
    sync(device)
    t0 = time.perf_counter()
    step(fn, model, loss_fn)
    sync(device)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--budgets", nargs="+", type=float, default=[90, 75, 60, 50, 40],
                    help="percent of plain execution's predicted peak")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3, help="profiling runs per layer")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    device = torch.device(args.device)
    rows = []
    print(f"device {device}, torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"median of {args.steps} steps; peak: MemoryTracker")
    for name in args.models:
        model, inputs, loss_fn = MODELS[name]()
        model = model.to(device)
        inputs = tuple(x.to(device) for x in inputs)
        n = len(model)
        t0 = time.perf_counter()
        prep = prepare(model, inputs, loss_fn=loss_fn, repeats=args.repeats)
        prof_s = time.perf_counter() - t0
        plain_pred = prep.plain_peak

        def plain_fn():
            return model(*inputs)

        # candidates: plain, checkpoint_sequential at every segment count, schedlang per budget
        cands = {"plain": plain_fn}
        for s in range(1, n + 1):
            cands[f"ckpt{s}"] = (lambda s=s: checkpoint_sequential(model, s, inputs[0],
                                                                   use_reentrant=False))
        fitted = {}
        for pct in args.budgets:
            t0 = time.perf_counter()
            try:
                fm = fit(model, inputs, f"{pct}%", loss_fn=loss_fn, prepared=prep,
                         time_limit=args.time_limit, measure=False)
            except Exception as exc:  # infeasible: reported in the table
                fitted[pct] = (None, str(exc).split(": error: ")[-1][:90], 0.0)
                continue
            fitted[pct] = (fm, "", time.perf_counter() - t0)
            cands[f"sched{pct:g}"] = (lambda fm=fm: fm(*inputs))
        peaks = {k: peak_of(fn, model, inputs, loss_fn) for k, fn in cands.items()}
        times: dict[str, list[float]] = {k: [] for k in cands}
        for fn in cands.values():  # warm-up
            step(fn, model, loss_fn)
        for _ in range(args.steps):
            for k, fn in cands.items():
                times[k].append(time_of(fn, model, loss_fn, device))
        med = {k: statistics.median(v) for k, v in times.items()}
        base_t, base_p = med["plain"], peaks["plain"]
        print(f"\n{name}: {n} layers, plain peak {base_p / 2**20:.2f} MiB measured "
              f"({plain_pred / 2**20:.2f} MiB predicted, resident "
              f"{prep.resident_bytes / 2**20:.2f} MiB), plain step {1000 * base_t:.1f} ms, "
              f"profile {prof_s:.1f} s")
        print(f"{'budget':>8} {'method':>22} {'peak MiB':>9} {'peak/budget':>11} "
              f"{'peak/plain':>10} {'step ms':>8} {'time/plain':>10} {'pred err':>8}")
        print(f"{'-':>8} {'plain':>22} {base_p / 2**20:9.2f} {'':>11} {1:10.2f} "
              f"{1000 * base_t:8.1f} {1:10.2f} {(base_p - plain_pred) / plain_pred:+8.1%}")
        rows.append({"model": name, "budget_pct": None, "method": "plain", "peak": base_p,
                     "time": base_t})
        for pct in args.budgets:
            budget = int(plain_pred * pct / 100)
            ck = [(med[f"ckpt{s}"], s) for s in range(1, n + 1) if peaks[f"ckpt{s}"] <= budget]
            if ck:
                _, s = min(ck)
                label, over = f"ckpt_seq({s} seg)", ""
            else:
                s = min(range(1, n + 1), key=lambda s: peaks[f"ckpt{s}"])
                label, over = f"ckpt_seq({s} seg) OVER", "!"
            k = f"ckpt{s}"
            print(f"{pct:7g}% {label:>22} {peaks[k] / 2**20:9.2f} {peaks[k] / budget:11.2f} "
                  f"{peaks[k] / base_p:10.2f} {1000 * med[k]:8.1f} {med[k] / base_t:10.2f}")
            rows.append({"model": name, "budget_pct": pct, "budget": budget,
                         "method": "checkpoint_sequential", "segments": s, "peak": peaks[k],
                         "time": med[k], "fits": not over})
            fm, why, solve_s = fitted[pct]
            if fm is None:
                print(f"{pct:7g}% {'schedlang':>22}  infeasible: {why}")
                rows.append({"model": name, "budget_pct": pct, "budget": budget,
                             "method": "schedlang", "infeasible": why})
                continue
            k = f"sched{pct:g}"
            pred = fm.memory_report().predicted_peak_bytes
            err = (peaks[k] - pred) / pred
            print(f"{pct:7g}% {'schedlang':>22} {peaks[k] / 2**20:9.2f} {peaks[k] / budget:11.2f} "
                  f"{peaks[k] / base_p:10.2f} {1000 * med[k]:8.1f} {med[k] / base_t:10.2f} "
                  f"{err:+8.1%}")
            rows.append({"model": name, "budget_pct": pct, "budget": budget,
                         "method": "schedlang", "peak": peaks[k], "time": med[k],
                         "predicted": pred, "solve_s": solve_s,
                         "predicted_overhead": fm.memory_report().plan_time_overhead})
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
