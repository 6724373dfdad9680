"""How the hook front end chooses its blocks (`schedlang.pytorch.frontends.blocks.find.candidate_blocks`).

A plain `nn.Sequential` whose children are composite modules is split into them (each child a
block of its own: recomputing one holds only its own internals in its backward), recursively;
one of leaf layers (convolutions, activations) stays one block (leaf blocks could only keep
every intermediate tensor); an FSDP unit (`whole=`) is never split.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")  # test_real_models' helpers import it
torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[2]


from schedlang.testing.torch_models import make_stages  # noqa: E402

from .test_real_models import _fit_at, _plain  # noqa: E402


def test_sequentials_of_composite_modules_are_split():
    from schedlang.pytorch.frontends.blocks.find import candidate_blocks, find_blocks

    model, args, _, _ = make_stages()
    mode, names, _ = candidate_blocks(model)
    assert mode == "children"
    assert names == ["stem", "stage1.0", "stage1.1", "stage2.0", "stage2.1", "head"]
    # an FSDP unit stays whole
    found = find_blocks(model, args, whole=["stage1"])
    assert [b.name for b in found.blocks] == ["stem", "stage1", "stage2.0", "stage2.1", "head"]
    # a Sequential of leaf layers (the U-Net's double convolutions) stays one block
    unet, _, _, _ = _plain("unet")(batch=2, size=32, base=8)
    assert candidate_blocks(unet)[1] == ["enc1", "enc2", "bottleneck", "up2", "dec2", "up1",
                                         "dec1", "out"]


def test_split_stages_reach_a_budget_whole_stages_cannot():
    """At 83% of plain execution's peak the per-residual-block plan fits (gradients bit for
    bit, measured peak within the budget); with the stages as blocks (`layers=`) the smallest
    feasible budget is above it (78% and 88% when written)."""
    from schedlang.pytorch.fit import FitError, fit

    _, rows = _fit_at(make_stages, {}, [83], with_loss_fn=True, frontend="blocks")
    (_, rep), = rows
    assert not isinstance(rep, int) and not rep.plain, rows
    model, args, _, loss_fn = make_stages()
    with pytest.raises(FitError, match="smallest feasible budget"):
        fit(model, args, "83%", loss_fn=loss_fn, frontend="blocks", repeats=1,
            layers=["stem", "stage1", "stage2", "head"])


def test_an_fsdp_unit_is_not_split(tmp_path):
    """`fully_shard` on the stages (one process, gloo): fit keeps each unit one block;
    `fit(..., fsdp=True)` shards the blocks it chooses, the residual blocks. In a child
    process: torch's DTensor caches keep the device meshes (and their mesh tensors) for the
    process, memory every later measured step in this one would count."""
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is needed")
    code = (f"from tests.pytorch.test_block_choice import check_fsdp_units; "
            f"check_fsdp_units({str(tmp_path)!r})")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]


def check_fsdp_units(folder: str) -> None:
    """The body of `test_an_fsdp_unit_is_not_split`, run in its child process."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule, fully_shard

    from schedlang.pytorch.fit import fit

    dist.init_process_group("gloo", init_method=f"file://{Path(folder) / 'store'}", rank=0,
                            world_size=1)
    try:
        model, args, _, loss_fn = make_stages()
        fully_shard(model.stage1)
        fully_shard(model.stage2)
        fully_shard(model)
        fm = fit(model, args, "100%", loss_fn=loss_fn, repeats=1)
        assert [b.name for b in fm._prep.partitioned.found.blocks] == [
            "stem", "stage1", "stage2", "head"]
        model, args, _, loss_fn = make_stages()
        fm = fit(model, args, "95%", loss_fn=loss_fn, repeats=1, fsdp=True)
        names = [b.name for b in fm._prep.partitioned.found.blocks]
        assert names == ["stem", "stage1.0", "stage1.1", "stage2.0", "stage2.1", "head"]
        assert all(isinstance(model.get_submodule(n), FSDPModule) for n in names)
        loss_fn(fm(*args)).backward()
        rep = fm.memory_report()
        assert rep.measured_peak_bytes <= rep.budget_bytes
    finally:
        dist.destroy_process_group()
