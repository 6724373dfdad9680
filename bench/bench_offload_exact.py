"""Offload plans' first measured step against their prediction (issue 25, item 6).

    python bench/bench_offload_exact.py [--models gpt unet llama ...] [--budgets 60 50]
                                        [--repeats 5] [--bandwidth 16GB/s] [--json OUT]

For every model of the test suite (`schedlang/testing/torch_models.py`, `schedlang/testing/hf_models.py`) and each
budget (percent of plain execution's peak), `--repeats` independent fits — each a fresh model
and a fresh profile, so that timer noise can change the plan — with a host link of
`--bandwidth`, and the first training step of each in the loop `fit` plans for (the output
held through the backward; `--outputs-dropped`: `loss_fn(model(x)).backward()` and
`fit(..., outputs_held=False)`). Per row: budget, predicted and measured peak (CPU: the
tracker of live tensor storages; CUDA: `max_memory_allocated`), their difference, whether
the plan offloads, the spread of the measured peaks over the repeats. A row is within when
measured <= budget and |measured - predicted| <= 1% of the prediction.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from schedlang.testing.hf_models import HF  # noqa: E402
from schedlang.testing.steps import measured_step  # noqa: E402
from schedlang.testing.torch_models import ALL  # noqa: E402

#: the sizes of the test suite's models where activations outweigh parameters
SIZES = {"mlp": dict(batch=512, width=64, depth=12), "dropout_mlp": dict(batch=512),
         "gpt": dict(batch=4, context=64, dim=32, heads=4, layers=6, vocab=128),
         "unet": dict(batch=2, size=32, base=8),
         "llama": dict(batch=4, seq=64), "gpt2": dict(batch=4, seq=64),
         "bert": dict(batch=4, seq=64), "bart": dict(batch=2, seq=64),
         "vit": dict(batch=4, size=64), "resnet": dict(batch=8, size=64),
         "convnext": dict(batch=4, size=64)}


def make(name: str):
    """(model, args, kwargs, loss_fn) of a test model."""
    if name in HF:
        return HF[name](**SIZES[name])
    model, args, loss_fn = ALL[name](**SIZES[name])
    return model, args, {}, loss_fn


def first_step(name: str, pct: int, bandwidth, outputs_held: bool, device: str,
               repeats: int = 1) -> dict:
    from schedlang.pytorch.fit import FitError, fit

    model, args, kwargs, loss_fn = make(name)
    model = model.to(device)
    args = tuple(a.to(device) for a in args)
    kwargs = {k: v.to(device) for k, v in kwargs.items()}
    row = {"model": name, "budget_pct": pct}
    t0 = time.perf_counter()
    try:
        extra = {} if outputs_held else {"outputs_held": False}
        fm = fit(model, args, f"{pct}%", loss_fn=loss_fn, sample_kwargs=kwargs,
                 bandwidth=bandwidth, repeats=repeats, **extra)
    except FitError as exc:
        row["error"] = str(exc)
        found = re.search(r"smallest feasible budget found is .*?\((\d+) B\)", str(exc))
        plain = re.search(r"plain execution needs ([\d.]+ \w+)", str(exc))
        row["smallest"] = int(found.group(1)) if found else None
        row["plain_text"] = plain.group(1) if plain else None
        return row
    row["fit_s"] = time.perf_counter() - t0
    rep = measured_step(fm, model, args, kwargs, loss_fn, outputs_held)
    plan = fm.plan
    row.update(budget=rep.budget_bytes, predicted=rep.predicted_peak_bytes,
               measured=rep.measured_peak_bytes, plain=rep.plain, frontend=rep.extra["frontend"],
               offloads=0 if plan is None else sum(
                   op.op == "offload" or op.op == "compute" and op.option == "offload"
                   for op in plan.ops),
               planner=None if plan is None else plan.meta.get("planner"))
    row["diff"] = row["measured"] - row["predicted"]
    row["within"] = (row["measured"] <= row["budget"]
                     and abs(row["diff"]) <= 0.01 * row["predicted"])
    fm.unwrap()
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(SIZES))
    ap.add_argument("--budgets", nargs="+", type=int, default=[60, 50])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--bandwidth", default="16GB/s")
    ap.add_argument("--outputs-dropped", action="store_true")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--profile-repeats", type=int, default=1,
                    help="profiling runs per layer (fit's repeats=; 1: more timer noise, so "
                    "more plans vary between fits)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--sizes", default=None, help="JSON of factory keyword arguments per model")
    a = ap.parse_args()
    if a.sizes:
        SIZES.update(json.loads(a.sizes))
    torch.set_num_threads(a.threads)
    rows = []
    print(f"{'model':<12}{'budget':>7}{'rep':>4}{'front':>7}{'budget B':>12}{'predicted':>12}"
          f"{'measured':>12}{'diff':>10}{'off':>5}  within")
    for name in a.models:
        for pct in a.budgets:
            for rep in range(a.repeats):
                row = first_step(name, pct, a.bandwidth, not a.outputs_dropped, a.device,
                                 a.profile_repeats)
                row["repeat"] = rep
                rows.append(row)
                if "error" in row:
                    print(f"{name:<12}{pct:>6}%{rep:>4}  no plan: the smallest feasible budget "
                          f"found is {row['smallest']} B (plain execution: "
                          f"{row['plain_text']})", flush=True)
                    continue
                print(f"{name:<12}{pct:>6}%{rep:>4}{row['frontend']:>7}{row['budget']:>12}"
                      f"{row['predicted']:>12}{row['measured']:>12}{row['diff']:>10}"
                      f"{row['offloads']:>5}  {'yes' if row['within'] else 'NO'}", flush=True)
    print("\nper model and budget: repeats within / fitted, measured spread (max - min), "
          "largest |measured - predicted| / predicted")
    for name in a.models:
        for pct in a.budgets:
            got = [r for r in rows if r["model"] == name and r["budget_pct"] == pct
                   and "error" not in r]
            if not got:
                print(f"{name:<12}{pct:>6}%  no fit")
                continue
            spread = max(r["measured"] for r in got) - min(r["measured"] for r in got)
            worst = max(abs(r["diff"]) / r["predicted"] for r in got)
            print(f"{name:<12}{pct:>6}%  {sum(r['within'] for r in got)}/{len(got)}  spread "
                  f"{spread} B  worst {100 * worst:.3f}%  offloading plans "
                  f"{sum(r['offloads'] > 0 for r in got)}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0 if all(r.get("within", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
