"""What `fit` asks of a front end: the one interface both ways of cutting a model into layers
implement (`frontends/fx`: a whole-model torch.fx trace, run by the plan executor;
`frontends/blocks`: the model's own forward with its blocks wrapped in place).

A `Frontend` prepares a model into layered graph data and its profile (`prepare`), says what
the plan executor keeps alive (`executor_bytes`), which .sched extensions its runtime needs
(`extensions`), how a host link enters its graph (`with_link`), what its runtime frees on its
own (`runtime_frees`), what a plan's time misses (`time_correction`) and its memory
(`priced_graph`), and gives the `Runner`
that executes a plan inside a `FitModule`. What a front end cannot do is a flag `fit` reads,
never a comparison of names.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

__all__ = ["Frontend", "Runner"]


class Runner(ABC):
    """The executor of a plan on a fitted model (one per `FitModule`)."""

    #: the plan runs inside the model itself (its blocks wrapped in place): `unwrap()` makes
    #: it plain PyTorch again; otherwise the plan runs beside the model, which stays as it is
    in_place: bool = False

    @property
    def plan_executor(self):
        """The fx `PlanExecutor` of the current plan (op observers, statistics), or None."""
        return None

    @abstractmethod
    def set_plan(self, plan, on_error) -> None:
        """Run `plan` from now on (None: plain execution); `on_error()` ends a measured step
        whose backward raised."""

    @abstractmethod
    def call(self, module, args: tuple, kwargs: dict):
        """One forward of `module` under the current plan."""

    def ensure(self) -> None:
        """Make this runner's plan the one the model runs (another fit may have set its own)."""
        return

    def unwrap(self) -> None:
        """Undo what `set_plan` did to the model (`in_place` runners)."""
        return


class Frontend(ABC):
    """A way of cutting a model into layers, profiling them and running plans on them."""

    name: str = ""
    #: runs a plan's own transfer ops (offload, prefetch, wait of `models/offload.sched`);
    #: False: a host link enters as a layer option instead (`with_link`)
    runs_transfer_ops: bool = False
    #: may offload what a checkpoint keeps (selective and generated options' phantoms)
    offloads_in_checkpoints: bool = False
    #: runs plans with checkpointed groups of consecutive blocks
    groups: bool = False
    #: takes generated op-level layer options (`schedlang.pytorch.options`)
    generated_options: bool = False
    #: its profile cannot replay all of the model's code (glue between blocks): `fit` probes
    #: one measured step by default
    probes_by_default: bool = False
    #: a probe step measured over its prediction raises the graph's glue sizes by the excess
    replans_on_probe_excess: bool = False

    @abstractmethod
    def prepare(self, model, args: tuple, kwargs: dict, layers, graph, *, offload: bool,
                trace_kwargs: dict, block_options=False) -> tuple:
        """(layered graph data, the partitioned model the runner executes) for `model`;
        `graph`: given graph data (fx: read from a file) instead of a profile; `offload`:
        measure what a host link needs while the sample values are at hand; `block_options`:
        the hook front end's generated block options (`schedlang.pytorch.frontends.blocks.block_ops`; the fx
        front end generates its own after profiling)."""

    def executor_bytes(self, model) -> int:
        """Bytes the plan executor keeps alive through every step (resident)."""
        return 0

    def extensions(self, groups: bool = True) -> tuple:
        """The .sched extensions its runtime needs beyond `solve_plan`'s own; `groups` False:
        without checkpointed groups of blocks (FSDP, torch.distributed)."""
        return ()

    @abstractmethod
    def with_link(self, prep, link):
        """`prep.graph` planned with the host link `link` (a `hostlink.HostLink`)."""

    def runtime_frees(self, plan, prep):
        """`plan` with the deletes this runtime does itself moved to where it does them, or
        `plan` itself where nothing moves."""
        return plan

    def time_correction(self, plan, graph) -> float:
        """Seconds a plan's simulated time misses on this runtime."""
        return 0.0

    def priced_graph(self, plan, graph):
        """The graph data `plan` runs on in this runtime, to simulate it with: `graph`
        itself, or a variant with what the runtime does differently for this plan."""
        return graph

    def group_plans(self, prep) -> list:
        """The front end's heuristic plans, the solve's start and fallback (the hook front
        end: per-block checkpointing, every block at its least memory, and plans with
        checkpointed groups of blocks, `groups`); none by default."""
        return []

    @abstractmethod
    def runner(self, prep) -> Runner:
        """The executor of `prep`'s plans on its model."""

    def describe(self, prep) -> str:
        """What `MemoryReport` says of the layers."""
        return self.name
