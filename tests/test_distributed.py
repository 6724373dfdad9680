"""`fit` under torch.distributed (gloo, 2 CPU processes on localhost).

`fit` then `DistributedDataParallel`: the gradients after one step (all-reduced) equal those of
the same DDP run without a plan, the per-rank measured peak is within the budget, and every
rank executes rank 0's plan (`schedlang.pytorch.distributed`). A GPT-like model with dropout
(small: always; larger: slow) and a U-Net (skip connections: slow), at 100%, 60% and 40%.
Plus the plan agreement's failure mode (ranks with different models) and the FSDP2 memory
accounting on graph data (no process group needed).
"""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

WORLD = 2
ROOT_EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
BUDGETS = [100, 60, 40]
CASES = {
    # activations outweigh parameters, so that 40% is within reach
    "gpt_small": ("gpt", dict(batch=8, context=32, dim=16, heads=2, layers=3, vocab=32)),
    "gpt": ("gpt", dict(batch=4, context=64, dim=16, heads=2, layers=4, vocab=32)),
    "unet": ("unet", dict(batch=2, size=32, base=8)),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init(rank: int, port: int) -> None:
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)


def _ddp_worker(rank: int, port: int, case: str, budgets: list, out: str) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    from schedlang.pytorch.distributed import plan_digest
    from schedlang.pytorch.fit import FitError, fit

    from .torch_models import ALL

    _init(rank, port)
    try:
        name, sizes = CASES[case]
        rows = []
        for pct in budgets:
            model, sample, loss_fn = ALL[name](**sizes)  # the same weights on every rank
            plain, _, _ = ALL[name](**sizes)
            _, step_inputs, _ = ALL[name](**sizes, seed=11 + rank)  # each rank its own batch
            row = {"rank": rank, "budget_percent": pct}
            try:
                fitted = fit(model, sample, budget=f"{pct}%", loss_fn=loss_fn, repeats=1)
            except FitError as exc:
                row["error"] = str(exc)
                rows.append(row)
                continue
            ddp, ref = DDP(fitted), DDP(plain)
            for m, seed in ((ddp, 100 + rank), (ref, 100 + rank)):
                torch.manual_seed(seed)  # the same dropout masks in both runs
                loss_fn(m(*[x.detach() for x in step_inputs])).backward()
            diffs = [float((p.grad - q.grad).abs().max())
                     for p, q in zip(model.parameters(), plain.parameters())]
            rep = fitted.memory_report()
            row.update(budget=rep.budget_bytes, predicted=rep.predicted_peak_bytes,
                       measured=rep.measured_peak_bytes, plain=fitted.plain,
                       digest=plan_digest(fitted.plan), max_grad_diff=max(diffs),
                       missing=sum(p.grad is None for p in model.parameters()))
            rows.append(row)
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump(rows, f)
    finally:
        dist.destroy_process_group()


def _spawn(fn, *args):
    import torch.multiprocessing as mp

    mp.spawn(fn, args=(_free_port(), *args), nprocs=WORLD, join=True)


def _check_ddp(case: str, tmp_path) -> list:
    _spawn(_ddp_worker, case, BUDGETS, str(tmp_path))
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    for rows in zip(*ranks):
        pct = rows[0]["budget_percent"]
        if "error" in rows[0]:
            # only the tightest budget may be out of reach, and then on every rank alike
            assert pct == min(BUDGETS), rows[0]["error"]
            assert all(r.get("error") == rows[0]["error"] for r in rows)
            continue
        assert len({r["digest"] for r in rows}) == 1, "the ranks execute different plans"
        for r in rows:
            assert r["missing"] == 0
            assert r["max_grad_diff"] == 0.0, r  # all-reduced gradients equal plain DDP's
            assert r["measured"] <= r["budget"], r  # the budget is per rank
        assert rows[0]["plain"] == (pct == 100)
    return ranks


def test_fit_then_ddp_small_gpt(tmp_path):
    _check_ddp("gpt_small", tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["gpt", "unet"])
def test_fit_then_ddp(case, tmp_path):
    _check_ddp(case, tmp_path)


def _agreement_worker(rank: int, port: int, out: str) -> None:
    from schedlang.problem import load, run_named_planner
    from schedlang.pytorch.distributed import DistributedPlanError, agree_plan, plan_digest
    from schedlang.pytorch.fit import fit

    from .torch_models import ALL

    _init(rank, port)
    try:
        result = {}
        # ranks that solved differently: every rank gets rank 0's plan
        g = load(str(ROOT_EXAMPLES / "transformer12.sched")).graph
        mine = run_named_planner("no_recompute" if rank == 0 else "recompute_all", g, None)
        result["before"] = plan_digest(mine)
        result["after"] = plan_digest(agree_plan(mine, g))
        # ranks with different models: a clear error on every rank, no hang
        model, sample, loss_fn = ALL["mlp"](batch=64, width=16 + 8 * rank)
        try:
            fit(model, sample, budget="60%", loss_fn=loss_fn, repeats=1)
            result["error"] = ""
        except DistributedPlanError as exc:
            result["error"] = str(exc)
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
    finally:
        dist.destroy_process_group()


# slow: once in three fresh-clone runs a rank ended with SIGABRT ("terminate called without an
# active exception") after writing its result, at process exit: not understood yet
@pytest.mark.slow
def test_one_plan_on_every_rank_or_a_clear_error(tmp_path):
    _spawn(_agreement_worker, str(tmp_path))
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert got[0]["before"] != got[1]["before"]  # the ranks' own plans differ
    assert got[0]["after"] == got[1]["after"] == got[0]["before"]  # rank 0's, everywhere
    for r in got:
        assert "the ranks traced different graphs" in r["error"] and "ranks [0]" in r["error"]


# ---------------------------------------------------------------------- FSDP2 accounting
def _layered():
    from schedlang.problem import load

    return load("examples/transformer12.sched").graph


def test_fsdp_accounting_on_graph_data():
    """What FSDP2 adds per layer: the unsharded parameters while the layer runs (forward, and
    backward when resharded after the forward), the full gradients until the reduce-scatter;
    the shards are what stays."""
    from schedlang.pytorch.distributed import fsdp_layer_memory, with_fsdp_memory
    from schedlang.simulate import simulate
    from schedlang.planners.no_recompute import no_recompute_plan

    g = _layered()
    params = {lay.name: 4_000_000 for lay in g.layers}
    for world in (1, 2, 3, 8):
        rows = fsdp_layer_memory(g, world, params)
        for x in rows:
            assert x.shard_params * world >= x.full_params > (x.shard_params - 1) * world
            assert x.fwd_extra == x.full_params - x.shard_params
            assert x.bwd_extra == x.full_params - x.shard_params + x.full_grads
        if world == 1:
            assert all(x.fwd_extra == 0 and x.bwd_extra == x.full_grads for x in rows)
    rows = fsdp_layer_memory(g, 2, params, reshard_after_forward=False)
    assert all(x.bwd_extra == x.full_grads for x in rows)

    # on the graph: the no-recomputation peak grows by at most one layer's extras
    base = simulate(no_recompute_plan(g), g).peak_bytes
    for reshard in (True, False):
        rows = fsdp_layer_memory(g, 2, params, reshard_after_forward=reshard)
        g2 = with_fsdp_memory(g, rows, reshard_after_forward=reshard)
        peak = simulate(no_recompute_plan(g2), g2).peak_bytes
        most = max(max(x.fwd_extra, x.bwd_extra) for x in rows)
        kept = 0 if reshard else sum(x.full_params - x.shard_params for x in rows)
        assert base < peak <= base + most + kept


def test_fsdp_accounting_reads_param_bytes_off_traced_graphs():
    from schedlang.pytorch.distributed import fsdp_layer_memory, param_bytes_of, with_fsdp_memory
    from schedlang.pytorch.trace import trace

    from .torch_models import ALL

    model, sample, _ = ALL["gpt"](batch=2, context=16, dim=32, heads=4, layers=2, vocab=64)
    g = trace(model, sample, repeats=1)
    pb = param_bytes_of(g)
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    assert 0 < sum(pb.values()) <= total
    rows = fsdp_layer_memory(g, 2)
    assert [x.full_params for x in rows] == [pb[lay.name] for lay in g.layers]
    g2 = with_fsdp_memory(g, rows)
    sizes = {d.name: d.size for d in g2.data}
    for x in rows:
        if x.full_params:
            assert sizes[f"{x.layer}.params.grad"] == x.shard_grads
