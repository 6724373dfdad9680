"""The simulator on layered graphs (H-Rockmate view): phantoms, options, contributions, budgets.

The mutation tests hold `schedlang.plans.simulate` to a slow, direct reference checker written here
from the rules in the simulator's module docstring.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from schedlang.graphs.hgraph import build_hgraph
from schedlang.language.program import load_program
from schedlang.plans.plan import Op, Plan
from schedlang.plans.planners.no_recompute import no_recompute_peak, no_recompute_plan
from schedlang.plans.simulate import simulate
from schedlang.testing.layered_instances import TINY_TEXT, long_plan_on_a_deep_chain
from schedlang.testing.plan_steps import TINY_LOSS_AND_BLOCK2_BACKWARD, plan_of

from ..paths import ROOT

TINY = ROOT / "examples" / "tiny_transformer.sched"
MiB = 2**20


def graph_of(text: str, tmp_path, name: str = "g.sched"):
    path = tmp_path / name
    path.write_text(text)
    return load_program([path]).graph


def tiny(text: str = TINY_TEXT):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tiny_transformer.sched"
        path.write_text(text)
        return load_program([path]).graph


# x 8, h1 8, h2 8, loss 4 B, h2.grad 8, h1.grad 8, x.grad 8 (MiB)
TINY_NO_RECOMPUTE = f"""
c block1.fwd autograd
d x
c block2.fwd autograd
d h1
{TINY_LOSS_AND_BLOCK2_BACKWARD}
c block1.bwd autograd
d h1.grad
"""

# block1 runs without autograd first (no phantom), then again with its option before its backward
TINY_RECOMPUTE = f"""
c block1.fwd fast_forward
c block2.fwd autograd
d h1
{TINY_LOSS_AND_BLOCK2_BACKWARD}
c block1.fwd recompute
d h1
c block1.bwd recompute
d h1.grad
d x
"""


# --- valid plans ---------------------------------------------------------------------------
def test_no_recompute_plan_of_tiny_transformer_by_hand():
    g = tiny()
    plan = no_recompute_plan(g)
    assert plan.ops == plan_of(TINY_NO_RECOMPUTE).ops
    r = simulate(plan, g)
    assert r.valid, r.errors
    assert r.warnings == [] and r.computes == 5
    # block1.fwd: x 8 + h1 8 + phantom 96 + overhead 12 = 124; then 112, and x freed: 104
    # block2.fwd: 104 + h2 8 + phantom 96 + overhead 12 = 220; then 208, h1 freed: 200
    # loss: 200 + h2.grad 8 + loss 4 B = 208 MiB + 4; h2 and loss freed: 200
    # block2.bwd: 200 + h1.grad 8 + overhead 30 = 238; phantom consumed: 112; h2.grad freed: 104
    # block1.bwd: 104 + x.grad 8 + overhead 30 = 142; then 16; h1.grad freed: 8 (x.grad)
    assert r.peak_bytes == 238 * MiB
    assert r.time == pytest.approx(1.9e-3 + 1.9e-3 + 0.1e-3 + 3.8e-3 + 3.8e-3)
    # loss phase, sampled after each compute and the deletes that follow it (the ILP's U):
    # block2.fwd then `d h1`: 200; the loss then `d h2`, `d loss`: 200
    assert r.save_peak_bytes == 200 * MiB
    assert no_recompute_peak(g) == 238 * MiB
    assert plan.predicted_peak == 238 * MiB and plan.predicted_time == pytest.approx(r.time)
    assert r.fits_budget is None  # the plan carries no budget and graph.budgets is empty


def test_the_shipped_example_replays_its_no_recompute_plan():
    g = load_program([TINY]).graph
    plan = no_recompute_plan(g)
    r = simulate(plan, g)
    assert r.valid, r.errors
    assert r.peak_bytes == plan.predicted_peak == no_recompute_peak(g)


def test_a_recomputed_forward_is_valid():
    g = tiny()
    r = simulate(plan_of(TINY_RECOMPUTE), g)
    assert r.valid, r.errors
    assert r.computes == 6
    assert r.time == pytest.approx(1.9e-3 * 3 + 0.1e-3 + 3.8e-3 + 5.7e-3)
    # block2.fwd: x 8 + h1 8 + h2 8 + ph2 96 + overhead 12 = 132
    # block2.bwd: x 8 + h2.grad 8 + ph2 96 + h1.grad 8 + overhead 30 = 150: the peak
    # block1.fwd (recompute, phantom 0): x 8 + h1.grad 8 + h1 8 + overhead 12 = 36
    # block1.bwd (needs x): x 8 + h1.grad 8 + x.grad 8 + overhead 42 = 66
    assert r.peak_bytes == 150 * MiB
    # loss phase: block2.fwd then `d h1`: x+h2+ph2 = 112; the loss and its deletes: 112
    assert r.save_peak_bytes == 112 * MiB


def test_a_drop_phantom_then_a_forward_with_another_option_is_valid():
    g = tiny()
    plan = plan_of(TINY_NO_RECOMPUTE.replace("d x\n", "p block1\nc block1.fwd keep_attn\nd x\n", 1)
                   .replace("c block1.bwd autograd", "c block1.bwd keep_attn"))
    r = simulate(plan, g)
    assert not r.valid  # keep_attn needs h1, which the plan deletes after block2.fwd
    assert r.errors == ["op 11: compute 'block1.bwd' with option 'keep_attn' needs 'h1', which "
                        "is not in memory (deleted by op 5)"]
    plan.ops = [op for op in plan.ops if not (op.op == "delete" and op.data == "h1")]
    r = simulate(plan, g)
    assert r.valid, r.errors  # h1 is left in memory: allowed, only outputs are checked


def test_the_loss_takes_no_option_or_its_own_name():
    g = tiny()
    plan = plan_of(TINY_NO_RECOMPUTE.replace("c loss\n", "c loss loss\n"))
    assert simulate(plan, g).valid
    r = simulate(plan_of(TINY_NO_RECOMPUTE.replace("c loss\n", "c loss autograd\n")), g)
    assert not r.valid and "the loss has a single way to run" in r.errors[0]


# --- invalid plans: one clear error each -----------------------------------------------------
def errors_of(steps: str, **kw) -> list[str]:
    r = simulate(plan_of(steps, **kw), tiny())
    assert not r.valid
    return r.errors


def test_a_backward_without_its_phantom():
    steps = TINY_NO_RECOMPUTE.replace("c block1.fwd autograd", "c block1.fwd fast_forward")
    assert errors_of(steps) == [
        "op 9: backward 'block1.bwd' with option 'autograd' needs the phantom of layer 'block1', "
        "but no phantom of 'block1' is saved (its forward never saved one)"]
    dropped = TINY_NO_RECOMPUTE.replace("d x\n", "d x\np block1\n")
    assert errors_of(dropped) == [
        "op 10: backward 'block1.bwd' with option 'autograd' needs the phantom of layer "
        "'block1', but no phantom of 'block1' is saved (dropped by op 2)"]
    twice = TINY_NO_RECOMPUTE.replace("d h2.grad\n", "") + "c block2.bwd autograd\nd h2.grad\n"
    assert errors_of(twice) == [
        "op 10: backward 'block2.bwd' with option 'autograd' needs the phantom of layer "
        "'block2', but no phantom of 'block2' is saved (consumed by the backward at op 7)"]


def test_a_backward_with_the_wrong_option():
    steps = TINY_NO_RECOMPUTE.replace("d x\n", "").replace(
        "c block1.bwd autograd", "c block1.bwd recompute") + "d x\n"
    errs = errors_of(steps)
    assert errs[0] == ("op 8: backward 'block1.bwd' runs with option 'recompute', but the phantom "
                       "of layer 'block1' is saved with option 'autograd' (by op 0)")
    assert len(errs) == 1  # the phantom is consumed all the same: no error cascades


def test_data_used_after_deletion():
    steps = TINY_NO_RECOMPUTE.replace("d x\nc block2.fwd autograd\nd h1\n",
                                      "d x\nd h1\nc block2.fwd autograd\n")
    assert errors_of(steps) == [
        "op 3: compute 'block2.fwd' needs 'h1', which is not in memory (deleted by op 2)"]
    assert errors_of("c block2.fwd autograd\n" + TINY_NO_RECOMPUTE)[0] == (
        "op 0: compute 'block2.fwd' needs 'h1', which is not in memory (never created before)")


def test_data_deleted_twice_or_never_created():
    errs = errors_of(TINY_NO_RECOMPUTE.replace("d h1\n", "d h1\nd h1\n", 1))
    assert errs == ["op 4: delete 'h1', which is not in memory (deleted by op 3)"]
    errs = errors_of("d h2\nd nope\np blok1\np block1\n" + TINY_NO_RECOMPUTE)
    assert errs[:4] == [
        "op 0: delete 'h2', which is not in memory (never created before)",
        "op 1: delete of unknown data 'nope'",
        "op 2: drop_phantom of unknown layer 'blok1' (did you mean 'block1'?)",
        "op 3: drop_phantom 'block1', but no phantom of layer 'block1' is saved (its forward "
        "never saved one)"]


def test_two_phantom_options_of_one_layer():
    steps = TINY_NO_RECOMPUTE.replace("d x\n", "c block1.fwd recompute\nd x\n", 1)
    errs = errors_of(steps)
    assert errs[0] == (
        "op 1: forward 'block1.fwd' with option 'recompute' saves a phantom of layer 'block1', "
        "which already has one saved with option 'autograd' (by op 0): only one phantom option "
        "per layer (drop it first)")
    # the same option twice replaces the phantom: both copies count during the op, one after
    steps = TINY_NO_RECOMPUTE.replace("d x\n", "c block1.fwd autograd\nd x\n", 1)
    r = simulate(plan_of(steps), tiny())
    assert r.valid, r.errors
    assert r.peak_bytes == 238 * MiB  # x 8 + h1 8 + 2 x 96 + 12 = 220 at op 1, still below 238
    assert r.save_peak_bytes == 200 * MiB  # one copy after the op


def test_recomputing_the_same_phantom_counts_both_copies():
    g = tiny()
    once = simulate(plan_of(TINY_NO_RECOMPUTE), g, budget=10**12)
    steps = TINY_NO_RECOMPUTE.replace("d h1\n", "c block2.fwd autograd\nd h1\n", 1)
    r = simulate(plan_of(steps), g)
    assert r.valid, r.errors
    # second block2.fwd: x gone; h1 8 + ph1 96 + h2 8 + ph2 96 + new h2 8 + new ph2 96 + 12
    assert r.peak_bytes == 324 * MiB > once.peak_bytes
    # sampled after the first block2.fwd (h1 is deleted only after the second): h1 8 + h2 8 +
    # 2 phantoms 192 = 208; after the second and `d h1` one copy of each: 200
    assert r.save_peak_bytes == 208 * MiB


def test_a_phantom_left_at_the_end():
    steps = TINY_NO_RECOMPUTE.replace("d x\n", "") + "c block1.fwd recompute\nd x\n"
    assert errors_of(steps) == [
        "phantom of layer 'block1' still saved at the end (option 'recompute', saved by op 10)"]


def test_output_not_alive_at_the_end():
    assert errors_of(TINY_NO_RECOMPUTE + "d x.grad\n") == [
        "output 'x.grad' is not in memory at the end (deleted by op 11)"]
    steps = TINY_NO_RECOMPUTE.replace("c block1.bwd autograd\nd h1.grad\n", "")
    errs = errors_of(steps)
    assert errs[0] == "1 node is never computed: 'block1.bwd'"
    assert errs[1] == "output 'x.grad' is not in memory at the end (never created before)"
    assert errs[2].startswith("phantom of layer 'block1' still saved at the end")


def test_the_loss_computed_twice():
    steps = TINY_NO_RECOMPUTE.replace("c loss\n", "c loss\nc loss\n")
    assert errors_of(steps) == [
        "op 5: the loss is computed a second time (first by op 4); it must be computed exactly once"]


def test_unknown_and_missing_options_and_nodes():
    errs = errors_of(TINY_NO_RECOMPUTE.replace("c block1.fwd autograd", "c block1.fwd autogradd"))
    assert errs[0] == ("op 0: compute 'block1.fwd' with unknown option 'autogradd' (did you mean "
                       "'autograd'?) (options: 'autograd', 'recompute', 'keep_attn', 'fast_forward')")
    errs = errors_of(TINY_NO_RECOMPUTE.replace("c block2.fwd autograd", "c block2.fwd"))
    assert errs[0] == ("op 2: compute 'block2.fwd' needs an option, one of 'autograd', "
                       "'recompute', 'fast_forward'")
    errs = errors_of(TINY_NO_RECOMPUTE.replace("c block2.bwd autograd", "c block2.bwd"))
    assert errs[0].startswith("op 7: compute 'block2.bwd' needs an option, one of 'autograd'")
    errs = errors_of("c blok1.fwd autograd\n" + TINY_NO_RECOMPUTE)
    assert errs[0] == "op 0: compute of unknown node 'blok1.fwd' (did you mean 'block1.fwd'?)"


def test_offload_without_bandwidth_is_an_error():
    plan = plan_of(TINY_NO_RECOMPUTE)
    plan.ops.insert(0, Op("offload", data="x"))
    r = simulate(plan, tiny())
    assert not r.valid and r.errors == [
        "op 0: offload of 'x', but the offload bandwidth is 0 (the graph gives none: declare "
        "`bandwidth offload ...`), so no transfer is possible"]


def test_inconsistent_layered_graphs_are_reported_not_raised(tmp_path):
    from schedlang.graphs.graph import Graph, Layer, Node
    g = Graph(name="t", layers=[Layer("l1", ["x"], ["h"], [], [], [])])
    r = simulate(Plan(graph="t", ops=[Op("compute", node="l1")]), g)
    assert not r.valid and r.errors == ["cannot simulate this layered graph: layer 'l1' has no option"]
    mixed = tiny()
    mixed.nodes.append(Node("n", 1.0, 1))
    r = simulate(plan_of(TINY_NO_RECOMPUTE), mixed)
    assert not r.valid and "both compute nodes" in r.errors[0]


# --- peak, overhead and budgets ------------------------------------------------------------
def test_the_peak_includes_the_transient_overhead(tmp_path):
    text = TINY_TEXT
    bigger = text.replace("option autograd   fwd 1.9ms overhead 12MiB  bwd 3.8ms overhead 30MiB  "
                          "phantom 96MiB\n    option recompute  fwd 1.9ms overhead 12MiB  bwd 5.7ms "
                          "overhead 42MiB  phantom 0 needs (h1)\n  }\n  loss",
                          "option autograd   fwd 1.9ms overhead 12MiB  bwd 3.8ms overhead 50MiB  "
                          "phantom 96MiB\n    option recompute  fwd 1.9ms overhead 12MiB  bwd 5.7ms "
                          "overhead 42MiB  phantom 0 needs (h1)\n  }\n  loss")
    assert bigger != text
    g = tiny(bigger)
    r = simulate(plan_of(TINY_NO_RECOMPUTE), g)
    assert r.valid and r.peak_bytes == 258 * MiB  # block2.bwd: 200 + 8 + 50
    assert r.save_peak_bytes == 200 * MiB  # the overhead is transient


def test_peak_budget_from_the_plan_and_the_argument():
    g = tiny()
    plan = plan_of(TINY_NO_RECOMPUTE, budget_peak=238 * MiB)
    r = simulate(plan, g)
    assert r.valid and r.fits_budget is True and r.budget_bytes == 238 * MiB
    r = simulate(plan, g, budget=238 * MiB - 1)
    assert not r.valid and r.fits_budget is False
    assert r.errors == [f"peak memory {238 * MiB} B exceeds the peak budget {238 * MiB - 1} B by 1 B"]


def test_save_budget_violated_during_the_loss_phase():
    g = tiny()
    plan = plan_of(TINY_NO_RECOMPUTE, budget_peak=10**12, budget_save=120 * MiB)
    r = simulate(plan, g)
    assert not r.valid and r.fits_budget is False
    assert r.save_peak_bytes == 200 * MiB and r.save_budget_bytes == 120 * MiB
    assert r.errors == [f"memory during the loss phase reaches {200 * MiB} B (after op 2 and the frees that "
                        "follow it), over "
                        f"the save budget {120 * MiB} B by {80 * MiB} B"]
    # the argument wins over the plan; the peak is fine, so only the save budget fails
    assert simulate(plan, g, save_budget=200 * MiB).valid
    assert not simulate(plan, g, save_budget=200 * MiB - 1).valid
    # the graph's budget is used when the plan has none
    plan.budget_save = None
    g.budgets["save"] = 200 * MiB
    assert simulate(plan, g).save_budget_bytes == 200 * MiB


def test_save_budget_met_with_phantom_free_options():
    g = tiny()
    steps = """
    c block1.fwd recompute
    c block2.fwd recompute
    c loss
    d h2
    d loss
    c block2.bwd recompute
    d h2.grad
    d h1
    c block1.bwd recompute
    d h1.grad
    d x
    """
    plan = plan_of(steps, budget_save=120 * MiB)
    r = simulate(plan, g)
    assert r.valid, r.errors
    # loss phase: after block2.fwd x+h1+h2 = 24; the loss then `d h2`, `d loss`: 24
    assert r.save_peak_bytes == 24 * MiB and r.fits_budget is True
    # block2.bwd (needs h1): x 8 + h1 8 + h2.grad 8 + h1.grad 8 + overhead 42 = 74, outside the
    # loss phase
    assert r.peak_bytes == 74 * MiB


def test_the_loss_phase_starts_after_the_last_forward_and_ends_with_the_loss():
    g = tiny()
    # recomputing block1 inside the loss phase (not a first computation) counts in it ...
    steps = TINY_NO_RECOMPUTE.replace("d x\n", "").replace(
        "d h1\nc loss\n", "d h1\nc block1.fwd fast_forward\nd h1\nd x\nc loss\n")
    r = simulate(plan_of(steps), g)
    assert r.valid, r.errors
    # block2.fwd then `d h1`: x 8 + h2 8 + 2 phantoms 192 = 208 (the fast forward's h1 is
    # deleted right after it, with x: 200)
    assert r.save_peak_bytes == 208 * MiB
    # ... memory before the last forward's first computation does not
    steps = TINY_NO_RECOMPUTE.replace("c block1.fwd autograd\n", "c block1.fwd autograd\n"
                                      "c block1.fwd fast_forward\nd h1\nc block1.fwd autograd\n")
    r = simulate(plan_of(steps), g)
    assert r.valid and r.save_peak_bytes == 200 * MiB
    # no loss, no loss phase
    r = simulate(plan_of(TINY_NO_RECOMPUTE.replace("c loss\n", ""), budget_save=1), g)
    assert r.save_peak_bytes is None and not r.valid


def test_result_json_has_the_save_fields():
    r = simulate(plan_of(TINY_NO_RECOMPUTE), tiny())
    obj = r.to_json()
    assert obj["save_peak_bytes"] == 200 * MiB and obj["save_budget_bytes"] is None


# --- gradient accumulation on a 3-layer instance --------------------------------------------
THREE = """
graph three "3 layers, a skip connection: a.grad has two creators" {
  data x      24MiB input
  data a      4MiB
  data b      4MiB
  data c      4MiB
  data lv     1KiB
  data c.grad 4MiB
  data b.grad 4MiB
  data a.grad 4MiB
  data x.grad 2MiB output
  layer l1 (x) -> (a) { grad (a.grad) -> (x.grad)
    option full fwd 1ms overhead 1MiB bwd 2ms overhead 2MiB phantom 8MiB
    option lean fwd 1ms bwd 3ms overhead 1MiB phantom 2MiB needs (x) }
  layer l2 (a) -> (b) { grad (b.grad) -> (a.grad)
    option full fwd 2ms bwd 4ms overhead 20MiB phantom 8MiB
    option lean fwd 2ms bwd 5ms phantom 1MiB needs (a) }
  layer l3 (a, b) -> (c) { grad (c.grad) -> (a.grad, b.grad)
    option full fwd 1ms bwd 2ms overhead 3MiB phantom 6MiB }
  loss (c) -> (lv, c.grad) time 0.5ms
}
"""

THREE_RECOMPUTE = """
c l1.fwd lean
p l1
c l2.fwd lean
c l3.fwd full
d b
c loss
d c
d lv
c l3.bwd
d c.grad
c l2.bwd lean
d a
d b.grad
c l1.fwd full
d a
c l1.bwd full
d a.grad
d x
"""


@pytest.fixture
def three(tmp_path):
    return graph_of(THREE, tmp_path)


def test_three_layer_plans_by_hand(three):
    plan = no_recompute_plan(three)
    assert [str(op) for op in plan.ops] == [
        "compute node='l1.fwd' option='full'", "delete data='x'",
        "compute node='l2.fwd' option='full'",
        "compute node='l3.fwd' option='full'", "delete data='a'", "delete data='b'",
        "compute node='loss'", "delete data='c'", "delete data='lv'",
        "compute node='l3.bwd'", "delete data='c.grad'",
        "compute node='l2.bwd' option='full'", "delete data='b.grad'",
        "compute node='l1.bwd' option='full'", "delete data='a.grad'"]
    r = simulate(plan, three)
    assert r.valid, r.errors
    # l1.fwd: x 24 + a 4 + ph1 8 + overhead 1 = 37; then 36, and x freed: 12
    # l3.fwd: a 4 + ph1 8 + b 4 + ph2 8 + c 4 + ph3 6 = 34
    # l3.bwd: c.grad 4 + 3 phantoms 22 + a.grad 4 + b.grad 4 + overhead 3 = 37
    # l2.bwd: b.grad 4 + a.grad 4 + ph1 8 + ph2 8 + overhead 20 = 44, a.grad accumulated in
    # place (a second copy would make it 48)
    assert r.peak_bytes == 44 * MiB
    # loss phase: l3.fwd then `d a`, `d b`: 26; the loss then `d c`, `d lv`: 26
    assert r.save_peak_bytes == 26 * MiB
    r = simulate(plan_of(THREE_RECOMPUTE, graph="three"), three)
    assert r.valid, r.errors
    assert r.time == pytest.approx((1 + 2 + 1 + 0.5 + 2 + 5 + 1 + 2) * 1e-3)


def test_a_gradient_used_before_all_its_contributions(three):
    steps = THREE_RECOMPUTE.replace("c l2.bwd lean\n", "").replace("d a.grad\n", "d a.grad\nc l2.bwd lean\n")
    r = simulate(plan_of(steps, graph="three"), three)
    assert not r.valid
    assert r.errors[0] == ("op 14: compute 'l1.bwd' needs 'a.grad', which is incomplete: the "
                           "contribution of 'l2.bwd' is missing (1 of 2 received)")


def test_a_contribution_added_twice_is_an_error(three):
    steps = THREE_RECOMPUTE.replace("c l2.bwd lean\n", "c l2.bwd lean\nc l2.fwd lean\nc l2.bwd lean\n")
    r = simulate(plan_of(steps, graph="three"), three)
    assert not r.valid
    assert r.errors == ["op 12: 'l2.bwd' adds its contribution to 'a.grad' a second time (the "
                        "gradient would be accumulated twice; delete 'a.grad' first)"]


# --- the reference checker: the rules, written again, directly and slowly --------------------
def reference(plan: Plan, graph, peak_budget=None, save_budget=None):
    """(valid, first op index with an error or None, peak, time, save peak, dependency errors).

    `dependency errors`: op indices where a compute lacked a datum, a complete datum or its
    phantom.
    """
    h = build_hgraph(graph)
    nodes = {k.name: k for k in h.compute}
    order = [k.name for k in h.compute]
    creators = {d: set() for d in h.data}
    for k, d in h.creates:
        creators[d].add(k)
    live: set[str] = set(h.inputs)
    contrib: dict[str, set[str]] = {d: set() for d in h.data}
    phantom: dict[str, str] = {}  # layer -> option
    ncomputed = {k: 0 for k in order}
    first: dict[str, int] = {}
    problems: list[tuple[int | None, str]] = []
    dependency: list[int] = []
    memory_after: list[int] = []

    def memory() -> int:
        return sum(h.data[d] for d in live) + sum(h.phantoms[(j, o)] for j, o in phantom.items())

    peak = memory()
    start_memory = peak
    total = 0.0
    for pos, op in enumerate(plan.ops):
        if op.op == "compute":
            node = nodes.get(op.node)
            if node is None:
                problems.append((pos, "unknown node"))
                memory_after.append(memory())
                continue
            names = [o.name for o in node.options]
            if op.option is None and len(names) == 1:
                option = node.options[0]
            elif op.option in names:
                option = node.options[names.index(op.option)]
            else:
                problems.append((pos, "bad option"))
                memory_after.append(memory())
                continue
            if node.kind == "loss" and ncomputed[node.name]:
                problems.append((pos, "loss twice"))
            needed = [d for k, d in h.uses if k == node.name]
            if node.kind == "bwd":
                needed += [d for k, o, d in h.option_uses if k == node.name and o == option.name]
                if phantom.get(node.layer) != option.name:
                    problems.append((pos, "phantom"))
                    dependency.append(pos)
            for d in needed:
                if d not in live or contrib[d] != creators[d]:
                    problems.append((pos, f"needs {d}"))
                    dependency.append(pos)
            before = memory()
            created = [d for k, d in h.creates if k == node.name]
            extra = 0
            for d in created:
                in_place = d in live and len(creators[d]) > 1 and node.name not in contrib[d]
                if not in_place:
                    extra += h.data[d]
            saves = node.kind == "fwd" and (node.layer, option.name) in h.phantoms
            if saves:
                extra += h.phantoms[(node.layer, option.name)]
            peak = max(peak, before + extra + option.overhead)
            for d in created:
                if d in live and node.name in contrib[d] and len(creators[d]) > 1:
                    problems.append((pos, "contribution twice"))
                live.add(d)
                contrib[d].add(node.name)
            if saves:
                if node.layer in phantom and phantom[node.layer] != option.name:
                    problems.append((pos, "two phantom options"))
                phantom[node.layer] = option.name
            if node.kind == "bwd":
                phantom.pop(node.layer, None)
            total += option.time
            ncomputed[node.name] += 1
            first.setdefault(node.name, pos)
        elif op.op == "delete":
            if op.data not in live:
                problems.append((pos, "delete"))
            else:
                live.discard(op.data)
                contrib[op.data] = set()
        elif op.op == "drop_phantom":
            if op.layer not in phantom:
                problems.append((pos, "drop"))
            else:
                del phantom[op.layer]
        else:
            problems.append((pos, "unsupported"))
        memory_after.append(memory())
    for k in order:
        if not ncomputed[k]:
            problems.append((None, f"{k} never computed"))
    for d in h.outputs:
        if d not in live or contrib[d] != creators[d]:
            problems.append((None, f"output {d}"))
    for j in phantom:
        problems.append((None, f"phantom {j} left"))
    # the loss phase: phase t ends with the first computation of the t-th node in H order
    save_peak = None
    if "loss" in first:
        end = first["loss"]
        earlier = [first[k] for k in order[:order.index("loss")] if k in first and first[k] < end]
        begin = max(earlier) if earlier else -1
        # sampled after each compute of the phase together with the deletes and drops that
        # follow it: just before the next compute (or at the end of the plan)
        computes = [p for p, op in enumerate(plan.ops) if op.op == "compute"]
        samples = [start_memory] if begin < 0 else []
        for c in computes:
            if max(begin, 0) <= c <= end:
                nxt = next((p for p in computes if p > c), len(plan.ops))
                samples.append(memory_after[nxt - 1])
        save_peak = max(samples)
    if peak_budget is not None and peak > peak_budget:
        problems.append((None, "peak budget"))
    if save_budget is not None and save_peak is not None and save_peak > save_budget:
        problems.append((None, "save budget"))
    first_op = min((p for p, _ in problems if p is not None), default=None)
    return not problems, first_op, peak, total, save_peak, dependency


def mutations(ops: list[Op], graph=None):
    """Every single-op removal, every swap of two adjacent ops, every duplication of one op
    and, given the graph, every change of one compute op's option (to each other option, and
    to none): (label, ops)."""
    for i in range(len(ops)):
        yield f"remove {i} ({ops[i]})", ops[:i] + ops[i + 1:]
    for i in range(len(ops)):
        yield f"duplicate {i} ({ops[i]})", ops[:i + 1] + ops[i:]
    for i in range(len(ops) - 1):
        yield f"swap {i} ({ops[i]}), {i + 1} ({ops[i + 1]})", \
            ops[:i] + [ops[i + 1], ops[i]] + ops[i + 2:]
    if graph is None:
        return
    options = {k.name: [o.name for o in k.options] for k in build_hgraph(graph).compute}
    for i, op in enumerate(ops):
        if op.op != "compute":
            continue
        for other in options[op.node] + [None]:
            if other != op.option:
                changed = Op("compute", node=op.node, option=other)
                yield f"option {i} ({op}) -> {other}", ops[:i] + [changed] + ops[i + 1:]


def first_op_error(errors: list[str]) -> int | None:
    ops = [int(e.split(":")[0][3:]) for e in errors if e.startswith("op ")]
    return ops[0] if ops else None


def reads(graph, op: Op) -> set[str]:
    """What a compute op reads: its uses, its option's needs (an independent, structural view)."""
    h = build_hgraph(graph)
    out = {d for k, d in h.uses if k == op.node}
    return out | {d for k, o, d in h.option_uses if k == op.node and o == op.option}


def swap_breaks_a_dependency(graph, a: Op, b: Op) -> bool:
    """Swapping adjacent `a`, `b` so that `b` runs first breaks an edge between them."""
    h = build_hgraph(graph)
    if a.op == "compute" and b.op == "compute":
        made = {d for k, d in h.creates if k == a.node}
        if made & reads(graph, b):
            return True
        la, lb = a.node.rsplit(".", 1), b.node.rsplit(".", 1)
        # a forward saving the phantom its backward consumes
        return la[-1] == "fwd" and lb[-1] == "bwd" and la[0] == lb[0] and a.option != "fast_forward"
    if a.op == "compute" and b.op == "delete":
        return b.data in reads(graph, a) or b.data in {d for k, d in h.creates if k == a.node}
    if a.op == "compute" and b.op == "drop_phantom":
        return a.node == f"{b.layer}.fwd"
    return False


@pytest.mark.parametrize("which", ["no_recompute", "recompute"])
@pytest.mark.parametrize("with_budgets", [False, True])
def test_mutations_agree_with_the_reference_checker(three, which, with_budgets):
    base = no_recompute_plan(three) if which == "no_recompute" else plan_of(THREE_RECOMPUTE, graph="three")
    ok, _, peak, total, save_peak, _ = reference(base, three)
    assert ok
    budgets = {"peak_budget": peak, "save_budget": save_peak} if with_budgets else {}
    r = simulate(Plan(graph="three", ops=base.ops, budget_peak=budgets.get("peak_budget"),
                      budget_save=budgets.get("save_budget")), three)
    assert r.valid, r.errors
    assert (r.peak_bytes, r.save_peak_bytes) == (peak, save_peak) and r.time == pytest.approx(total)

    verdicts = {True: 0, False: 0}
    for label, ops in mutations(base.ops, three):
        plan = Plan(graph="three", ops=ops, budget_peak=budgets.get("peak_budget"),
                    budget_save=budgets.get("save_budget"))
        ok, first_op, ref_peak, ref_time, ref_save, dependency = reference(plan, three, **budgets)
        r = simulate(plan, three)
        assert r.valid == ok, (label, r.errors)
        verdicts[ok] += 1
        if dependency:
            assert not r.valid, label
        # the first faulty op is the same: both replays agree up to it
        assert first_op_error(r.errors) == first_op, (label, r.errors)
        if ok:
            assert r.peak_bytes == ref_peak and r.save_peak_bytes == ref_save, label
            assert r.time == pytest.approx(ref_time), label
        if label.startswith("swap"):
            i = int(label.split()[1])
            if swap_breaks_a_dependency(three, base.ops[i], base.ops[i + 1]):
                assert not r.valid and not ok, label
        elif label.startswith("remove"):
            i = int(label.split()[1])
            removed = base.ops[i]
            if removed.op == "compute" and \
                    sum(op.op == "compute" and op.node == removed.node for op in base.ops) == 1:
                assert not r.valid, label  # a node never computed
    assert verdicts[True] > 0 and verdicts[False] > 0, verdicts


def test_the_mutations_include_each_kind_of_failure(three):
    seen = set()
    keys = ("is not in memory", "is incomplete", "no phantom", "only one phantom option",
            "still saved at the end", "never computed", "output 'x.grad'", "is saved with option",
            "needs an option", "a second time", "computed a second time")
    for _, ops in mutations(plan_of(THREE_RECOMPUTE, graph="three").ops, three):
        for e in simulate(Plan(graph="three", ops=ops), three).errors:
            seen.update(key for key in keys if key in e)
    assert seen == set(keys)


# --- speed -----------------------------------------------------------------------------------
def test_long_plans_on_200_layers():
    n = 200
    plan, g = long_plan_on_a_deep_chain(n)
    base = no_recompute_plan(g)
    assert len(plan.ops) >= 99_000
    r = simulate(plan, g)  # its speed is measured in bench/bench_throughput.py
    assert r.valid, r.errors[:3]
    assert r.computes == 2 * n + 1 + (len(plan.ops) - len(base.ops)) // 2
