"""Shared test configuration: tests marked `gpu` skip without CUDA.

Helpers shared by several test files live in modules of their own, not in test files:
`paths` (where examples and graphs are), `checkmate_instances` and `layered_instances` (tiny
graphs of both views), `bruteforce*` (exhaustive oracles), `irmodels`, `torch_models`; pinned
plans and texts are under `data/` (see tests/README.md)."""
from __future__ import annotations

import os

import pytest

# Progress lines (schedlang.progress) appear once a command has run a second: on a loaded
# machine a test's stderr would depend on timing. Off for the suite (and the commands it
# starts); tests/test_progress.py drives the display with a fake clock.
os.environ.setdefault("SCHEDLANG_PROGRESS", "off")


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


