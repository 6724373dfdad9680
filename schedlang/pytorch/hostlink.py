"""The host link: how fast tensors move between the compute device and host memory.

`fit(..., bandwidth=...)` takes the link as bytes per second, a text rate (``"16GB/s"``,
``"inf"``) or ``"auto"``:

* on CUDA, ``"auto"`` measures it (`measure_host_link`): pinned copies device -> host and
  host -> device, a few sizes each, several times; each direction's rate is the median over
  its samples. The two rates become the graph's ``bandwidth offload`` and ``bandwidth
  prefetch``.
* on the CPU the model's memory *is* host memory. The runtimes still run offload plans there
  (into a separate buffer the CPU tracker does not count: what the tests use to check the CUDA
  code paths on any machine), but moving a tensor from RAM to RAM saves nothing, so ``"auto"``
  gives no link: the plan recomputes only, and `fit` logs why.

`host_buffer` is the one place the runtimes allocate host copies (pinned on CUDA, outside any
CPU tracker's dispatch mode, so that a host copy is never counted as device memory); the
storages it made are in `HOST_COPIES` while they live.
"""
from __future__ import annotations

import logging
import statistics
import weakref
from dataclasses import dataclass, field

import torch

from ..language.errors import SchedError
from ..language.units import parse_rate

__all__ = ["HostLink", "measure_host_link", "resolve_link", "host_buffer", "HOST_COPIES",
           "AUTO"]

log = logging.getLogger("schedlang.pytorch")

AUTO = "auto"
#: copy sizes `measure_host_link` times (bytes), each capped to an eighth of free memory
SIZES = (16 << 20, 64 << 20, 256 << 20)
#: timed copies per size and direction (after one warm-up copy)
REPEATS = 5
#: why ``bandwidth="auto"`` gives no link on the CPU
CPU_NOTE = ("bandwidth='auto' on the CPU: the model's memory is host memory, and offloading "
            "would copy tensors from RAM to RAM and save nothing; the plan recomputes only")

#: data_ptr -> storage of every live host copy made by `host_buffer`
HOST_COPIES: weakref.WeakValueDictionary[int, torch.UntypedStorage] = \
    weakref.WeakValueDictionary()


def host_buffer(shape, dtype, device: torch.device, stride=None) -> torch.Tensor:
    """An empty host tensor for a copy of a tensor on `device`: pinned when `device` is a
    GPU (asynchronous copies), made outside any dispatch mode (a CPU tracker counts the
    compute device's tensors, and a host copy is not one of them)."""
    from torch.utils._python_dispatch import _disable_current_modes

    pinned = device.type == "cuda"
    with _disable_current_modes():
        if stride is None:
            t = torch.empty(shape, dtype=dtype, device="cpu", pin_memory=pinned)
        else:
            t = torch.empty_strided(shape, stride, dtype=dtype, device="cpu", pin_memory=pinned)
    storage = t.untyped_storage()
    if storage.data_ptr():
        HOST_COPIES[storage.data_ptr()] = storage
    return t


@dataclass
class HostLink:
    """Bytes per second each way, and how they were found."""

    offload: float  # device -> host
    prefetch: float  # host -> device
    measured: bool = False
    # (bytes, seconds) per timed copy, each direction (`measure_host_link`)
    samples: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"offload": self.offload, "prefetch": self.prefetch, "measured": self.measured}


def _cuda_copy_seconds(device: torch.device, nbytes: int, direction: str) -> float:
    """Seconds of one pinned copy of `nbytes` (direction "offload": device -> host, else
    host -> device), timed with CUDA events on a stream of its own."""
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    stream = torch.cuda.Stream(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        start.record(stream)
        if direction == "offload":
            host.copy_(dev, non_blocking=True)
        else:
            dev.copy_(host, non_blocking=True)
        end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) / 1000.0


def measure_host_link(device: torch.device, sizes=SIZES, repeats: int = REPEATS,
                      copy_seconds=None) -> HostLink:
    """The host link of a CUDA `device`, measured: for each size (capped to an eighth of the
    free device memory) one warm-up and `repeats` timed pinned copies each way
    (`copy_seconds(device, nbytes, direction)`, default CUDA events); each direction's rate is
    the median of bytes / seconds over its samples."""
    copy_seconds = copy_seconds or _cuda_copy_seconds
    cap = None
    if copy_seconds is _cuda_copy_seconds:
        free, _total = torch.cuda.mem_get_info(device)
        cap = max(1 << 20, free // 8)
    samples: dict[str, list] = {"offload": [], "prefetch": []}
    for nbytes in sorted({min(int(n), cap) if cap else int(n) for n in sizes}):
        for direction in samples:
            copy_seconds(device, nbytes, direction)  # warm-up (pinned pages, the stream)
            for _ in range(repeats):
                samples[direction].append((nbytes, copy_seconds(device, nbytes, direction)))
    rates = {}
    for direction, got in samples.items():
        per = [n / s for n, s in got if s > 0]
        if not per:
            raise SchedError(f"bandwidth='auto': no {direction} copy could be timed")
        rates[direction] = statistics.median(per)
    return HostLink(rates["offload"], rates["prefetch"], True, samples)


def resolve_link(bandwidth, device: torch.device, measure=None):
    """(`HostLink` or None, a note): the link `fit(bandwidth=...)` plans with on `device`.
    A number or rate text is the same both ways; ``"auto"`` measures it on CUDA (`measure`,
    default `measure_host_link`) and gives None on other devices (`CPU_NOTE`)."""

    if isinstance(bandwidth, str) and bandwidth.strip().lower() == AUTO:
        if device.type != "cuda":
            return None, CPU_NOTE
        link = (measure or measure_host_link)(device)
        note = (f"bandwidth='auto': measured {link.offload / 1e9:.2f} GB/s device -> host, "
                f"{link.prefetch / 1e9:.2f} GB/s host -> device (pinned copies)")
        log.info("schedlang fit: %s", note)
        return link, note
    try:
        rate = parse_rate(bandwidth)
    except ValueError as exc:
        raise SchedError(f"bandwidth: {exc} (or 'auto': measured on CUDA)") from None
    return HostLink(rate, rate), ""


