"""What `fit` leaves alive: live tensor bytes after `fit` returns and after `del fitted, model`.

    python bench/bench_leaks.py [--models llama gpt2 ... gpt2-issue] [--budgets 60% 80%]
                                [--op-options [--op-fractions 0.4 ...]] [--json OUT]

Per model (the `transformers` configs of `schedlang/testing/hf_models.py`, hook front end; the fx models of
`schedlang/testing/torch_models.py`; `gpt2-issue`: issue 25's 4-layer GPT-2, n_embd 128, batch 8 x 128):
every live CPU tensor storage is counted with `schedlang.pytorch.live.live_storages` (the
collector's objects, their gradients and the tensors their autograd graphs saved) before the
model is built, after it is built (the model and the user's inputs), after `fit` returns and
after `del fitted, model`. Columns: fit's plain peak (its prediction of plain execution), the
bytes alive after `fit` beyond the model and the inputs, as bytes and as a share of the plain
peak (target: <= 1%), and the bytes alive after `del` beyond the inputs (target: 0). The first
budget of `--budgets` that `fit` meets is used (one plan per model; a FitError tries the next).
`--op-options`: `fit(..., op_options=True)`, the generated options too (the hook front end's
block options: `schedlang/pytorch/frontends/blocks/block_ops.py`; the fx front end's layer
options), whose registry and caches must keep nothing of the model either; `--op-fractions`:
the op-level solves' budget series (`op_options={"fractions": ...}`; default: fit's, many
solves per distinct block).
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

MODELS = ["llama", "gpt2", "bert", "bart", "vit", "mlp", "dropout_mlp", "gpt", "unet",
          "gpt2-issue"]


def make(name):
    """(model, fit's sample inputs, loss_fn)."""
    from schedlang.testing import hf_models, torch_models

    if name == "gpt2-issue":
        import torch.nn.functional as F
        import transformers

        torch.manual_seed(0)
        cfg = transformers.GPT2Config(vocab_size=128, n_positions=128, n_embd=128, n_layer=4,
                                      n_head=4, use_cache=False)
        model = transformers.GPT2LMHeadModel(cfg).train()
        ids = torch.randint(0, 128, (8, 128))

        def loss_fn(out):
            return F.cross_entropy(out.logits[:, :-1].reshape(-1, 128), ids[:, 1:].reshape(-1))

        return model, (ids,), loss_fn
    if name in hf_models.HF:
        model, args, kwargs, loss_fn = hf_models.HF[name]()
        return model, (kwargs if kwargs else args), loss_fn
    model, args, loss_fn = torch_models.ALL[name]()
    return model, args, loss_fn


def storages(exclude=()):
    from schedlang.pytorch.live import live_storages

    gc.collect()
    skip = set(exclude)
    return {k: s.nbytes() for k, s in live_storages().items() if k not in skip}


def measure(name: str, budgets: list[str], op_options="auto") -> dict:
    from schedlang.pytorch.fit import FitError, fit

    before = storages()
    model, inputs, loss_fn = make(name)
    built = storages(before)  # the model and the user's inputs (the loss's targets included)
    own = {p.untyped_storage().data_ptr() for p in [*model.parameters(), *model.buffers()]}
    inputs_only = {k for k in built if k not in own}
    row = {"model": name}
    fm = None
    for budget in budgets:
        try:
            fm = fit(model, inputs, budget=budget, loss_fn=loss_fn, op_options=op_options)
        except FitError:
            continue
        row["budget"] = budget
        break
    if fm is None:
        row["error"] = f"no plan at {', '.join(budgets)}"
        return row
    report = fm.memory_report()
    row.update(frontend=fm.frontend, plain_peak=report.plain_peak_bytes,
               plain=report.plain, resident=sum(built.values()))
    after_fit = storages(set(before) | set(built))
    row["after_fit"] = sum(after_fit.values())
    row["after_fit_share"] = row["after_fit"] / report.plain_peak_bytes
    del fm, model, report
    row["after_del"] = sum(storages(set(before) | inputs_only).values())
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=MODELS)
    ap.add_argument("--budgets", nargs="+", default=["60%", "80%"])
    ap.add_argument("--op-options", action="store_true",
                    help="fit(..., op_options=True): generated options too")
    ap.add_argument("--op-fractions", nargs="+", type=float,
                    help="with --op-options: the op-level solves' budget series")
    ap.add_argument("--json")
    a = ap.parse_args()
    op_options: object = "auto"
    if a.op_options:
        op_options = {"fractions": tuple(a.op_fractions)} if a.op_fractions else True
    torch.set_num_threads(1)
    rows = []
    print(f"{'model':<12} {'front end':<9} {'budget':>6} {'plain peak':>12} "
          f"{'after fit':>12} {'share':>8} {'after del':>10}")
    for name in a.models:
        r = measure(name, a.budgets, op_options=op_options)
        rows.append(r)
        if "error" in r:
            print(f"{name:<12} {r['error']}")
            continue
        print(f"{name:<12} {r['frontend']:<9} {r['budget']:>6} {r['plain_peak']:>12,} "
              f"{r['after_fit']:>12,} {100 * r['after_fit_share']:>7.2f}% {r['after_del']:>10,}",
              flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
