"""Shared test configuration: tests marked `gpu` skip without CUDA.

Helpers shared by several test files live in modules of their own, not in test files:
`paths` (where examples and graphs are), `checkmate_instances` and `layered_instances` (tiny
graphs of both views), `bruteforce*` (exhaustive oracles), `irmodels`, `torch_models`; pinned
plans and texts are under `data/` (see tests/README.md)."""
from __future__ import annotations

import functools
import os
import sys

import pytest

# Progress lines (schedlang.progress) appear once a command has run a second: on a loaded
# machine a test's stderr would depend on timing. Off for the suite (and the commands it
# starts); tests/test_progress.py drives the display with a fake clock.
os.environ.setdefault("SCHEDLANG_PROGRESS", "off")
# `fit` times its plan against plain execution before returning (schedlang.pytorch.steptime):
# up to tens of steps per fit, which the suite's hundreds of fits do not need; the tests of
# that timing ask for it (`time_plan=True`).
os.environ.setdefault("SCHEDLANG_TIME_PLAN", "off")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if any("gpu" in item.keywords for item in items) and not _cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)




#: what a test file's text holds if its tests may run a measured step: PyTorch itself, or the
#: commands that fit or trace a PyTorch module
_TORCH_WORDS = ("torch", '"run"', '"trace"')


@functools.cache
def _may_measure(path) -> bool:
    """Whether the tests of the file at `path` may measure a training step. The others (the
    language, solver, plan and formulation tests: most of the suite) skip the fixture below,
    whose full collection and walk of every live object costs about a second per test in a
    worker where torch and transformers are loaded."""
    text = path.read_text(encoding="utf-8")
    return any(word in text for word in _TORCH_WORDS)


@pytest.fixture(autouse=True)
def _measured_as_in_a_process_of_its_own(request, monkeypatch):
    """A measured training step counts every storage alive when it starts, as CUDA's allocator
    does: in the suite, that includes what earlier tests in the same worker left to torch's and
    Python's caches (device meshes, cached graphs). Each test measures as if it ran in a
    process of its own: the storages alive when it starts are not counted (held here, so that
    no storage of the test reuses their addresses); what the test itself keeps is. (Only where
    the PyTorch wing is loaded already: the other tests measure no steps.)"""
    memory = sys.modules.get("schedlang.pytorch.memory")
    if memory is None or not _may_measure(request.node.path):
        yield
        return
    import gc

    from schedlang.pytorch.live import live_storages

    gc.collect()
    if not gc.get_freeze_count():
        # what the worker imported (torch, transformers: ~400,000 objects) is moved out of
        # the collector's generations once: each later collection and storage scan here (per
        # test) walks what the tests made since, not all of it (0.25 s a test before). A
        # storage alive now is out of every scan, as the earlier ones below are out of the count
        gc.freeze()
    earlier = live_storages()

    def without_earlier(device="cpu"):
        return {k: s for k, s in live_storages(device).items() if k not in earlier}

    monkeypatch.setattr(memory, "live_storages", without_earlier)
    yield
