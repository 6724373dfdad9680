"""models/extensions/block_groups.sched against an enumeration of every plan the hook front
end's wrappers run (issue 28, item 2).

On tiny chains of 3-5 blocks with 2-3 options each, the space the wrappers run is: every
cut of the chain into runs of consecutive blocks, a run of two or more blocks a checkpointed
group (`plan_checkpoint_groups`: its blocks' forwards without autograd, run again with
autograd right before its last block's backward), a run of one block any of its options.
Each such plan, with every datum but the outputs freed right after its last use
(`earliest_deletes`, what the model's own code does), is replayed by the simulator; its time is the simulator's plus
`rerun_correction` (a rerun priced as the option recompute measured it). At budgets from the
smallest feasible peak of that enumeration to the plain peak, and below it, the extension's
optimum equals the enumeration's best, infeasible iff no plan fits, and the solver's plan
replays within the budget with the objective as its predicted time.
"""
from __future__ import annotations

import itertools

import pytest

pytest.importorskip("torch")  # the plan reading and the rerun's price are the hook front end's

import schedlang  # noqa: E402
from schedlang.graphs.graph import Graph  # noqa: E402
from schedlang.language.resources import extension_path  # noqa: E402
from schedlang.plans.planners.baselines import plan_checkpoint_groups  # noqa: E402
from schedlang.plans.simulate import simulate  # noqa: E402
from schedlang.pytorch.frontends.blocks.plan_reading import GROUP, plan_choices, rerun_correction  # noqa: E402
from schedlang.pytorch.lifetimes import earliest_deletes  # noqa: E402
from schedlang.solve.solution import Status  # noqa: E402
from schedlang.testing.layered_instances import MiB, chain, opt  # noqa: E402

MODEL = ["rockmate", str(extension_path("held_outputs")), str(extension_path("block_groups"))]


def _block(fwd: float, bwd: float, rec_bwd: float, phantom: float, sel: bool = False,
           over: float = 0.5) -> list:
    """A block's options: autograd keeps `phantom` MiB; recompute keeps nothing but its input
    and costs `rec_bwd` in its backward; selective (optional) keeps a third and needs its
    output."""
    opts = [opt("autograd", fwd, bwd, phantom, fwd_over_mib=over, bwd_over_mib=over),
            opt("recompute", fwd, rec_bwd, 0, ["in"], fwd_over_mib=over, bwd_over_mib=2 * over)]
    if sel:
        opts.append(opt("selective", fwd, (bwd + rec_bwd) / 2, phantom / 3, ["out"],
                        fwd_over_mib=over, bwd_over_mib=over))
    return opts


def instances() -> dict[str, Graph]:
    out = {}
    out["three"] = chain("three", [2, 3, 1, 1], [_block(1, 2, 3, 2), _block(1, 2, 3, 2),
                                                  _block(2, 3, 6, 4)], loss_time=0.25)
    out["four_sel"] = chain("four_sel", [2, 3, 1, 3, 1],
                            [_block(1, 2, 3, 2, sel=True), _block(2, 3, 5.5, 3, sel=True),
                             _block(1, 2, 3, 2, sel=True), _block(1, 2, 4, 3, sel=True)])
    # a rerun priced above its forward on one block (rec_bwd - bwd > fwd: the CPU's case)
    out["five"] = chain("five", [2, 2, 1, 2, 2, 1],
                        [_block(1, 2, 3, 3), _block(1, 2, 4.5, 4), _block(1, 2, 3, 3),
                         _block(1, 2, 3, 2), _block(1, 1, 2, 3)], loss_time=0.25)
    return out


#: the instances whose time/peak front has a plan with a group (the others: per-block plans)
GROUPS_ON_THE_FRONT = ("three", "five")


def _cuts(n: int):
    """Every cut of n blocks into runs of consecutive blocks: the runs' lengths."""
    for bars in itertools.product((False, True), repeat=n - 1):
        runs, size = [], 1
        for bar in bars:
            if bar:
                runs.append(size)
                size = 1
            else:
                size += 1
        yield runs + [size]


def runnable_plans(g: Graph):
    """(groups, options, plan) for every plan the wrappers run on the chain `g`."""
    names = [lay.name for lay in g.layers]
    has = {lay.name: [o.name for o in lay.options] for lay in g.layers}
    freed = {d.name for d in g.data} - set(g.loss.inputs)  # the caller holds the outputs
    for runs in _cuts(len(names)):
        at, groups, singles = 0, [], []
        for size in runs:
            (groups if size > 1 else singles).append(names[at:at + size])
            at += size
        for choice in itertools.product(*(has[s[0]] for s in singles)):
            options = {s[0]: o for s, o in zip(singles, choice)}
            options.update((m, "autograd") for grp in groups for m in grp)
            plan = earliest_deletes(plan_checkpoint_groups(g, groups, options), g, freed)
            yield groups, options, plan


def priced(g: Graph):
    """(peak bytes, predicted seconds, plan) of every runnable plan."""
    out = []
    for _, _, plan in runnable_plans(g):
        sim = simulate(plan, g)
        assert sim.valid, sim
        out.append((sim.peak_bytes, sim.time + rerun_correction(plan, g), plan))
    return out


def _solve(g: Graph, budget: int):
    g.budgets = {"peak": budget}
    return schedlang.load(model=MODEL, graph=g).solve(backend="pyomo", solver="highs")


@pytest.mark.parametrize("name", list(instances()))
def test_optimum_equals_the_best_runnable_plan(name):
    g = instances()[name]
    plans = priced(g)
    assert any(GROUP in "".join(plan_choices(p, g, [lay.name for lay in g.layers]).values())
               for _, _, p in plans)
    peaks = sorted({peak for peak, _, _ in plans})
    # every peak of the time/peak front (the optimum changes there), others between them
    front, fastest = [], float("inf")
    for peak, t, _ in sorted(plans, key=lambda x: (x[0], x[1])):
        if t < fastest:
            front.append(peak)
            fastest = t
    budgets = sorted({peaks[0] - MiB, *front, *peaks[1::max(1, len(peaks) // 4)]})
    grouped_optimum = 0
    for budget in budgets:
        fits = [t for peak, t, _ in plans if peak <= budget]
        res = _solve(g, budget)
        if not fits:
            assert res.status == Status.INFEASIBLE, (name, budget, res.status)
            continue
        assert res.status == Status.OPTIMAL, (name, budget, res.status)
        assert res.objective == pytest.approx(min(fits), rel=1e-6, abs=1e-9), (name, budget)
        sim = simulate(res.plan, g, budget=budget)
        assert sim.valid and sim.peak_bytes <= budget, (name, budget, sim)
        assert sim.time + rerun_correction(res.plan, g) == pytest.approx(res.objective,
                                                                        rel=1e-6)
        choices = plan_choices(res.plan, g, [lay.name for lay in g.layers])
        grouped_optimum += any(c.startswith(GROUP) for c in choices.values())
    # where the enumeration's front has a group plan, the solver's optimum has one there
    assert grouped_optimum or name not in GROUPS_ON_THE_FRONT, name
