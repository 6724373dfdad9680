"""glibc's malloc held steady, so that CPU training steps take the same time from step to step.

PyTorch's CPU tensors come from the C library's `malloc`. By default glibc adapts two
thresholds as the process runs: the size above which a block is mapped on its own (`mmap`)
and the free space at the top of the heap above which it is handed back to the system. Which
of a step's tensors land where then depends on the process's allocation history, and a block
handed back is faulted in again, page by page, by the next step that needs it. The same plan's
step measured +20% to +31% over plain execution from one process to the next, and 9% or 45%
within one process before and after an optimizer allocated its state (bench/README.md,
"Models the time model was not tuned on"): a time model cannot be trusted against that.

`hold_freed_memory()` fixes both thresholds, as `MALLOC_MMAP_THRESHOLD_` and
`MALLOC_TRIM_THRESHOLD_` in the environment would: memory a step frees stays with the process
for the next step, as CUDA's caching allocator keeps it on a GPU. The process's resident size
stays at the largest step's instead of shrinking between steps. `fit` calls it before it
profiles a model on the CPU and states it in `memory_report()`; `SCHEDLANG_HOST_MALLOC=adaptive`
in the environment leaves glibc as it is. Off glibc (musl, macOS) nothing is changed; where
jemalloc or tcmalloc is preloaded, the calls reach glibc's unused heap or a no-op, and that
allocator's own caching keeps step times steady.
"""
from __future__ import annotations

import ctypes
import logging
import os
import platform

log = logging.getLogger("schedlang.pytorch")

__all__ = ["ENV", "CAN_HOLD", "hold_freed_memory", "held"]

#: the environment variable that turns this off (value ``adaptive``)
ENV = "SCHEDLANG_HOST_MALLOC"

# mallopt's parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: the largest mmap threshold glibc accepts on a 64-bit system (half its 64 MiB heap maximum):
#: blocks above it are mapped on their own whatever the setting
_MMAP_THRESHOLD = 32 * 1024 * 1024
#: free space at the heap's top kept rather than handed back (glibc's int parameter)
_TRIM_THRESHOLD = 2 ** 31 - 1

#: whether this process can hold its malloc steady here (Linux's glibc, not turned off)
CAN_HOLD = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc" and \
    os.environ.get(ENV, "").strip().lower() != "adaptive"

_state: dict[str, bool] = {}


def held() -> bool:
    """Whether this process's malloc thresholds were fixed by `hold_freed_memory`."""
    return _state.get("held", False)


def hold_freed_memory() -> bool:
    """Fix glibc's mmap and trim thresholds for the rest of the process (once; later calls
    return the first answer). Returns whether they are fixed: False where the C library is
    not glibc, where `mallopt` refuses, or where ``SCHEDLANG_HOST_MALLOC=adaptive``."""
    if "held" in _state:
        return _state["held"]
    _state["held"] = False
    if not CAN_HOLD:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD) == 1 and \
        mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD) == 1
    if done:
        log.info("schedlang fit: glibc's malloc keeps freed memory for the next step (steady "
                 "CPU step times; %s=adaptive leaves it as it was)", ENV)
    _state["held"] = done
    return done
