"""The H-graph derived from layered graph data (data, layers with options, loss)."""
from __future__ import annotations

import pytest

from schedlang.graphs.hgraph import FAST_FORWARD, build_hgraph
from schedlang.language.errors import DataError
from schedlang.language.program import load_program
from schedlang.testing.layered_instances import chain, opt, skip3

from ..paths import ROOT


def hgraph_of(text: str, tmp_path):
    path = tmp_path / "g.sched"
    path.write_text(text)
    return build_hgraph(load_program([path]).graph)


def test_tiny_transformer_order_options_and_phantoms():
    h = build_hgraph(load_program([ROOT / "examples" / "tiny_transformer.sched"]).graph)
    assert [k.name for k in h.compute] == ["block1.fwd", "block2.fwd", "loss", "block2.bwd", "block1.bwd"]
    fwd1 = h.node("block1.fwd")
    assert [o.name for o in fwd1.options] == ["autograd", "recompute", "keep_attn", FAST_FORWARD]
    assert [o.name for o in h.node("block1.bwd").options] == ["autograd", "recompute", "keep_attn"]
    assert h.node("block1.bwd").options[1].time == pytest.approx(5.7e-3)
    assert h.phantoms[("block1", "keep_attn")] == 40 * 2**20
    assert h.option_uses == [("block2.bwd", "recompute", "h1"), ("block1.bwd", "recompute", "x"),
                             ("block1.bwd", "keep_attn", "h1")]
    assert h.inputs == ["x"] and h.outputs == ["x.grad"]
    assert ("loss", "h2.grad") in h.creates and ("block2.bwd", "h2.grad") in h.uses


SKIP = """
graph skip {
  data x 4MiB input
  data a 4MiB
  data b 4MiB
  data l 4B
  data b.grad 4MiB
  data a.grad 4MiB
  data x.grad 4MiB output
  layer down (x) -> (a) { grad (a.grad) -> (x.grad)
    option autograd fwd 1ms bwd 2ms phantom 8MiB }
  layer mid (a) -> (b) { grad (b.grad) -> (a.grad)
    option autograd fwd 1ms bwd 2ms phantom 8MiB }
  layer up (a, b) -> (l) { grad () -> (a.grad, b.grad)
    option autograd fwd 1ms bwd 2ms phantom 8MiB }
  loss (l) -> () time 0.1ms
}
"""


def test_a_gradient_with_two_contributions_has_two_creators(tmp_path):
    h = hgraph_of(SKIP, tmp_path)
    assert sorted(h.creators()["a.grad"]) == ["mid.bwd", "up.bwd"]
    assert h.users()["a"] == ["mid.fwd", "up.fwd"]  # used far from where it is produced


@pytest.mark.parametrize("edit,message", [
    (("loss (l) -> () time 0.1ms", ""), "has layers but no `loss"),
    (("data x 4MiB input", "data x 4MiB"), "data 'x' is read by 'down.fwd' but nothing creates it"),
    (("option autograd fwd 1ms bwd 2ms phantom 8MiB }\n  layer mid", "option fast_forward fwd 1ms }\n  layer mid"),
     "layer 'down' has no backward (its only option is `fast_forward`), so it takes no `grad` statement"),
    (("option autograd fwd 1ms bwd 2ms phantom 8MiB }\n  layer mid",
      "option autograd fwd 1ms bwd 2ms phantom 8MiB\n    option fast_forward fwd 1ms bwd 1ms }\n  layer mid"),
     "option 'fast_forward' of layer 'down' is the forward without autograd: it takes `fwd`, `overhead` "
     "and `fwd_steps` only, not `bwd`"),
    (("grad (b.grad) -> (a.grad)\n    option autograd fwd 1ms bwd 2ms phantom 8MiB",
      "grad (b.grad) -> (a.grad)\n    option autograd fwd 1ms bwd 2ms phantom 8MiB needs (l)"),
     "needs 'l', which is neither an input nor an output"),
])
def test_inconsistent_layers_are_located_errors(tmp_path, edit, message):
    old, new = edit
    assert old in SKIP
    with pytest.raises(DataError) as err:
        hgraph_of(SKIP.replace(old, new), tmp_path)
    assert message in str(err.value)
    assert str(err.value).startswith(str(tmp_path / "g.sched") + ":")


def test_layers_out_of_topological_order_are_rejected(tmp_path):
    text = SKIP.replace("layer mid (a) -> (b)", "layer mid (l) -> (b)")
    with pytest.raises(DataError) as err:
        hgraph_of(text, tmp_path)
    assert "topological order" in str(err.value)


def test_layered_data_round_trips_through_the_writer_with_profiles(tmp_path):
    from schedlang.graphs.writer import write_graph

    g = load_program([ROOT / "examples" / "profiled.sched"]).graph
    out = tmp_path / "again.sched"
    out.write_text(write_graph(g))
    again = load_program([out]).graph
    def strip(layers):
        return [(l.name, l.inputs, l.outputs, [(o.name, o.phantom, o.needs, o.fwd_steps, o.bwd_steps)
                                               for o in l.options]) for l in layers]

    assert strip(again.layers) == strip(g.layers)
    assert any(o.fwd_steps for l in again.layers for o in l.options)


FF = """
graph ff {
  data x 4MiB input
  data h1 4MiB
  data l 4B
  data h1.grad 4MiB
  data x.grad 4MiB output
  layer L1 (x) -> (h1) { grad (h1.grad) -> (x.grad)
    option autograd fwd 1ms overhead 2MiB bwd 2ms phantom 8MiB
        fwd_steps (64MiB, 4MiB frees (x) creates (h1))
    option recompute fwd 1.5ms overhead 1MiB bwd 3ms phantom 0 needs (x) }
  loss (h1) -> (l, h1.grad) time 0.1ms
}
"""


def test_fast_forward_not_stated_is_derived_conservatively(tmp_path):
    """Issue 12 item 1: a forward with a 64 MiB `fwd_steps` workspace used to give fast_forward
    an overhead of 0 (the least flat overhead; the profile dropped). It is now the largest
    forward transient of the options (64 MiB), its time the least forward time."""
    h = hgraph_of(FF, tmp_path)
    ff = h.node("L1.fwd").options[-1]
    assert ff.name == FAST_FORWARD
    assert ff.overhead == 64 * 2**20 and ff.steps == []
    assert ff.time == pytest.approx(1e-3)


def test_fast_forward_stated_is_read_as_given_by_hgraph_simulator_and_model(tmp_path):
    from schedlang.graphs.writer import write_graph
    from schedlang.plans.plan import Op, Plan
    from schedlang.plans.simulate import simulate

    text = FF.replace("needs (x) }", "needs (x)\n    option fast_forward fwd 0.5ms overhead 10MiB\n"
                      "        fwd_steps (12MiB, 3MiB frees (x) creates (h1)) }")
    path = tmp_path / "g.sched"
    path.write_text(text)
    g = load_program([path]).graph
    ff = build_hgraph(g).node("L1.fwd").options[-1]
    assert (ff.name, ff.time, ff.overhead) == (FAST_FORWARD, pytest.approx(5e-4), 10 * 2**20)
    assert [(st.overhead, st.frees, st.creates) for st in ff.steps] == [(12 * 2**20, [], []),
                                                                        (3 * 2**20, ["x"], ["h1"])]
    # the writer keeps it
    again = tmp_path / "again.sched"
    again.write_text(write_graph(g))
    ff_again = load_program([again]).graph.layers[0].fast_forward
    assert (ff_again.fwd_time, ff_again.fwd_overhead, ff_again.fwd_steps) == \
        (g.layers[0].fast_forward.fwd_time, 10 * 2**20, g.layers[0].fast_forward.fwd_steps)
    # the simulator reads the same numbers: x (4 MiB) + the 12 MiB step (h1 not created yet)
    ops = [Op("compute", node="L1.fwd", option=FAST_FORWARD), Op("delete", data="h1"),
           Op("compute", node="L1.fwd", option="recompute"), Op("compute", node="loss"),
           Op("compute", node="L1.bwd", option="recompute")]
    assert simulate(Plan(graph="ff", ops=ops[:1]), g).peak_bytes == 16 * 2**20
    sim = simulate(Plan(graph="ff", ops=ops), g)
    assert sim.valid, sim.errors


def test_chained_layers_are_those_one_checkpoint_can_hold_as_a_group():
    """`chained` (a, b): b right after a and the only reader of a's outputs, none of them
    returned: a chain, then a skip connection (a.out read twice), a returned output and the
    loss's input break it."""
    keep = [opt("keep", 1, 2, 1)]
    g = chain("c", [1, 1, 1, 1], [keep, keep, keep])
    assert build_hgraph(g).chained == [("L1", "L2"), ("L2", "L3")]
    assert build_hgraph(skip3("s", [keep, keep, keep])).chained == [("B", "C")]
    g.data = [d if d.name != "h1" else type(d)(d.name, d.size, "output") for d in g.data]
    assert build_hgraph(g).chained == [("L2", "L3")]
