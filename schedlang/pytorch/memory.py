"""Measuring the tensor memory a piece of PyTorch code uses on its compute device.

`MemoryTracker` is a context manager with `.baseline` (live bytes at entry), `.current` (live
bytes now) and `.peak` (the most live bytes since entry or the last `reset_peak()`);
`mark()` cuts the time into windows (one per op of a plan, `schedlang.pytorch.timeline`): it
returns the most live bytes since the previous mark and the live bytes now, and leaves `.peak`
as it is.

* On CUDA it reads the caching allocator's counters: `torch.cuda.memory_allocated` and
  `torch.cuda.max_memory_allocated` after `torch.cuda.reset_peak_memory_stats` at entry. Every
  tensor on the device counts, whoever made it; the baseline is what was allocated at entry.
* On CPU there is no allocator counter, so the tracker counts tensor storages itself, and by
  default it counts what CUDA's allocator would: at entry it finds every live storage on the
  device (`schedlang.pytorch.live.live_storages`: the model, the inputs, gradients, optimizer
  state, whatever else the process holds — a leak included) and tracks each from there, so
  `.baseline` is all the tensor memory alive at entry and `.peak` the peak of all of it
  (after a garbage collection: memory held only by unreachable cycles, which CUDA also counts
  until the collector runs, is not, so that a reading does not depend on when it last ran).
  ``existing=False`` skips that scan (a fraction of a second in a large process) and tracks
  only the `resident` storages the caller declares: for measuring what a piece of code adds
  (``peak - baseline``), which the profiler does many times per fit. Then: a
  `TorchDispatchMode` sees the outputs of every aten op run inside the context (forward ops,
  factory functions, and the backward's ops: the autograd engine carries the mode to the
  thread that runs the backward), and counts each new storage once, keyed by the storage (views
  and in-place results share their input's storage and are not counted again; an output the
  op's schema declares as an alias of an input is skipped, except `aten.lift_fresh`'s: the
  tensors `torch.tensor` and list indexing build from Python data below the dispatcher, new
  storages that enter the mode there). A `weakref.finalize` on the
  storage's Python object takes its bytes off when the storage is freed (torch keeps one Python
  object per storage for as long as the storage lives, checked on torch 2.13). Storages can
  also change size without an op the mode sees (`untyped_storage().resize_(0)`), so the live
  total is the sum of the tracked storages' *current* sizes, re-read after every op.
  Tensors that existed before the context are invisible to the mode: they are the ones found
  at entry (or, with ``existing=False``, the `resident` ones the caller declares:
  `resident=[parameters, inputs, ...]`); their storages are tracked from entry (their bytes
  are the baseline; freeing or resizing them is seen) but never counted twice. A `DTensor`
  (FSDP2's sharded parameters and gradients) counts as its local tensor. `watch=[...]`: tensors
  whose storages may be empty at entry and grow later by a resize (FSDP2 frees its unsharded
  parameters that way and allocates them again in the next step): tracked by identity.

The CPU tracker is exact for what it covers (tests check: a temporary created and dropped leaves
`.current` unchanged; `a = x*2; b = a*2; del a` peaks at two tensors; in-place ops do not count
twice; backward's gradient buffers are seen; `resize_(0)` frees). It does not see memory that
is not a tensor storage (allocator rounding, workspace buffers inside kernels, the one-off
buffers of ops that allocate and free within a kernel), so it measures what the CUDA caching
allocator would report up to rounding of each block to 512 bytes. `torch.profiler`'s memory
events were the alternative; they cost more and report allocator events, not storages.
"""
from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .live import live_storages, storage_of

__all__ = ["MemoryTracker", "storage_bytes", "storage_key", "tensor_bytes"]


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes of the tensor's own elements (numel × element size)."""
    return t.numel() * t.element_size()


def storage_key(t: torch.Tensor) -> int:
    """The identity of the storage behind `t` (its data pointer): views share it."""
    return t.untyped_storage().data_ptr()


def storage_bytes(tensors: Iterable) -> int:
    """Bytes of the distinct storages behind `tensors` (each storage counted once)."""
    seen: set[int] = set()
    total = 0
    for t in _tensors(tensors):
        s = t.untyped_storage()
        key = s.data_ptr()
        if key in seen or s.nbytes() == 0:
            continue
        seen.add(key)
        total += s.nbytes()
    return total


def _tensors(items) -> list:
    leaves, _ = tree_flatten(list(items) if not isinstance(items, torch.Tensor) else [items])
    out = []
    for x in leaves:
        if isinstance(x, torch.nn.Module):
            out += list(x.parameters()) + list(x.buffers())
        elif isinstance(x, torch.Tensor):
            out.append(x)
    return [_local(t) for t in out]


def _local(t: torch.Tensor) -> torch.Tensor:
    """A `DTensor` (FSDP2's sharded parameters and gradients) holds this rank's part in a
    plain local tensor: that tensor's storage is what the device holds."""
    local = getattr(t, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) else t


def _device_of(device, resident) -> torch.device:
    if device is not None:
        return torch.device(device)
    for t in resident:
        return t.device
    return torch.device("cpu")


#: ops whose output the schema declares an alias of an input that no op made: `torch.tensor`,
#: `torch.as_tensor` of Python data, and the index tensor of `x[..., [-2], :]`, are built below
#: the dispatcher and enter it here (Falcon's attention saves two such indices per block: a
#: tracker that skipped them measured 16 B a block less than the profile's saved tensors)
_FRESH = (torch.ops.aten.lift_fresh.default,)


class _StorageCounter(TorchDispatchMode):
    """The dispatch mode of the CPU tracker: registers every new output storage."""

    def __init__(self, tracker: MemoryTracker):
        super().__init__()
        self.tracker = tracker

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tr = self.tracker
        if tr is None:  # closed (a copy left on a thread's mode stack: `drop_closed_modes`)
            return out
        with tr._lock:
            flat, _ = tree_flatten(out)
            returns = func._schema.returns
            if func in _FRESH:  # (its "alias" is a tensor made from Python data unseen)
                aliased = [False] * len(flat)
            elif len(returns) == len(flat):
                aliased = [r.alias_info is not None for r in returns]
            elif len(returns) == 1:  # one Tensor[] return
                aliased = [returns[0].alias_info is not None] * len(flat)
            else:
                aliased = [False] * len(flat)
            for t, alias in zip(flat, aliased):
                if isinstance(t, torch.Tensor) and not alias:
                    tr._register(t)
            tr._refresh()
        return out


def drop_closed_modes() -> None:
    """Pop closed CPU trackers' modes off this thread's dispatch-mode stack.

    A tracker closed from autograd's end-of-backward callback (a fitted module's measured
    step) exits its mode inside the engine's copy of the thread-local state, which the engine
    then restores: the mode stays on the caller's stack, inert (it counts nothing). The next
    tracker, and the next call of a fitted module, remove it here."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode, _pop_mode

    while True:
        top = _get_current_dispatch_mode()
        if not (isinstance(top, _StorageCounter) and top.tracker is None):
            return
        _pop_mode()


class _Detached:
    """The finalizer slot of a watched storage (the tracker holds it by identity)."""

    def detach(self) -> None:
        pass


class MemoryTracker:
    """Live tensor bytes on a device while the context is open (see the module docstring).

    ``with MemoryTracker(resident=[model, x]) as mt: ...`` then ``mt.peak``, ``mt.current``,
    ``mt.baseline`` (bytes) and ``mt.peak - mt.baseline`` (the code's extra peak).
    `device` defaults to the device of the first resident tensor, else CPU. `existing`
    (CPU): count every storage alive at entry, as CUDA does (default), or only `resident`.
    `ignore`: tensors the measuring code itself holds for the whole window (a probe step's
    copies of what it restores): never counted (CUDA: their bytes are taken off every
    reading).
    """

    def __init__(self, resident: Iterable = (), device=None, watch: Iterable = (),
                 existing: bool = True, ignore: Iterable = ()):
        self.existing = existing
        self._resident = _tensors(resident)
        # what the measuring code itself holds for the whole window (a probe step's copies of
        # the buffers, the gradients it set aside): not the measured code's memory
        self._ignore = _tensors(ignore)
        # storages that may be empty now and allocated later by resizing them (FSDP2's
        # unsharded parameters): tracked by identity from entry, whatever their size
        self._watch = [t.untyped_storage() for t in _tensors(watch)]
        self._watched: set[int] = set()
        self.device = _device_of(device, self._resident)
        self.cuda = self.device.type == "cuda"
        self._ignored = {t.untyped_storage().data_ptr() for t in self._ignore
                         if t.device.type == self.device.type}
        self._ignored_bytes = storage_bytes(
            t for t in self._ignore if t.device.type == "cuda"
            and self.device.index in (None, t.device.index)) if self.cuda else 0
        self.baseline = 0
        self._peak = 0
        self._current = 0
        self._window = 0  # the most live bytes since the last `mark()`
        self._entries: dict[int, tuple] = {}  # storage data_ptr -> (weakref to storage, finalizer)
        self._lock = threading.RLock()
        self._mode: _StorageCounter | None = None
        self._open = False

    # --- context -------------------------------------------------------------------------
    def __enter__(self) -> MemoryTracker:
        if self._open:
            raise RuntimeError("MemoryTracker is already open")
        self._open = True
        if self.cuda:
            torch.cuda.synchronize(self.device)
            self.baseline = self._cuda_now()
            torch.cuda.reset_peak_memory_stats(self.device)
            self._current = self._peak = self._window = self.baseline
            return self
        drop_closed_modes()
        for s in self._watch:
            if s.device.type == self.device.type and id(s) not in self._watched:
                self._watched.add(id(s))
                self._entries[-len(self._watched)] = (weakref.ref(s), _Detached())
        if self.existing:

            # unreachable cycles (torch.fx's graph modules hold the submodules they call)
            # would count until the collector's next pass, whose time depends on what ran
            # before: collected first, so that a reading does not depend on it
            gc.collect()
            for key, s in live_storages(self.device).items():
                if key not in self._ignored:
                    self._track(s)
        for t in self._resident:
            if t.device.type == self.device.type:
                self._register(t)
        self._refresh()
        self.baseline = self._current
        self._peak = self._window = self._current
        self._mode = _StorageCounter(self)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            self._current = self._cuda_now()
            self._peak = max(self._peak, self._cuda_max())
        else:
            mode, self._mode = self._mode, None
            mode.tracker = None  # inert from now on, wherever a copy of the stack keeps it
            mode.__exit__(*exc)
            self._refresh()
            for _, fin in list(self._entries.values()):
                fin.detach()
            self._entries.clear()
            self._watched.clear()
        self._open = False

    # --- readings ------------------------------------------------------------------------
    @property
    def current(self) -> int:
        if self._open:
            if self.cuda:
                torch.cuda.synchronize(self.device)
                self._current = self._cuda_now()
            else:
                self._refresh()
        return self._current

    @property
    def peak(self) -> int:
        if self._open:
            if self.cuda:
                torch.cuda.synchronize(self.device)
                self._peak = max(self._peak, self._cuda_max())
            else:
                self._refresh()
        return self._peak

    def reset_peak(self) -> None:
        """Start a new peak from the current live bytes."""
        if self.cuda and self._open:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        self._peak = self._window = self.current

    def mark(self) -> tuple[int, int]:
        """(the most live bytes since the previous mark, or since entry; live bytes now), and
        a new window from now. `.peak` is the largest window's."""
        if not self._open:
            return self._window, self._current
        if self.cuda:  # the allocator's counters are the host's: no synchronization (which
            # would also serialize the transfer streams with the compute stream)
            window = max(self._window, self._cuda_max())
            self._peak = max(self._peak, window)
            torch.cuda.reset_peak_memory_stats(self.device)  # the next window starts here
            self._current = self._cuda_now()
            self._window = self._current
            return window, self._current
        with self._lock:
            self._refresh()
            window, self._window = self._window, self._current
            return window, self._current

    # --- CPU bookkeeping -----------------------------------------------------------------
    def _register(self, t: torch.Tensor) -> None:

        s = storage_of(t, self.device.type)
        if s is not None and s.data_ptr() not in self._ignored:
            self._track(s)

    # --- CUDA readings -------------------------------------------------------------------
    def _cuda_now(self) -> int:
        return torch.cuda.memory_allocated(self.device) - self._ignored_bytes

    def _cuda_max(self) -> int:
        return torch.cuda.max_memory_allocated(self.device) - self._ignored_bytes

    def _track(self, s) -> None:
        key = s.data_ptr()
        if s.nbytes() == 0 or key == 0 or id(s) in self._watched:
            return
        entry = self._entries.get(key)
        if entry is not None and entry[0]() is s:
            return
        if entry is not None:  # a dead storage's address reused before its finalizer ran
            entry[1].detach()
        ref = weakref.ref(s)
        fin = weakref.finalize(s, self._forget, key, ref)
        self._entries[key] = (ref, fin)

    def _forget(self, key: int, ref) -> None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry[0] is ref:
                del self._entries[key]
            self._refresh()

    def _refresh(self) -> None:
        total = 0
        for ref, _ in self._entries.values():
            s = ref()
            if s is not None:
                total += s.nbytes()
        self._current = total
        if total > self._peak:
            self._peak = total
        if total > self._window:
            self._window = total
