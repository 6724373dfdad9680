"""Profiles as data for the tests. Which options the op-level generator offers (its solves
minimise time within a memory fraction) and which plan the solver picks depend on measured
times, so a test whose assertions need one set of options pins the times: every machine and
every load then gives the same options."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable


def pin_op_times(og) -> None:
    """Times as data in place of the measured ones on an op graph (`opgraph.OpGraph`): each
    unit's forward 1 us plus 1 ns per byte it creates (a memory-bound CPU), its backward
    twice that where it has one."""
    for u in og.units:
        u.fwd_time = 1e-6 + 1e-9 * u.created
        u.bwd_time = 2 * u.fwd_time if u.has_backward else 0.0


def with_pinned_op_times(record_ops: Callable) -> Callable:
    """`record_ops` (`opgraph.record_ops`) whose op graphs carry pinned times (`pin_op_times`):
    monkeypatch it where the generator looks it up."""
    def record(*args, **kwargs):
        og = record_ops(*args, **kwargs)
        pin_op_times(og)
        return og

    return record


#: per-option backward times of `pin_block_times` (s): a rerun (recompute's backward over
#: autograd's) costs exactly a forward, selective half of it; the option ``rerun`` (the same
#: memory as ``recompute``) a little more than ``recompute``, so that the plans tests pin with
#: these times stay the ones they were written for (tests of ``rerun`` pin their own)
PINNED_BLOCK_BWD = {"autograd": 2e-3, "recompute": 3e-3, "selective": 2.5e-3, "rerun": 3.1e-3}


def pin_block_times(graph, blocks, fwd: float = 1e-3, bwd: dict | None = None,
                    phantom: dict | None = None, overhead: int | None = None):
    """A copy of the layered `graph` whose `blocks` (layer names) carry times as data in place
    of the measured ones: every forward (fast_forward too) `fwd` seconds, each option's
    backward `bwd[option]` (`PINNED_BLOCK_BWD`; an option not named keeps its measured time).
    `phantom` (option -> bytes) and `overhead` (bytes, every forward's and backward's, without
    sub-step profiles): the blocks' memory as data too, where a test needs plans that the
    measured memory does not make optimal (the plan's measured peak is then not its
    prediction). The other layers (the hook front end's glue) run once in every plan, so
    their measured times shift every plan alike."""
    bwd = PINNED_BLOCK_BWD if bwd is None else bwd
    names = set(blocks)

    def pinned(o, forward_only=False):
        o = dataclasses.replace(o, fwd_time=fwd)
        if not forward_only:
            o = dataclasses.replace(o, bwd_time=bwd.get(o.name, o.bwd_time))
        if phantom is not None and o.name in phantom:
            o = dataclasses.replace(o, phantom=int(phantom[o.name]))
        if overhead is not None:
            o = dataclasses.replace(o, fwd_overhead=int(overhead), bwd_overhead=int(overhead),
                                    fwd_steps=[], bwd_steps=[])
        return o

    layers = []
    for lay in graph.layers:
        if lay.name in names:
            ff = None if lay.fast_forward is None else pinned(lay.fast_forward, True)
            lay = dataclasses.replace(lay, options=[pinned(o) for o in lay.options],
                                      fast_forward=ff)
        layers.append(lay)
    return dataclasses.replace(graph, layers=layers)
