"""The fx front end: layers cut by a whole-model torch.fx trace (`partition`), profiled
(`schedlang.pytorch.trace`), run by the plan executor (`runtime.PlanExecutor`)."""
from __future__ import annotations

import copy
import dataclasses

import torch

from ....language.errors import SchedError
from ...frontend import Frontend, Runner
from ...lifetimes import earliest_deletes
from ...tensors import constant_bytes
from ...trace import trace
from .partition import partition
from .runtime import PlanExecutor
from .segments import register

__all__ = ["FxFrontend", "FxRunner", "FX"]


class FxRunner(Runner):
    """Runs each plan through a `PlanExecutor` on the partitioned module."""

    def __init__(self, prep):
        self.partitioned = prep.partitioned
        self.graph = prep.graph
        self._executor: PlanExecutor | None = None
        self._module: list = []  # the PlanModule (in a list: not a submodule of the caller)

    @property
    def plan_executor(self):
        return self._executor

    def set_plan(self, plan, on_error) -> None:
        self._executor, self._module = None, []
        if plan is None:
            return
        self._executor = PlanExecutor(self.partitioned, plan, self.graph)
        self._executor.on_error = on_error
        self._module = [self._executor.module()]

    def call(self, module, args: tuple, kwargs: dict):
        if self._executor is None:
            return module(*args, **kwargs)
        return self._module[0](*args, **kwargs)


class FxFrontend(Frontend):
    name = "fx"
    runs_transfer_ops = True
    generated_options = True

    def accepts(self, model, args: tuple, kwargs: dict, layers) -> str:
        """Why `model` cannot be traced with these inputs, or "" where it can."""
        if kwargs or not all(isinstance(a, torch.Tensor) for a in args):
            return "keyword or non-tensor inputs: torch.fx is not tried"
        try:
            partition(model, args, layers)
        except SchedError as exc:
            return f"torch.fx: {exc}"
        return ""

    def prepare(self, model, args: tuple, kwargs: dict, layers, graph, *, offload: bool,
                trace_kwargs: dict, block_options=False) -> tuple:
        if kwargs:
            raise SchedError("frontend 'fx' takes positional tensor inputs only; use "
                             "frontend='blocks' for keyword inputs")
        part = None
        if graph is None:
            graph = trace(model, args, layers=layers, **trace_kwargs)
            info = getattr(graph, "trace_info", None)
            part = getattr(getattr(info, "profiled", None), "part", None)
        else:  # traced from this very model: its partitioned module (with the callables of
            # any generated options) serves
            traced = getattr(getattr(getattr(graph, "trace_info", None), "profiled", None),
                             "part", None)
            if traced is not None and getattr(traced, "root", None) is model:
                part = traced
        if part is None:
            part = partition(model, args, layers)
        register(part, graph)  # generated options of graph data from a file: their callables
        return graph, part

    def executor_bytes(self, model) -> int:
        return constant_bytes(model)  # the plan executor's scalars, alive through every step

    def with_link(self, prep, link):
        """The graph with the link's bandwidths (`models/offload.sched` then schedules
        transfers, which the plan executor runs), the options whose phantom lives inside
        checkpoints pinned (`offloadable`)."""
        graph = copy.copy(prep.graph)
        graph.bandwidths = {"offload": link.offload, "prefetch": link.prefetch}
        graph.layers = [offloadable(lay) for lay in graph.layers]
        return graph

    def runtime_frees(self, plan, prep):
        """A loop that releases the outputs frees them once the loss is computed (the
        caller holds them, not the executor)."""
        if prep.outputs_held or prep.graph.loss is None:
            return plan
        released = {d.name for d in prep.graph.data
                    if d.name in prep.graph.loss.inputs and d.role != "output"}
        return earliest_deletes(plan, prep.graph, released)

    def runner(self, prep) -> Runner:
        return FxRunner(prep)


def offloadable(layer):
    """`layer` with its ``selective`` and generated (``ops...``) options pinned: their phantoms
    live inside checkpoints (`torch.utils.checkpoint` keeps what the policy saves), where the
    runtime cannot move them to the host; they stay choices, so that every recompute-only
    plan is a plan of the offloading model too (dropping them made the offload plan of the
    fx GPT slower than recomputation alone)."""
    if not any(_in_checkpoints(o.name) and not o.pinned for o in layer.options):
        return layer
    layer = copy.copy(layer)
    layer.options = [dataclasses.replace(o, pinned=True) if _in_checkpoints(o.name) else o
                     for o in layer.options]
    return layer


def _in_checkpoints(option: str) -> bool:
    return option == "selective" or option.startswith("ops")


FX = FxFrontend()
