"""The PyTorch tests measure training steps, and a measured step counts every tensor alive in
the process, as CUDA's allocator does: what one test leaves alive would be counted by the
tests after it, and their results would depend on the order they ran in."""
from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch")

from schedlang.pytorch import options  # noqa: E402
from schedlang.pytorch.frontends.blocks import block_ops  # noqa: E402


@pytest.fixture(autouse=True)
def _nothing_left_alive():
    """After each test: drop a failed test's frames, which Python keeps for post-mortem
    debugging (`sys.last_traceback`: they hold its models). The reference cycles a test
    leaves (torch.fx's graph modules are cycles: freed by the collector, not at once) are
    collected when the next test that may measure a step starts (`tests/conftest.py`): one
    full collection per test, not two (each costs about a second with transformers loaded)."""
    yield
    # the op-level option caches of the process (layers', blocks'): each test generates its own
    options.CACHE.clear()
    block_ops.CACHE.clear()
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            setattr(sys, name, None)
