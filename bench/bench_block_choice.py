"""The hook front end's block choice and the lowest budget its per-block plans reach.

    python bench/bench_block_choice.py

For each model, `fit(..., frontend="blocks")` is asked for a budget below reach and the
smallest feasible budget its `FitError` names (bisection with the solver) is printed as a
share of plain execution's predicted peak, with and without `loss_fn`, for:

* `auto`: the automatic choice (`schedlang.pytorch.frontends.blocks.find.candidate_blocks`);
* `coarse`: the root's direct children (`layers=[...]`: what the choice was before plain
  Sequentials of composite modules were split);
* `leaves`: every Sequential split down to its leaf layers (`layers=[...]`).

Models: the U-Net-like CNN of `schedlang/testing/torch_models.py` (its blocks are Sequentials of leaf
layers: `auto` == `coarse`) and the two-stage residual CNN of `tests/pytorch/test_block_choice.py`
(stages are Sequentials of residual blocks: `auto` splits them). Memory figures only (no
timing): they do not depend on the machine's load.
"""
from __future__ import annotations

import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402
from torch import nn  # noqa: E402

SMALLEST = re.compile(r"smallest feasible budget found is .*?\((\d+) B\)")


def _leaves(model: nn.Module) -> list[str]:
    out = []

    def walk(mod, prefix):
        for n, c in mod.named_children():
            q = prefix + n
            if isinstance(c, nn.Sequential):
                walk(c, q + ".")
            else:
                out.append(q)
    walk(model, "")
    return out


def _models():
    from schedlang.testing.torch_models import make_stages, make_unet

    def unet():
        model, args, loss_fn = make_unet(batch=2, size=32, base=8)
        return model, args, loss_fn

    def stages():
        model, args, _, loss_fn = make_stages()
        return model, args, loss_fn

    return {"unet": unet, "stages": stages}


def smallest(make, layers, with_loss_fn: bool) -> tuple[float, list[str]]:
    from schedlang.pytorch.fit import FitError, fit, prepare

    model, args, loss_fn = make()
    given = loss_fn if with_loss_fn else None
    prep = prepare(model, args, layers=layers, loss_fn=given, frontend="blocks", repeats=1)
    blocks = [b.name for b in prep.partitioned.found.blocks]
    low = (prep.resident_bytes + 4096) / prep.plain_peak  # just above the resident memory
    try:
        fit(model, args, f"{100 * low:.2f}%", loss_fn=given, prepared=prep)
    except FitError as exc:
        found = SMALLEST.search(str(exc))
        if found:
            return int(found.group(1)) / prep.plain_peak, blocks
        raise
    return low, blocks


def main() -> None:
    torch.set_num_threads(1)
    print("| model | blocks | with loss_fn | without | blocks chosen |")
    print("|---|---|---|---|---|")
    for name, make in _models().items():
        model = make()[0]
        choices = {"auto": None, "coarse": [n for n, _ in model.named_children()],
                   "leaves": _leaves(model)}
        for how, layers in choices.items():
            a, blocks = smallest(make, layers, True)
            b, _ = smallest(make, layers, False)
            print(f"| {name} | {how} | {100 * a:.1f}% | {100 * b:.1f}% | {len(blocks)}: "
                  f"{', '.join(blocks[:6])}{' ...' if len(blocks) > 6 else ''} |", flush=True)


if __name__ == "__main__":
    main()
