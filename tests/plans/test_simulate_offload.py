"""The simulator's transfer ops on layered graphs: offload, prefetch and wait on two channels
that overlap with compute (the rules are in `schedlang.plans.simulate`'s docstring and
docs/plans.md). Expected peaks and times are computed by hand in the comments."""
from __future__ import annotations

import json
import math
import re
import tempfile
from pathlib import Path

import pytest

from schedlang.language.errors import DataError
from schedlang.language.program import load_program
from schedlang.plans.plan import SCHEMA, Op, Plan
from schedlang.plans.simulate import simulate
from schedlang.testing.layered_instances import TINY_TEXT
from schedlang.testing.plan_steps import TINY_LOSS_AND_BLOCK2_BACKWARD, plan_of

from ..paths import ROOT

TINY = ROOT / "examples" / "tiny_transformer.sched"
MiB = 2**20
ms = 1e-3

# TINY_TEXT: the pinned copy of examples/tiny_transformer.sched the layered simulator tests use
# (x, h1, h2, h2.grad, h1.grad, x.grad: 8MiB each; loss: 4B)

#: compute time of every plan below that runs each node once: 1.9 + 1.9 + 0.1 + 3.8 + 3.8 ms
COMPUTE = 11.5 * ms


def tiny(offload_s: float | None = None, prefetch_s: float | None = None):
    """The pinned graph; the bandwidths make a 96MiB phantom take `offload_s` / `prefetch_s`
    seconds (None: no bandwidth; 0: infinite bandwidth)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tiny_transformer.sched"
        path.write_text(TINY_TEXT)
        g = load_program([path]).graph
    for chan, secs in (("offload", offload_s), ("prefetch", prefetch_s)):
        if secs is not None:
            g.bandwidths[chan] = math.inf if secs == 0 else 96 * MiB / secs
    return g


# The phantom of block1 (96MiB) is offloaded while block2.fwd runs, dropped, and prefetched
# after block2.bwd, just before block1.bwd.
PLAN_A = f"""
c block1.fwd autograd
o l:block1
d x
c block2.fwd autograd
d h1
w offload l:block1
p block1
{TINY_LOSS_AND_BLOCK2_BACKWARD}
f l:block1
w prefetch l:block1
c block1.bwd autograd
d h1.grad
"""
# the same without transfers: the phantom stays on the device
KEEP = "\n".join(line for line in PLAN_A.splitlines()
                 if line and line[0] not in "ofwp")
# the prefetch is issued before block2.bwd (op 10) and overlaps it
PLAN_B = PLAN_A.replace("f l:block1\n", "").replace("c block2.bwd autograd\n",
                                                     "f l:block1\nc block2.bwd autograd\n")


def run(steps: str, g=None, **kw):
    return simulate(plan_of(steps), g if g is not None else tiny(3 * ms, 2 * ms), **kw)


def errors_of(steps: str, g=None, **kw) -> list[str]:
    r = run(steps, g, **kw)
    assert not r.valid
    return r.errors


# --- valid plans: peak and time by hand ------------------------------------------------------
def test_keeping_the_phantom_is_the_reference():
    r = run(KEEP)
    assert r.valid, r.errors
    # block2.bwd: h2.grad 8 + ph1 96 + ph2 96 + h1.grad 8 + overhead 30 = 238
    assert r.peak_bytes == 238 * MiB
    assert r.time == pytest.approx(COMPUTE) and r.wait_time == 0
    assert r.host_peak_bytes == 0 and r.save_peak_bytes == 200 * MiB


def test_offload_drop_prefetch_wait_is_valid_with_a_smaller_peak():
    r = run(PLAN_A)
    assert r.valid, r.errors
    # block1.fwd: x 8 + h1 8 + ph1 96 + overhead 12 = 124; `d x`: 104
    # block2.fwd: 104 + h2 8 + ph2 96 + overhead 12 = 220 (ph1 is still on the device: the
    #   offload is in flight); `d h1`: 200; the drop after the wait: 104
    # loss: 104 + h2.grad 8 + 4B; `d h2`, `d loss`: h2.grad 8 + ph2 96 = 104
    # block2.bwd: 104 + h1.grad 8 + overhead 30 = 142; ph2 consumed, `d h2.grad`: 8
    # prefetch: 8 + 96 = 104; block1.bwd: 104 + x.grad 8 + overhead 30 = 142
    assert r.peak_bytes == 220 * MiB < run(KEEP).peak_bytes
    assert r.host_peak_bytes == 96 * MiB
    # the offload starts at 1.9ms and lasts 3ms; block2.fwd ends at 3.8ms, so the wait adds
    # 4.9 - 3.8 = 1.1ms; the prefetch (2ms) overlaps nothing: the wait adds 2ms
    assert r.wait_time == pytest.approx(3.1 * ms)
    assert r.time == pytest.approx(COMPUTE + 1.1 * ms + 2 * ms)
    # the loss phase: after block2.fwd, `d h1` and the drop: 104 (200 without the offload)
    assert r.save_peak_bytes == 104 * MiB
    assert r.fits_budget is None
    assert simulate(plan_of(PLAN_A), tiny(3 * ms, 2 * ms), save_budget=120 * MiB).valid
    assert not simulate(plan_of(KEEP), tiny(3 * ms, 2 * ms), save_budget=120 * MiB).valid


def test_a_transfer_shorter_than_the_overlapping_compute_costs_nothing():
    # offload 1ms < block2.fwd's 1.9ms
    r = run(PLAN_A, tiny(1 * ms, 2 * ms))
    assert r.valid, r.errors
    assert r.time == pytest.approx(COMPUTE + 2 * ms) and r.wait_time == pytest.approx(2 * ms)
    # prefetch issued before block2.bwd (3.8ms): 2ms costs nothing, 5ms adds 1.2ms
    r = run(PLAN_B, tiny(1 * ms, 2 * ms))
    assert r.valid, r.errors
    assert r.time == pytest.approx(COMPUTE) and r.wait_time == 0
    r = run(PLAN_B, tiny(1 * ms, 5 * ms))
    assert r.valid, r.errors
    assert r.time == pytest.approx(COMPUTE + 1.2 * ms)
    # the prefetch buffer counts from its issue: block2.bwd sees 104 + 96 + 8 + 30 = 238
    assert r.peak_bytes == 238 * MiB


def test_infinite_bandwidth_takes_no_time():
    r = run(PLAN_A, tiny(0, 0))
    assert r.valid, r.errors
    assert r.time == pytest.approx(COMPUTE) and r.wait_time == 0
    assert r.peak_bytes == 220 * MiB


def test_the_prefetch_buffer_counts_in_the_loss_phase():
    # prefetch right after the drop, before the loss: the loss phase sees it
    steps = PLAN_A.replace("f l:block1\n", "").replace("p block1\n", "p block1\nf l:block1\n")
    r = run(steps)
    assert r.valid, r.errors
    # before the loss: h2 8 + ph2 96 + the prefetched ph1 96 = 200
    assert r.save_peak_bytes == 200 * MiB
    # block2.bwd: h2.grad 8 + ph1 96 + ph2 96 + h1.grad 8 + overhead 30 = 238
    assert r.peak_bytes == 238 * MiB


def test_halves_over_two_steps_time_like_one_whole_transfer():
    # offload 6ms, prefetch 8ms for the whole phantom; each second half is issued while the
    # channel still carries the first, so it starts when the first ends
    whole = PLAN_B.replace("f l:block1\n", "")
    whole = whole.replace("d loss\n", "d loss\nf l:block1\n")
    halves = (whole.replace("o l:block1\n", "o l:block1 0.5\n")
              .replace("c block2.fwd autograd\n", "c block2.fwd autograd\no l:block1 0.5\n")
              .replace("f l:block1\n", "f l:block1 0.5\n")
              .replace("c block2.bwd autograd\n", "c block2.bwd autograd\nf l:block1 0.5\n"))
    a, b = run(whole, tiny(6 * ms, 8 * ms)), run(halves, tiny(6 * ms, 8 * ms))
    assert a.valid, a.errors
    assert b.valid, b.errors
    # offload 1.9 -> 7.9 (wait at 3.8: +4.1); loss 7.9 -> 8.0; prefetch 8.0 -> 16.0 over
    # block2.bwd (8.0 -> 11.8): +4.2; block1.bwd -> 19.8
    assert a.time == pytest.approx(19.8 * ms) and b.time == pytest.approx(a.time)
    assert a.peak_bytes == b.peak_bytes and a.host_peak_bytes == b.host_peak_bytes == 96 * MiB


def test_a_datum_goes_to_the_host_and_back():
    # block1 runs without autograd, x goes to the host, then comes back for the recomputation
    steps = f"""
c block1.fwd fast_forward
o d:x
c block2.fwd autograd
w offload d:x
d x
d h1
{TINY_LOSS_AND_BLOCK2_BACKWARD}
f d:x
w prefetch
c block1.fwd recompute
c block1.bwd recompute
d h1.grad
d h1
d x
"""
    g = tiny(3 * ms, 2 * ms)
    r = run(steps, g)
    assert r.valid, r.errors
    # x is 8MiB: offload 0.25ms within block2.fwd; prefetch 1/6 ms, waited at once
    assert r.time == pytest.approx(1.9 * ms * 3 + 0.1 * ms + 3.8 * ms + 5.7 * ms + 2 * ms / 12)
    assert r.host_peak_bytes == 8 * MiB
    # without the wait, the recomputation uses x too early
    errs = errors_of(steps.replace("w prefetch\n", "").replace("d x\n\n", "").rstrip("\n")
                     + "\nw prefetch d:x\n", g)
    assert errs[0].startswith("op 12: compute 'block1.fwd' needs 'x', which is used before its "
                              "prefetch completed (its prefetch started by op 11 has not "
                              "completed: 1 of it prefetched")


def test_the_shipped_example_with_bandwidths_set_in_python():
    g = load_program([TINY]).graph
    g.bandwidths["offload"] = 32e9
    g.bandwidths["prefetch"] = 32e9
    g.budgets["host"] = 1 << 30
    r = simulate(plan_of(PLAN_A), g)
    assert r.valid, r.errors
    assert r.host_budget_bytes == 1 << 30 and r.host_peak_bytes == 96 * MiB
    assert r.time == pytest.approx(COMPUTE + max(0.0, 96 * MiB / 32e9 - 1.9 * ms)
                                   + 96 * MiB / 32e9)


def test_the_restored_phantom_keeps_its_option():
    errs = errors_of(PLAN_A.replace("c block1.bwd autograd", "c block1.bwd keep_attn"))
    assert any("the phantom of layer 'block1' is saved with option 'autograd' (by op 13)" in e
               for e in errs)
    # while its copy is on the host, another option's forward may save a phantom: then the
    # prefetch finds the layer's phantom slot taken
    steps = PLAN_A.replace("d x\n", "").replace("c block2.bwd autograd\n",
                                                 "c block1.fwd keep_attn\nc block2.bwd autograd\n")
    errs = errors_of(steps)
    assert errs[0] == ("op 12: prefetch of the phantom of layer 'block1', which is on the "
                       "device (saved by op 9): one copy at a time")


def test_result_json_has_the_host_fields():
    obj = run(PLAN_A).to_json()
    assert obj["host_peak_bytes"] == 96 * MiB and obj["host_budget_bytes"] is None
    assert obj["wait_time"] == pytest.approx(3.1 * ms)


# --- errors ------------------------------------------------------------------------------------
def test_freeing_before_the_offload_is_waited():
    errs = errors_of(PLAN_A.replace("w offload l:block1\np block1\n", "p block1\nw offload\n"))
    assert errs == ["op 5: drop_phantom 'block1', but the offload of the phantom of layer "
                    "'block1' (op 1) is not waited: the transfer still reads it (wait on channel "
                    "'offload' first)"]
    errs = errors_of(PLAN_A.replace("o l:block1\nd x\n", "o l:block1\no d:x\nd x\n"))
    assert errs == ["op 3: delete 'x', but the offload of 'x' (op 2) is not waited: the "
                    "transfer still reads it (wait on channel 'offload' first)"]
    # a backward consuming the phantom frees it too
    errs = errors_of(KEEP.replace("c block2.bwd autograd\n", "o l:block2\nc block2.bwd autograd\n")
                     + "\nw offload\n")
    assert errs[0].startswith("op 8: backward 'block2.bwd' consumes the phantom of layer "
                              "'block2', but the offload of the phantom of layer 'block2' (op 7) "
                              "is not waited")


def test_using_before_the_prefetch_completed():
    steps = PLAN_A.replace("w prefetch l:block1\nc block1.bwd autograd\n",
                           "c block1.bwd autograd\nw prefetch l:block1\n")
    errs = errors_of(steps)
    assert errs[0].startswith("op 13: backward 'block1.bwd' with option 'autograd' needs the "
                              "phantom of layer 'block1', which is used before its prefetch "
                              "completed (its prefetch started by op 12 has not completed")
    # half a round is not complete either, even after a wait
    steps = PLAN_A.replace("f l:block1\n", "f l:block1 0.5\n")
    errs = errors_of(steps)
    assert "used before its prefetch completed" in errs[0] and "0.5 of it prefetched" in errs[0]
    assert errs[-1] == ("the prefetch of the phantom of layer 'block1' started by op 12 never "
                        "completed (0.5 of it prefetched; a wait on channel 'prefetch' completes "
                        "it once the fractions sum to 1)")


def test_prefetching_more_than_was_offloaded():
    steps = PLAN_A.replace("o l:block1\n", "o l:block1 0.5\n")
    errs = errors_of(steps)
    assert errs == ["op 12: prefetch of the phantom of layer 'block1' brings back 1 of it in "
                    "this round, more than has been offloaded by then (0.5; an offload counts "
                    "once it has ended: wait on channel 'offload' first)"]
    # the fractions of a round add up
    steps = PLAN_A.replace("o l:block1\n", "o l:block1 0.5\n").replace(
        "f l:block1\n", "f l:block1 0.5\nf l:block1 0.25\n")
    errs = errors_of(steps)
    assert errs[0].startswith("op 13: prefetch of the phantom of layer 'block1' brings back "
                              "0.75 of it")
    with_nothing = PLAN_A.replace("o l:block1\n", "").replace("w offload l:block1\n", "")
    errs = errors_of(with_nothing)
    assert errs[0] == "op 10: prefetch of the phantom of layer 'block1', which was never offloaded"


def test_offloading_more_than_the_whole_tensor():
    steps = PLAN_A.replace("o l:block1\n", "o l:block1 0.6\no l:block1 0.6\n")
    errs = errors_of(steps)
    assert errs[0] == ("op 2: offload of the phantom of layer 'block1' offloads more than the "
                       "whole tensor (0.6 already offloaded, plus 0.6)")
    # the host copy persists: a recomputed datum cannot be offloaded again in full
    steps = """
c block1.fwd autograd
o d:h1
w offload
c block1.fwd autograd
o d:h1
w offload
"""
    errs = run(steps).errors
    assert errs[0] == ("op 4: offload of 'h1' offloads more than the whole tensor (1 already "
                       "offloaded, plus 1)")


def test_no_bandwidth_no_transfer():
    errs = errors_of(PLAN_A, tiny())
    assert errs[0] == ("op 1: offload of the phantom of layer 'block1', but the offload "
                       "bandwidth is 0 (the graph gives none: declare `bandwidth offload ...`), "
                       "so no transfer is possible")
    g = tiny(3 * ms, 2 * ms)
    g.bandwidths["prefetch"] = 0.0
    errs = errors_of(PLAN_A, g)
    assert errs[0].startswith("op 12: prefetch of the phantom of layer 'block1', but the "
                              "prefetch bandwidth is 0")
    g.bandwidths["prefetch"] = -5.0
    errs = errors_of(PLAN_A, g)
    assert errs[0] == ("op 12: prefetch of the phantom of layer 'block1': the graph's prefetch "
                       "bandwidth is -5.0, not a number of bytes per second")


def test_pinned_data_and_phantoms_stay_on_the_device():
    g = tiny(3 * ms, 2 * ms)
    g.layers[0].options[0].pinned = True
    errs = errors_of(PLAN_A, g)
    assert errs[0] == ("op 1: offload of the phantom of layer 'block1', saved with option "
                       "'autograd', which is pinned: its phantom may never be offloaded")
    g = tiny(3 * ms, 2 * ms)
    next(d for d in g.data if d.name == "x").pinned = True
    errs = errors_of(PLAN_A.replace("o l:block1\n", "o l:block1\no d:x\nw offload d:x\n"), g)
    assert errs == ["op 2: offload of 'x', which is pinned: it may never be offloaded",
                    "op 3: wait for 'x' on channel 'offload', but no offload of 'x' was "
                    "issued before"]


def test_the_host_budget():
    g = tiny(3 * ms, 2 * ms)
    g.budgets["host"] = 95 * MiB
    r = simulate(plan_of(PLAN_A), g)
    assert not r.valid and r.fits_budget is False
    assert r.errors == ["op 1: offload of the phantom of layer 'block1' brings host memory to "
                        f"{96 * MiB} B, over the host budget {95 * MiB} B by {MiB} B"]
    assert r.host_peak_bytes == 96 * MiB and r.host_budget_bytes == 95 * MiB
    # an explicit host budget wins over the graph's
    r = simulate(plan_of(PLAN_A), g, host_budget=96 * MiB)
    assert r.valid and r.fits_budget is True and r.host_budget_bytes == 96 * MiB


def test_transfers_never_waited():
    errs = errors_of(PLAN_A + "o d:x.grad 0.5\no d:x.grad 0.25\n")
    assert errs == ["transfer of 'x.grad' on channel 'offload' (ops 16, 17) never waited"]
    # the plan's time is taken after its waits only: an unwaited transfer does not count
    assert run(PLAN_A + "o d:x.grad\n").time == pytest.approx(run(PLAN_A).time)
    assert run(PLAN_A + "o d:x.grad\nw offload\n").valid


def test_prefetching_what_is_on_the_device():
    steps = PLAN_A.replace("p block1\n", "f l:block1\np block1\n")
    errs = errors_of(steps)
    assert errs[0] == ("op 6: prefetch of the phantom of layer 'block1', which is on the device "
                       "(saved by op 0): one copy at a time")
    errs = errors_of(PLAN_A + "o d:x.grad\nw offload\nf d:x.grad\nw prefetch\n")
    assert errs[0] == ("op 18: prefetch of 'x.grad', which is on the device (still in memory): "
                       "one copy at a time")


def test_creating_during_a_prefetch_round():
    steps = f"""
c block1.fwd autograd
c block2.fwd autograd
o d:h1
w offload
d h1
f d:h1
c block1.fwd fast_forward
w prefetch
{TINY_LOSS_AND_BLOCK2_BACKWARD}
c block1.bwd autograd
d h1.grad
d h1
d x
"""
    errs = errors_of(steps)
    assert errs == ["op 6: compute 'block1.fwd' creates 'h1' while a prefetch of 'h1' is in "
                    "progress (started by op 5): one copy at a time"]
    assert run(steps.replace("c block1.fwd fast_forward\n", "")).valid


def test_malformed_transfer_ops_are_reported_not_raised():
    g = tiny(3 * ms, 2 * ms)
    bad = [Op("offload"), Op("prefetch", data="x", layer="block1"),
           Op("offload", data="x", fraction=0.0), Op("offload", data="nope"),
           Op("wait", channel="compute"), Op("wait", channel="offload", data="x", layer="b"),
           Op("prefetch", layer="blok1")]
    r = simulate(Plan(graph="tiny_transformer", ops=bad), g)
    assert r.errors[:7] == [
        "op 0: an offload op names exactly one of 'data' (a data node) or 'layer' (that layer's "
        "saved phantom), not neither",
        "op 1: a prefetch op names exactly one of 'data' (a data node) or 'layer' (that layer's "
        "saved phantom), not both",
        "op 2: the fraction of an offload op must be between 0 (excluded) and 1, not 0.0",
        "op 3: offload of unknown data 'nope'",
        "op 4: wait on channel 'compute': a channel is 'offload' or 'prefetch'",
        "op 5: a wait op names at most one of 'data' or 'layer', not both",
        "op 6: prefetch of unknown layer 'blok1' (did you mean 'block1'?)",
    ]


def test_random_transfer_ops_never_raise():
    import random
    rng = random.Random(7)
    g = tiny(3 * ms, 2 * ms)
    g.budgets["host"] = 150 * MiB
    base = plan_of(PLAN_A).ops
    targets = [{"data": d.name} for d in g.data] + [{"layer": "block1"}, {"layer": "block2"}]
    for _ in range(300):
        ops = list(base)
        inserted = []
        for _ in range(rng.randint(1, 6)):
            kind = rng.choice(["offload", "prefetch", "wait", "delete", "drop_phantom"])
            t = rng.choice(targets)
            if kind == "wait":
                op = Op("wait", channel=rng.choice(["offload", "prefetch", "prefetch", "bogus"]),
                        **(t if rng.random() < 0.7 else {}))
            elif kind in ("offload", "prefetch"):
                op = Op(kind, fraction=rng.choice([None, 0.25, 0.5, 1.0, 1.5]), **t)
            elif kind == "delete":
                op = Op("delete", data=t.get("data", "h1"))
            else:
                op = Op("drop_phantom", layer=t.get("layer", "block1"))
            ops.insert(rng.randint(0, len(ops)), op)
            inserted.append(op)
        r = simulate(Plan(graph="tiny_transformer", ops=ops), g)
        # the base plan replays valid: every error is located at or after the first inserted op
        first = min(k for k, op in enumerate(ops) if any(op is x for x in inserted))
        located = [int(m.group(1)) for e in r.errors if (m := re.match(r"op (\d+):", e))]
        assert all(k >= first for k in located), (first, r.errors)
        assert r.time >= COMPUTE - 1e-12 and r.peak_bytes >= 0


def test_checkmate_graphs_still_report_transfers_as_unsupported():
    from schedlang.graphs.graph import Graph, Node
    g = Graph(name="chain", nodes=[Node("a", 1.0, 4)])
    r = simulate(Plan(graph="chain", ops=[Op("compute", node="a"), Op("offload", data="a")]), g)
    assert r.errors == ["op 1: offload ops are not supported for this graph (graph 'chain' is "
                        "in the Checkmate view; transfers are replayed on layered graphs only)"]
    assert r.host_peak_bytes is None


# --- the plan file ----------------------------------------------------------------------------
def test_plan_json_round_trip_of_the_transfer_fields():
    plan = plan_of(PLAN_A.replace("o l:block1\n", "o l:block1 0.5\no l:block1 0.5\n")
                   + "o d:x.grad 0.25\nw offload d:x.grad\n")
    back = Plan.loads(plan.dumps())
    assert back == plan
    ops = back.to_json()["ops"]
    assert {"op": "offload", "layer": "block1", "fraction": 0.5} in ops
    assert {"op": "offload", "data": "x.grad", "fraction": 0.25} in ops
    assert {"op": "wait", "layer": "block1", "channel": "offload"} in ops
    assert {"op": "prefetch", "layer": "block1"} in ops
    assert simulate(back, tiny(3 * ms, 2 * ms)).valid


@pytest.mark.parametrize("op, expected", [
    ({"op": "offload"}, "op 1: an offload op names exactly one of 'data' (a data node) or "
                        "'layer' (that layer's saved phantom), not neither"),
    ({"op": "prefetch", "data": "x", "layer": "b"}, "op 1: a prefetch op names exactly one of "
                                                   "'data'"),
    ({"op": "offload", "data": "x", "fraction": 0}, "op 1: field 'fraction' must be between 0 "
                                                    "(excluded) and 1, not 0"),
    ({"op": "offload", "data": "x", "fraction": 1.5}, "must be between 0 (excluded) and 1"),
    ({"op": "prefetch", "layer": "b", "fraction": "half"}, "op 1: field 'fraction' must be a "
                                                           "number, not a string"),
    ({"op": "wait", "channel": "prefetc"}, "op 1: field 'channel' must be one of 'offload', "
                                           "'prefetch', not 'prefetc' (did you mean 'prefetch'?)"),
    ({"op": "wait", "channel": "offload", "data": "x", "layer": "b"},
     "op 1: a wait op names at most one of 'data' or 'layer', not both"),
    ({"op": "wait", "channel": "offload", "fraction": 0.5}, "op 1: unexpected field 'fraction'"),
])
def test_bad_transfer_ops_in_a_plan_file(op, expected):
    obj = {"schema": SCHEMA, "graph": "g", "ops": [{"op": "compute", "node": "a"}, op]}
    with pytest.raises(DataError) as info:
        Plan.loads(json.dumps(obj), "p.json")
    assert expected in info.value.message
    assert str(info.value).startswith("p.json")


# --- the .sched syntax: bandwidths, host budget, pinned -----------------------------------------
SYNTAX = """
graph one "one layer" {
  data x      8MiB input pinned
  data h      8MiB
  data lv     4B
  data h.grad 8MiB
  data x.grad 8MiB output
  layer b (x) -> (h) {
    grad (h.grad) -> (x.grad)
    option ag    fwd 1ms bwd 2ms phantom 16MiB
    option fixed fwd 1ms bwd 2ms phantom 16MiB pinned
  }
  loss (h) -> (lv, h.grad) time 1ms
}
bandwidth offload 16GB/s
bandwidth prefetch inf
budget host 8GiB
"""

ONE = """
c b.fwd ag
o l:b
w offload l:b
p b
c loss
d h
d lv
f l:b
w prefetch l:b
c b.bwd ag
d h.grad
"""


def test_bandwidths_host_budget_and_pinned_from_the_language(tmp_path):
    path = tmp_path / "one.sched"
    path.write_text(SYNTAX)
    g = load_program([path]).graph
    r = simulate(plan_of(ONE), g)
    assert r.valid, r.errors
    # the offload (16MiB at 16GB/s) starts at 1ms and nothing overlaps it; the prefetch is free
    assert r.time == pytest.approx(1e-3 + 16 * MiB / 16e9 + 1e-3 + 2e-3)
    assert r.wait_time == pytest.approx(16 * MiB / 16e9)
    assert r.host_peak_bytes == 16 * MiB and r.host_budget_bytes == 8 * 2**30
    errs = errors_of(ONE.replace("ag", "fixed"), g)
    assert errs[0] == ("op 1: offload of the phantom of layer 'b', saved with option 'fixed', "
                       "which is pinned: its phantom may never be offloaded")
    errs = errors_of(ONE + "o d:x\nw offload\n", g)
    assert errs == ["op 11: offload of 'x', which is pinned: it may never be offloaded"]
