"""`schedlang.pytorch.live`: every live tensor storage of the process, as the CPU tracker and the
leak checks count them."""
from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

from schedlang.pytorch.live import live_bytes, live_storages  # noqa: E402


@pytest.fixture
def warn_always():
    """torch's warnings that fire once per process fire every time (whatever ran before)."""
    was = torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    yield
    torch.set_warn_always(was)


def test_a_traced_graphs_fake_tensors_are_skipped_without_a_warning(warn_always):
    """make_fx keeps fake tensors in its graphs' nodes (`node.meta["val"]`), and the process's
    caches of op graphs keep those graphs: a scan meets them, and reading a fake storage's
    data pointer warns (a later torch raises). They hold no bytes: skipped, silently."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    real = torch.ones(1000)
    with FakeTensorMode():
        fake = torch.ones(1 << 16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        found = live_storages()
        left = live_bytes(exclude=found)
    assert real.untyped_storage().data_ptr() in found
    assert left == 0
    del fake
