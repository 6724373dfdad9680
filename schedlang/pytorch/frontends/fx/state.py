"""The state of one training step of the fx plan executor (`runtime.PlanExecutor`): the
data's values, each layer's phantom (what its forward saved), and the transfers to and from
host memory (`transfers.TransferOps`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ....graphs.hgraph import FAST_FORWARD
from ....language.errors import SchedError
from ....plans.plan import Plan

__all__ = ["PlanError", "recomputed_layers", "deleted_after", "SavedTensor", "StorageBlock",
           "Phantom", "Transfer", "StepState",
           "extent", "release_blocks"]


class PlanError(SchedError):
    """A plan that cannot run on this partitioned module (names, options, order)."""


def extent(t: torch.Tensor) -> tuple[int, int]:
    """[first, last] element offsets of `t` in its storage."""
    first = t.storage_offset()
    last = first + sum((s - 1) * st for s, st in zip(t.shape, t.stride()) if s > 0)
    return first, last


class SavedTensor:
    """What a phantom keeps for one tensor autograd saved: the tensor, or a reference to the
    datum it is a view of (name, sizes, strides, offset relative to the datum's)."""

    __slots__ = ("tensor", "ref", "resident", "block", "view")

    def __init__(self, tensor: torch.Tensor):
        self.tensor: torch.Tensor | None = tensor
        self.ref: tuple | None = None
        self.resident = False  # a parameter or buffer: never offloaded
        self.block: StorageBlock | None = None  # the storage it lies in, once offloaded
        self.view: tuple = ()  # (dtype, sizes, strides, offset) in that storage


class StorageBlock:
    """One storage a phantom holds, moved to the host and back as a whole: autograd often
    saves one tensor several times (a ReLU's output is saved by the ReLU and by the next
    convolution), and the phantom's size (what the profile measured) counts each storage
    once. `device`: the storage's bytes on the device (uint8), None while only on the host."""

    __slots__ = ("nbytes", "device", "host", "event", "fetched", "records")

    def __init__(self, device: torch.Tensor):
        self.device: torch.Tensor | None = device
        self.nbytes = device.numel()
        self.host: torch.Tensor | None = None
        self.event = None
        self.fetched = False
        self.records: list[SavedTensor] = []

    def restore(self) -> None:
        """Point the records at the device bytes again."""
        for rec in self.records:
            dtype, shape, stride, offset = rec.view
            rec.tensor = self.device.view(dtype).as_strided(shape, stride, offset)


@dataclass
class Phantom:
    option: str
    leaves: dict[str, torch.Tensor] = field(default_factory=dict)  # input datum -> leaf
    kept: dict[str, torch.Tensor] = field(default_factory=dict)  # inputs deleted, still needed
    roots: list[tuple[str, torch.Tensor]] = field(default_factory=list)  # (output, graph root)
    saved: list[SavedTensor] = field(default_factory=list)
    host_bytes: float = 0  # offloaded so far
    host_total: int = 0  # bytes of its device tensors
    fetched_bytes: float = 0  # prefetch round in progress
    offloaded: bool = False  # an offload op copied it (or began to)
    blocks: list | None = None  # the storages it holds (made at its first offload)


@dataclass
class Transfer:
    """One datum or phantom on its way to or from host memory."""

    host: torch.Tensor | None = None
    shape: tuple = ()
    done: int = 0  # elements copied so far
    buffer: torch.Tensor | None = None  # prefetch: the device buffer being filled
    fetched: int = 0
    event: Any = None
    # a datum the graph counts as resident (0 bytes: the step's inputs, which the caller keeps
    # alive): its "host copy" is the tensor itself, and a prefetch hands it back without a copy
    resident: torch.Tensor | None = None

    def elements(self) -> int:
        return self.resident.numel() if self.resident is not None else self.host.numel()


class StepState:
    """The state of one training step."""

    def __init__(self) -> None:
        self.values: dict[str, torch.Tensor] = {}
        self.phantoms: dict[str, Phantom] = {}
        self.rng: dict = {}  # layer -> the `recompute.FirstRun` of its first forward
        self.offloaded: dict[str, Transfer] = {}  # datum -> host copy
        self.fetching: dict[str, Transfer] = {}
        self.phantom_host: dict[str, Phantom] = {}  # dropped phantoms with a host copy
        self.pinned = 0  # deletes a phantom kept alive
        self.pinned_names: list[str] = []
        # output gradients handed over by the autograd engine, which holds them until the
        # plan's backward returns: deleting them frees their storage (see `_delete`)
        self.engine_grads: set[str] = set()
        # model outputs handed over to the caller at the end of the forward part: the plan's
        # first use of them after the loss is their delete (see `PlanExecutor.handed_over`)
        self.handed: set[str] = set()
        self.offloaded_bytes = 0  # copied to the host
        self.prefetched_bytes = 0  # copied back
        self.input_requires_grad: list[bool] = []
        self.resident_ptrs: set | None = None  # the parameters' and buffers' storages
        # data the plan deletes right after a backward, released inside it (`_in_node_frees`):
        # their delete op has nothing left to do
        self.released: set[str] = set()


def release_blocks(ph: Phantom) -> None:
    """Forget the phantom's storages (the records and their blocks refer to each other: a
    cycle that only the garbage collector would free, keeping the tensors alive)."""
    for b in ph.blocks or []:
        b.records = []
        b.device = None
    ph.blocks = None


#: options with the forward run under autograd and the graph kept as the phantom
GRAPH_OPTIONS = ("autograd", "selective", "ops")


#: options whose phantom holds checkpoint frames that read the layer's inputs at the backward
CHECKPOINT_OPTIONS = ("selective", "ops")


NO_GRAD_OPTIONS = ("recompute", FAST_FORWARD)


def is_params_grad(name: str) -> bool:
    return name.endswith(".params.grad")


class ParamsGradMarker:
    """The datum `<layer>.params.grad`: the gradients live in the parameters' `.grad`."""

    def __repr__(self) -> str:
        return "<params.grad>"


PARAMS_GRAD = ParamsGradMarker()


def recomputed_layers(plan: Plan) -> set[str]:
    """The layers whose forward the plan computes more than once in a step."""
    seen: set[str] = set()
    again: set[str] = set()
    for op in plan.ops:
        if op.op == "compute" and op.node and op.node.endswith(".fwd"):
            layer = op.node[:-len(".fwd")]
            (again if layer in seen else seen).add(layer)
    return again


def deleted_after(plan: Plan) -> dict[int, set]:
    """id(compute op) -> the data deleted after it before the next compute (as the simulator's
    sub-step profiles read a plan), less any that a transfer touches in between."""
    out: dict[int, set] = {}
    last, moved = None, set()
    for op in plan.ops:
        if op.op == "compute":
            if last is not None and moved:
                out[id(last)] = out.get(id(last), set()) - moved
            last, moved = op, set()
        elif last is not None and op.op == "delete" and op.data not in moved:
            out.setdefault(id(last), set()).add(op.data)
        elif op.data:
            moved.add(op.data)
    return out
