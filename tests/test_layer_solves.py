"""The hierarchy's op-level sub-solves as parallel jobs (schedlang.layer_solves): the same
solutions, in the same order, as the one-after-the-other loop; the opt-in on-disk cache keyed
by the layer's structure and the option model's text."""
from __future__ import annotations

from pathlib import Path

import pytest

import schedlang

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

from schedlang.layer_solves import cache_path, solve_series  # noqa: E402
from schedlang.testing.torch_models import ALL  # noqa: E402

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
FEW = (0.6, 0.3)  # budgets of an op-level series where the test is about the cache, not the cuts


@pytest.fixture(scope="module")
def block_graph():
    from schedlang.pytorch.opgraph import record_ops

    model, _, _ = ALL["gpt"](batch=2, context=16, layers=1)
    og = record_ops(model.blocks[0], (torch.randn(2, 16, 32),), repeats=1)
    return og, og.checkmate("block", loss=False)


def test_parallel_sub_solves_give_the_serial_solutions(block_graph):
    og, g = block_graph
    total = og.saved_total
    # a series that becomes infeasible in the middle: what follows is not used, as serially
    series = [[{"peak": total + 4096}, {"peak": int(0.6 * total)}, {"peak": 1024},
               {"peak": int(0.7 * total)}],
              [{"peak": 1 << 50, "save": int(0.5 * total)}]]
    serial = solve_series(g, series, "layer_options", time_limit=60, jobs=1)
    parallel = solve_series(g, series, "layer_options", time_limit=60, jobs=2)
    assert parallel == serial
    assert len(serial) >= 2  # everything kept, and at least one cut
    assert all(not c for _, _, c in serial[0])


def test_the_disk_cache_spares_a_second_process_the_solves(tmp_path, monkeypatch):
    from schedlang.pytorch import options
    from schedlang.pytorch.frontends.fx.partition import partition
    from schedlang.pytorch.profile import profile

    model, inputs, _ = ALL["gpt"](batch=2, context=16, layers=2)
    calls = []
    real = options.solve_spans
    monkeypatch.setattr(options, "solve_spans", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setenv("SCHEDLANG_CACHE_DIR", str(tmp_path))
    options.CACHE.clear()
    # two budgets of the series: the cache is what is tested, not how many solutions it holds
    options.add_generated_options(profile(partition(model, inputs), repeats=1), repeats=1,
                                  jobs=1, fractions=FEW)
    solved = len(calls)
    assert solved >= 1 and len(list(tmp_path.glob("layer-*.json"))) == solved
    first = {k: v[1] for k, v in options.CACHE.items()}  # the solutions, by layer structure
    options.CACHE.clear()  # as in a new process
    again = options.add_generated_options(profile(partition(model, inputs), repeats=1),
                                          repeats=1, jobs=1, fractions=FEW)
    assert len(calls) == solved  # read from the disk, not solved again
    assert {k: v[1] for k, v in options.CACHE.items()} == first
    assert any(again.values())  # and the options are built from them


def test_the_cache_key_follows_the_model_text(tmp_path, monkeypatch):
    key = ("sig", ((2, 16, 32),), (True,))
    monkeypatch.delenv("SCHEDLANG_CACHE_DIR", raising=False)
    assert cache_path(key, "layer_options", (0.5,), "highs") is None  # off by default
    a = cache_path(key, "layer_options", (0.5,), "highs", cache_dir=tmp_path)
    assert a == cache_path(key, "layer_options", (0.5,), "highs", cache_dir=tmp_path)
    model = tmp_path / "mine.sched"
    model.write_text("use layer_options\n")
    b = cache_path(key, str(model), (0.5,), "highs", cache_dir=tmp_path)
    model.write_text("use layer_options\n# another formulation\n")
    assert cache_path(key, str(model), (0.5,), "highs", cache_dir=tmp_path) != b
    assert cache_path(key, "layer_options", (0.6,), "highs", cache_dir=tmp_path) != a


def test_an_option_model_without_a_decoder_is_a_located_error(tmp_path):
    """`segments_allowed` fixes the model's `checkpointed`/`kept` roles: a model that declares
    no decoder has none, and says so (it was an AttributeError on `None.roles`)."""
    from schedlang.language.errors import CheckError
    from schedlang.language.resources import models_dir
    from schedlang.layer_solves import segments_allowed

    shipped = (models_dir() / "checkmate.sched").read_text(encoding="utf-8").splitlines()
    undecoded = tmp_path / "undecoded.sched"
    undecoded.write_text("\n".join(line for line in shipped if not line.startswith("decode ")),
                         encoding="utf-8")
    graph = schedlang.load(str(EXAMPLES / "chain.sched")).graph
    with pytest.raises(CheckError, match="declares no decoder") as info:
        segments_allowed({"peak": 1 << 40}, graph, str(undecoded), [(0, 1, True)])
    assert info.value.loc is not None and str(undecoded) in str(info.value.loc)


@pytest.mark.parametrize("fraction", [0.8, 0.4])
def test_sub_solves_without_highs_presolve_prove_the_same_optima(fraction):
    """The option model on a real block's op graph (BERT's, as `fit` records it at the bench's
    size; `bench/data/blockgraphs`), with HiGHS's defaults and with the sub-solves' options
    (`SUB_SOLVE_OPTIONS`: no presolve): both prove an optimum of the same recomputation time,
    at a budget where a cut fits and where none does (the same status)."""
    import json

    from schedlang.layer_solves import SUB_SOLVE_OPTIONS, budget_series

    data = Path(__file__).resolve().parent.parent / "bench" / "data" / "blockgraphs"
    name = "bert_bert_encoder_layer_0_51.sched"
    total = json.loads((data / "index.json").read_text())[name]["saved_total"]
    graph = schedlang.load(data / name).graph
    graph.budgets = budget_series(graph, total, [fraction])[0][0]  # the backward's peak
    found = []
    for options in (None, SUB_SOLVE_OPTIONS["highs"]):
        res = schedlang.load(model="layer_options", graph=graph).solve(
            time_limit=120, solver_options=options)
        found.append((res.status.value, res.objective))
    assert found[0][0] in ("optimal", "infeasible"), found
    assert found[1][0] == found[0][0], found
    if found[0][1] is not None:
        assert found[1][1] == pytest.approx(found[0][1], rel=1e-6), found
