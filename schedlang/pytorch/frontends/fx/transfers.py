"""The fx plan executor's transfers (`offload`, `prefetch`, `wait`): copies of data and
phantoms to host memory and back. On CUDA the copies are non-blocking, into pinned host
buffers, on two side streams ordered with events; on CPU they are plain copies into a
separate host buffer (the same code path, synchronous)."""
from __future__ import annotations

import math

import torch

from ....plans.plan import Op
from ...hostlink import host_buffer
from .state import CHECKPOINT_OPTIONS, PARAMS_GRAD, Phantom, PlanError, StepState, StorageBlock, Transfer

__all__ = ["TransferOps"]


class TransferOps:
    """`PlanExecutor`'s transfer ops (a mixin: it reads the executor's graph, plan and
    device)."""

    # --- offload -----------------------------------------------------------------------------
    # A datum's host copy (`run.offloaded`) persists to the end of the step and serves the
    # same value recomputed later; a prefetch round allocates the full device buffer at its
    # first prefetch, and the wait on channel 'prefetch' that finds every element copied makes
    # the datum live again. A phantom's host copy holds the tensors its graph saved (those
    # internal to the layer); dropping a phantom whose host copy is complete keeps the graph
    # (without its device tensors) so that a prefetch can bring it back.
    def _side_streams(self):
        if self.device.type != "cuda":
            return None
        if self.streams is None:
            self.streams = (torch.cuda.Stream(self.device), torch.cuda.Stream(self.device))
        return self.streams

    def _copy(self, dst: torch.Tensor, src: torch.Tensor, channel: int, after=None):
        """Copy on the channel's side stream (CUDA: non-blocking, ordered after the compute
        stream's work so far and after the event `after`; returns its event) or now (CPU:
        returns None). A prefetch waits for its offload there, on the side stream: the
        compute stream waits only at the plan's `wait` ops, as the simulator times it."""
        streams = self._side_streams()
        if streams is None:
            dst.copy_(src)
            return None
        stream = streams[channel]
        stream.wait_stream(torch.cuda.current_stream(self.device))
        if after is not None:
            stream.wait_event(after)
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
        for t in (src, dst):
            if t.device.type == "cuda":
                t.record_stream(stream)  # not reused before the copy is done
        return event

    def _sync_event(self, event) -> None:
        if event is not None:
            torch.cuda.current_stream(self.device).wait_event(event)

    def _host_empty(self, shape, dtype) -> torch.Tensor:

        return host_buffer(shape, dtype, self.device)

    def _offload(self, run: StepState, op: Op) -> None:
        fraction = 1.0 if op.fraction is None else op.fraction
        if op.layer is not None:
            self._offload_phantom(run, op.layer, fraction)
            return
        name = op.data
        v = run.values.get(name)
        if v is None or v is PARAMS_GRAD:
            raise PlanError(f"offload of {name!r}, which is not in memory")
        tr = run.offloaded.get(name)
        if tr is None and name in self.resident_data:
            # nothing moves: the caller holds the tensor for the whole step
            run.offloaded[name] = Transfer(shape=tuple(v.shape), done=v.numel(), resident=v)
            return
        if tr is None:
            tr = run.offloaded[name] = Transfer(host=self._host_empty(v.numel(), v.dtype),
                                                 shape=tuple(v.shape))
        if tr.resident is not None:
            return
        n = v.numel()
        stop = min(n, tr.done + math.ceil(fraction * n - 1e-9))
        if stop > tr.done:
            flat = v.reshape(-1)
            tr.event = self._copy(tr.host[tr.done:stop], flat[tr.done:stop], 0)
            run.offloaded_bytes += (stop - tr.done) * v.element_size()
            tr.done = stop

    def _phantom_blocks(self, ph: Phantom) -> list[StorageBlock]:
        """The storages the phantom holds (not the resident ones), each once."""
        if ph.blocks is None:
            blocks: dict[int, StorageBlock] = {}
            for rec in ph.saved:
                t = rec.tensor
                if rec.resident or t is None or t.numel() == 0:
                    continue
                storage = t.untyped_storage()
                block = blocks.get(storage.data_ptr())
                if block is None:
                    whole = torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage)
                    block = blocks[storage.data_ptr()] = StorageBlock(whole)
                rec.block = block
                rec.view = (t.dtype, tuple(t.shape), tuple(t.stride()), t.storage_offset())
                block.records.append(rec)
            ph.blocks = list(blocks.values())
        return ph.blocks

    def _offload_phantom(self, run: StepState, layer: str, fraction: float) -> None:
        ph = run.phantoms.get(layer)
        if ph is None:
            raise PlanError(f"offload of the phantom of layer {layer!r}, which has none saved")
        if self._option_kind_of_phantom(ph) in CHECKPOINT_OPTIONS:
            raise PlanError(f"offload of the phantom of layer {layer!r}: a {ph.option} phantom "
                            "lives in its checkpoints and cannot be offloaded")
        ph.offloaded = True
        blocks = self._phantom_blocks(ph)
        total = sum(b.nbytes for b in blocks)
        target = ph.host_bytes + fraction * total
        for b in blocks:
            if ph.host_bytes >= target - 1e-6:
                break
            if b.host is not None or b.device is None:
                continue
            b.host = self._host_empty((b.nbytes,), torch.uint8)
            b.event = self._copy(b.host, b.device, 0)
            ph.host_bytes += b.nbytes
            run.offloaded_bytes += b.nbytes
        ph.host_total = total

    def _keep_host_phantom(self, run: StepState, layer: str, ph: Phantom) -> bool:
        """Dropping `ph`: keep its graph with its host copy when the copy is complete."""
        if not ph.offloaded or ph.blocks is None or any(b.host is None for b in ph.blocks):
            return False
        for b in ph.blocks:
            self._sync_event(b.event)
            b.event = None
            b.device = None
            for rec in b.records:
                rec.tensor = None
        run.phantom_host[layer] = ph
        return True

    def _prefetch(self, run: StepState, op: Op) -> None:
        fraction = 1.0 if op.fraction is None else op.fraction
        if op.layer is not None:
            ph = run.phantom_host.get(op.layer)
            if ph is None:
                raise PlanError(f"prefetch of the phantom of layer {op.layer!r}, which has no "
                                "host copy off the device")
            blocks = ph.blocks or []
            if ph.fetched_bytes == 0:
                for b in blocks:  # the round allocates the whole phantom
                    b.device = torch.empty(b.nbytes, dtype=torch.uint8, device=self.device)
                    b.fetched = False
                    b.restore()
            target = ph.fetched_bytes + fraction * ph.host_total
            for b in blocks:
                if ph.fetched_bytes >= target - 1e-6:
                    break
                if b.fetched:
                    continue
                # (the offload's event, if not waited yet: the side stream waits for it)
                b.event = self._copy(b.device, b.host, 1, b.event)
                b.fetched = True
                ph.fetched_bytes += b.nbytes
                run.prefetched_bytes += b.nbytes
            return
        name = op.data
        tr = run.offloaded.get(name)
        if tr is None:
            raise PlanError(f"prefetch of {name!r}, which has no host copy")
        if tr.resident is not None:
            if name not in run.fetching:
                tr.buffer, tr.fetched = tr.resident, tr.done
                run.fetching[name] = tr
            return
        n = tr.host.numel()
        after = None
        if name not in run.fetching:
            after = tr.event  # the offload is complete before the host is read
            tr.buffer = torch.empty(n, dtype=tr.host.dtype, device=self.device)
            tr.fetched = 0
            run.fetching[name] = tr
        stop = min(n, tr.fetched + math.ceil(fraction * n - 1e-9))
        if stop > tr.fetched:
            tr.event = self._copy(tr.buffer[tr.fetched:stop], tr.host[tr.fetched:stop], 1,
                                  after)
            run.prefetched_bytes += (stop - tr.fetched) * tr.host.element_size()
            tr.fetched = stop

    def _wait(self, run: StepState, op: Op) -> None:
        channel = op.channel
        if channel == "offload":
            if op.layer is not None:
                ph = run.phantoms.get(op.layer) or run.phantom_host.get(op.layer)
                recs = (ph.blocks or []) if ph is not None else []
            elif op.data is not None:
                recs = [run.offloaded[op.data]] if op.data in run.offloaded else []
            else:
                recs = list(run.offloaded.values()) + [
                    b for ph in run.phantoms.values() for b in (ph.blocks or [])]
            for rec in recs:
                self._sync_event(rec.event)
                rec.event = None
            return
        if op.layer is not None:
            layers = [op.layer]
        elif op.data is not None:
            layers = []
        else:
            layers = list(run.phantom_host)
        for layer in layers:
            ph = run.phantom_host.get(layer)
            if ph is None or ph.fetched_bytes < ph.host_total - 1e-6:
                continue
            for b in ph.blocks or []:
                self._sync_event(b.event)
                b.event = None
            ph.fetched_bytes = 0
            del run.phantom_host[layer]
            run.phantoms[layer] = ph
        names = [op.data] if op.data is not None else ([] if op.layer else list(run.fetching))
        for name in names:
            tr = run.fetching.get(name)
            if tr is not None and tr.fetched >= tr.elements():
                self._finish_prefetch(run, name)

    def _finish_prefetch(self, run: StepState, name: str) -> None:
        tr = run.fetching.pop(name, None)
        if tr is None:
            return
        if tr.fetched < tr.elements() or tr.done < tr.elements():
            raise PlanError(f"{name!r} is only partly back on the device ({tr.done} of "
                            f"{tr.elements()} elements offloaded, {tr.fetched} prefetched)")
        self._sync_event(tr.event)
        tr.event = None
        run.values[name] = tr.resident if tr.resident is not None else tr.buffer.view(tr.shape)
        tr.buffer = None

    def _late_prefetch(self, run: StepState, name: str) -> None:
        """A datum read while still on its way back: wait for it."""
        if name in run.fetching:
            self._finish_prefetch(run, name)
