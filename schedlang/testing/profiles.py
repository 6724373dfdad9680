"""Profiles as data for the tests. Which options the op-level generator offers (its solves
minimise time within a memory fraction) and which plan the solver picks depend on measured
times, so a test whose assertions need one set of options pins the times: every machine and
every load then gives the same options."""
from __future__ import annotations

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
