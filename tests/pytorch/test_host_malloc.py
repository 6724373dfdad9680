"""glibc's malloc held steady for CPU steps (`schedlang/pytorch/host_malloc.py`): each case runs
in a fresh interpreter, since the setting lasts for the rest of a process. The effect is checked
on what the system sees (the resident size after a large block is freed), not on any timing."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from schedlang.pytorch import host_malloc

pytestmark = pytest.mark.skipif(not host_malloc.CAN_HOLD, reason="glibc's malloc only")

#: malloc a block, touch every page, free it: the resident size (bytes) before, with, after
_ROUND_TRIP = r'''
import ctypes, importlib.util, json, os, sys
spec = importlib.util.spec_from_file_location("host_malloc", sys.argv[2])
host_malloc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(host_malloc)  # the module alone: no torch to import
first = host_malloc.hold_freed_memory() if sys.argv[1] == "hold" else None
again = host_malloc.hold_freed_memory() if sys.argv[1] == "hold" else None
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
page = os.sysconf("SC_PAGE_SIZE")
def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page
size = 24 * 1024 * 1024  # below the held mmap threshold, far above glibc's starting one
before = resident()
block = libc.malloc(size)
ctypes.memset(block, 1, size)
during = resident()
libc.free(block)
print(json.dumps({"first": first, "again": again, "held": host_malloc.held(),
                  "before": before, "during": during, "after": resident()}))
'''


def _round_trip(mode: str, **env) -> dict:
    # glibc's own settings from the environment left out: each case starts from its defaults
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES", host_malloc.ENV)}
    done = subprocess.run([sys.executable, "-c", _ROUND_TRIP, mode, host_malloc.__file__],
                          capture_output=True, text=True, check=True, env={**base, **env})
    return json.loads(done.stdout)


def test_held_memory_stays_with_the_process_for_the_next_step():
    got = _round_trip("hold")
    assert got["first"] is got["again"] is got["held"] is True
    assert got["during"] - got["before"] >= 20 * 2 ** 20  # the block was resident
    assert got["during"] - got["after"] < 2 ** 20, got  # and stays so once freed


def test_by_default_glibc_hands_a_large_freed_block_back():
    """The premise: what the held setting changes (a freed large block leaves the process)."""
    got = _round_trip("leave")
    assert got["held"] is False
    assert got["during"] - got["after"] >= 20 * 2 ** 20, got


def test_the_environment_leaves_glibc_adaptive():
    got = _round_trip("hold", **{host_malloc.ENV: "adaptive"})
    assert got["first"] is got["again"] is got["held"] is False
    assert got["during"] - got["after"] >= 20 * 2 ** 20, got
