"""fit on `transformers` architectures nobody tuned it for, as a new user would call it.

    python bench/bench_architectures.py [--models opt t5 albert ...] [--budgets 60 40]
        [--batch 4 --seq 64 --layers 4 --dim 32] [--no-op-options] [--json OUT]

Each model of `schedlang.testing.hf_architectures.ARCHITECTURES` (tiny random configs, no
download; dropout on; training mode), one intra-op thread. Per model:

* `blocks`: the blocks the hook front end found (and how: a stack, or the module's children);
  `opts/blk`: options per block, the fixed ones and, with `op_options`, the generated ones
  (`frontends/blocks/block_ops.py`: segments and selective-checkpoint policies);
* `plain`: the eager step's measured peak; `hf-gc`: the same step with the model's own
  `gradient_checkpointing_enable()` (on a copy, same weights; `-` where the model does not
  support it); peaks are those of one training step (forward, loss, backward, the output
  held) under `MemoryTracker` (CPU: every live tensor storage), parameters and inputs
  resident, as fit's budget counts them;
* `fit-min` / `fit-min+ops`: the smallest feasible budget `fit` names (`FitError` at a
  budget just above the resident bytes), with the fixed options and with the generated ones too;
* `@gc`: `fit` at hf-gc's measured peak (with generated options): its measured peak, or
  `infeasible` — the issue's "smallest feasible budget <= per-block checkpointing's peak";
* for each `--budgets` percent, with and without `op_options`: `ok` (gradients bit-equal to
  eager with dropout on, measured peak <= budget), `min X%` (FitError naming the smallest
  feasible budget, as a percent of plain execution's predicted peak), or what went wrong;
  `grad err` is the largest absolute gradient difference over all fits (0 is bit-equal);
* `live`: bytes of the model's tensors alive after `del fitted, model` (must be 0).

Figures depend on the machine's load only through the solver's time limits; give `uptime`'s
load with the table.
"""
from __future__ import annotations

import argparse
import copy
import gc
import json
import re
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy  # noqa: E402
import torch  # noqa: E402

from schedlang.pytorch.fit import FitError, fit, prepare  # noqa: E402
from schedlang.pytorch.frontends.blocks.block_ops import is_op_option  # noqa: E402
from schedlang.pytorch.inputs import tensor_leaves  # noqa: E402
from schedlang.pytorch.memory import MemoryTracker  # noqa: E402
from schedlang.testing.hf_architectures import ARCHITECTURES  # noqa: E402
from schedlang.testing.leaks import host_copy, new_bytes, snapshot  # noqa: E402

SMALLEST = re.compile(r"smallest feasible budget found is .*?\((\d+) B\)")
#: the op-level solves' budgets per block (fractions of what it saves; down to 0.05: the
#: least-memory cuts, as bench_baselines.BLOCK_OPTIONS)
GENERATE = {"fractions": (0.7, 0.4, 0.2, 0.1, 0.05), "time_limit": 20}


def _step(module, model, args, kwargs, loss_fn, seed=123):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    numpy.random.seed(seed)  # Wav2Vec2's SpecAugment draws from NumPy in the model's code
    out = module(*args, **kwargs)
    loss_fn(out).backward()
    del out
    return host_copy([p.grad for p in model.parameters()])


def _peak(module, model, args, kwargs, loss_fn) -> int:
    model.zero_grad(set_to_none=True)
    inputs = [t for _, t in tensor_leaves(args, kwargs)]
    with MemoryTracker(resident=[model, *inputs]) as mt:
        _step(module, model, args, kwargs, loss_fn)
    model.zero_grad(set_to_none=True)
    return mt.peak


def _gc_peak(model, args, kwargs, loss_fn):
    """The measured peak with the model's own per-block checkpointing, on a copy."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        return None
    twin = copy.deepcopy(model)
    # transformers 5 renamed gradient_checkpointing_* activation_checkpointing_*
    enable = getattr(twin, "activation_checkpointing_enable", None) or \
        twin.gradient_checkpointing_enable
    enable({"use_reentrant": False})
    try:
        return _peak(twin, twin, args, kwargs, loss_fn)
    finally:
        del twin
        gc.collect()


def _grad_err(ref, got) -> float:
    err = 0.0
    for a, b in zip(ref, got):
        if (a is None) != (b is None):
            return float("inf")
        if a is not None:
            err = max(err, float(abs(a - b).max()) if a.size else 0.0)
    return err


def _crash(exc) -> str:
    traceback.print_exc()  # where it broke, on stderr; the table gets the first line
    return f"crash: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:80]}"


def _smallest(model, args, kwargs, loss_fn, prep) -> int | None:
    try:
        # just above what is resident (parameters, inputs): FitError names the smallest
        fm = fit(model, args, prep.resident_bytes + 1024, loss_fn=loss_fn, prepared=prep,
                 sample_kwargs=kwargs, progress=False)
    except FitError as exc:
        found = SMALLEST.search(str(exc))
        return int(found.group(1)) if found else None
    except Exception as exc:  # noqa: BLE001
        return _crash(exc)
    fm.unwrap()
    return fm.memory_report().budget_bytes


def _fit_row(model, args, kwargs, loss_fn, prep, budget, ref) -> tuple[str, float, int | None]:
    """(status, gradient error, measured peak) of one fit at `budget`."""
    try:
        fm = fit(model, args, budget, loss_fn=loss_fn, prepared=prep, sample_kwargs=kwargs,
                 progress=False)
    except FitError as exc:
        found = SMALLEST.search(str(exc))
        if not found:
            return f"FitError: {str(exc).splitlines()[0][:60]}", 0.0, None
        return f"min {100 * int(found.group(1)) / prep.plain_peak:.0f}%", 0.0, None
    except Exception as exc:  # noqa: BLE001 - the survey reports what a user would meet
        return _crash(exc), 0.0, None
    try:
        got = _step(fm, model, args, kwargs, loss_fn)
    except Exception as exc:  # noqa: BLE001
        fm.unwrap()
        return "step " + _crash(exc), 0.0, None
    rep = fm.memory_report()
    fm.unwrap()
    err = _grad_err(ref, got)
    over = rep.measured_peak_bytes > rep.budget_bytes
    status = "ok" if err == 0 and not over else \
        ("grads differ" if err else "") + (" over budget" if over else "")
    return status.strip(), err, rep.measured_peak_bytes


def survey(name, sizes, budgets, op_options=True) -> dict:
    before = snapshot()
    row: dict = {"model": name}
    t0 = time.perf_counter()
    model, args, kwargs, loss_fn = ARCHITECTURES[name](**sizes)
    ref = _step(model, model, args, kwargs, loss_fn)
    row["plain"] = _peak(model, model, args, kwargs, loss_fn)
    row["hf_gc"] = _gc_peak(model, args, kwargs, loss_fn)
    try:
        preps = {"fixed": prepare(model, args, loss_fn=loss_fn, sample_kwargs=kwargs,
                                  repeats=1)}
        if op_options:
            preps["ops"] = prepare(model, args, loss_fn=loss_fn, sample_kwargs=kwargs,
                                   repeats=1, block_options=GENERATE)
    except Exception as exc:  # noqa: BLE001 - the survey reports what a user would meet
        row["status"] = "prepare " + _crash(exc)
        row["seconds"] = time.perf_counter() - t0
        return row
    last = preps.get("ops", preps["fixed"])
    found = last.partitioned.found
    row["frontend"] = last.frontend
    row["blocks"] = f"{len(found.blocks)} ({found.mode})"
    layers = [lay for lay in last.graph.layers if lay.name in {b.name for b in found.blocks}]
    fixed = [sum(1 for o in lay.options if not is_op_option(o.name)) for lay in layers]
    gen = [sum(1 for o in lay.options if is_op_option(o.name)) for lay in layers]
    row["options"] = f"{max(fixed, default=0)}+{max(gen, default=0)}"
    row["plain_pred"] = preps["fixed"].plain_peak
    errs, statuses = [0.0], []
    for kind, prep in preps.items():
        row[f"min_{kind}"] = _smallest(model, args, kwargs, loss_fn, prep)
        for pct in budgets:
            status, err, peak = _fit_row(model, args, kwargs, loss_fn, prep, f"{pct}%", ref)
            row[f"{kind}_{pct}"] = status
            errs.append(err)
            statuses.append(status)
    if row["hf_gc"] is not None:
        status, err, peak = _fit_row(model, args, kwargs, loss_fn, last, row["hf_gc"], ref)
        row["at_gc"] = peak if status == "ok" else status
        errs.append(err)
        statuses.append(status)
    row["grad_err"] = max(errs)
    bad = [s for s in statuses if s != "ok" and not s.startswith("min ")]
    row["status"] = "; ".join(dict.fromkeys(bad)) or "ok"
    del preps, prep, last, found, layers, model, args, kwargs, loss_fn
    row["live"] = new_bytes(before)
    if row["live"]:
        row["status"] = (row["status"] + "; " if row["status"] != "ok" else "") + "leak"
    row["seconds"] = time.perf_counter() - t0
    return row


def _kib(b) -> str:
    return "-" if b is None else (b if isinstance(b, str) else f"{b / 1024:.0f}")


def table(rows, budgets) -> list[str]:
    cols = ["model", "blocks", "opts/blk", "plain", "hf-gc", "fit-min", "fit-min+ops", "@gc"]
    cols += [f"{p}%" for p in budgets] + [f"{p}%+ops" for p in budgets]
    cols += ["grad err", "live B", "status"]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        if "blocks" not in r:
            out.append(f"| {r['model']} | " + " | ".join(["-"] * (len(cols) - 2))
                       + f" | {r['status']} |")
            continue
        cells = [r["model"], r["blocks"], r["options"], _kib(r["plain"]), _kib(r["hf_gc"]),
                 _kib(r.get("min_fixed")), _kib(r.get("min_ops")), _kib(r.get("at_gc"))]
        cells += [r.get(f"fixed_{p}", "-") for p in budgets]
        cells += [r.get(f"ops_{p}", "-") for p in budgets]
        cells += [f"{r['grad_err']:.1e}" if r["grad_err"] else "0", str(r.get("live", "-")),
                  r["status"]]
        out.append("| " + " | ".join(str(c) for c in cells) + " |")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(ARCHITECTURES),
                    choices=list(ARCHITECTURES))
    ap.add_argument("--budgets", nargs="+", type=int, default=[60, 40])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--no-op-options", action="store_true")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    sizes = {"batch": args.batch, "seq": args.seq, "layers": args.layers, "dim": args.dim}
    print(f"torch {torch.__version__}, 1 thread; sizes {sizes}; peaks in KiB", flush=True)
    rows = []
    for name in args.models:
        row = survey(name, sizes, args.budgets, not args.no_op_options)
        rows.append(row)
        print(f"{name}: {row['status']} ({row.get('seconds', 0):.0f} s)", file=sys.stderr,
              flush=True)
    print("\n".join(table(rows, args.budgets)))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str))
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
