"""Jobs for tests/test_parallel.py: module-level, so that worker processes can import them."""
from __future__ import annotations

import os
import time

from schedlang.language.errors import Loc, SchedError


def square_late(item: int, scale: int = 1, delay: float = 0.0) -> tuple[int, int]:
    """item² × scale, the small items finishing last; with the worker's pid."""
    time.sleep(delay * (5 - item % 5))
    return item * item * scale, os.getpid()


def fails_on_three(item: int) -> int:
    if item == 3:
        raise ValueError("three is not allowed")
    return item


def bad_input_on_two(item: int) -> int:
    if item == 2:
        raise SchedError("item two is bad input", Loc("input.sched", 7, 3))
    return item


def sleep_and_note(item: int, folder: str) -> int:
    with open(os.path.join(folder, f"{os.getpid()}.pid"), "w") as f:
        f.write(str(item))
    time.sleep(120)
    return item


def after_gate(item: int, gate: str) -> int:
    """`item`, once the file `gate` exists (item 0 at once): the test opens the gate when
    the parent has handled item 0's result (no sleep decides the order of events)."""
    deadline = time.monotonic() + 120
    while item != 0 and not os.path.exists(gate):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the gate {gate} never opened")
        time.sleep(0.005)  # waiting on the file, not timing the test
    return item


def dies(item: int) -> int:
    if item == 1:
        os._exit(3)  # as a worker killed by the system would
    return item
