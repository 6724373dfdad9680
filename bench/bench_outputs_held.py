"""The loop that holds the model's output against the one that releases it (issue 25, item 5).

    python bench/bench_outputs_held.py [--models gpt-wide gpt2 llama] [--budget 55]

For each model: the output's bytes; plain execution's predicted peak and the smallest feasible
budget (bisection with the solver, to 0.2%) of `fit(outputs_held=True)` (``out = model(x);
loss_fn(out).backward()``) and of `fit(outputs_held=False)` (``loss_fn(model(x)).backward()``),
and their differences; then one fit of each at `--budget` percent of its own plain peak, its
first step run in its own loop: predicted and measured peak (CPU tracker).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from schedlang.testing.hf_models import HF  # noqa: E402
from schedlang.testing.steps import measured_step  # noqa: E402
from schedlang.testing.torch_models import ALL  # noqa: E402

#: the fx GPT with a vocabulary of 1,024 (1 MiB of logits), GPT-2 and Llama (hook front end)
MODELS = ("gpt-wide", "gpt2", "llama")


def _make(name):
    if name == "gpt-wide":
        model, args, loss_fn = ALL["gpt"](batch=4, context=64, dim=32, heads=4, layers=6,
                                           vocab=1024)
        return model, args, {}, loss_fn
    return HF[name](batch=4, seq=64)


def main() -> int:
    from schedlang.pytorch.fit import fit, prepare
    from schedlang.pytorch.planning import smallest_feasible, solve_extra

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--budget", type=float, default=55)
    a = ap.parse_args()
    torch.set_num_threads(1)
    print(f"{'model':<10}{'loop':<10}{'output B':>10}{'plain B':>11}{'smallest B':>12}"
          f"{'budget B':>11}{'predicted':>11}{'measured':>11}")
    for name in a.models:
        model, args, kwargs, loss_fn = _make(name)
        got = {}
        for held in (True, False):
            prep = prepare(model, args, loss_fn=loss_fn, sample_kwargs=kwargs, repeats=1,
                           outputs_held=held)
            low = prep.plain_peak // 10
            act = smallest_feasible(prep.graph, low, prep.plain_peak, "highs", 60, rel=0.002,
                                    max_solves=16, **solve_extra(prep))
            smallest = None if act is None else act + prep.resident_bytes
            fm = fit(model, args, f"{a.budget}%", loss_fn=loss_fn, sample_kwargs=kwargs,
                     prepared=prep, calibrate=False)
            rep = measured_step(fm, model, args, kwargs, loss_fn, held)
            fm.unwrap()
            got[held] = (prep.plain_peak, smallest)
            print(f"{name:<10}{'held' if held else 'released':<10}{prep.output_bytes:>10}"
                  f"{prep.plain_peak:>11}{smallest or '-':>12}{rep.budget_bytes:>11}"
                  f"{rep.predicted_peak_bytes:>11}{rep.measured_peak_bytes:>11}", flush=True)
        (p1, s1), (p0, s0) = got[True], got[False]
        print(f"{name:<10}{'held - released':<20} plain {p1 - p0} B, smallest feasible "
              f"{'-' if s1 is None or s0 is None else s1 - s0} B")
    return 0


if __name__ == "__main__":
    sys.exit(main())
