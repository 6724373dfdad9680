"""The replay state machine both graph views share (`Replay`: a `PlanInterpreter` over the
plan's ops, the data in memory, `delete`, the end-of-plan checks) and the Checkmate view's
(`CheckmateReplay`); the layered view's is `layered_replay.py`. The rules they implement are
`simulate.py`'s docstring; `simulate`/`replay` there choose the machine and report."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..graphs.graph import CheckmateIndex
from ..language.errors import did_you_mean
from .interpreter import PlanInterpreter
from .plan import Op, Plan

#: at most this many replay errors are listed; the rest are counted
MAX_ERRORS = 50



class Errors:
    """An error list that keeps the first `MAX_ERRORS` messages and counts the rest."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.dropped = 0

    @property
    def full(self) -> bool:
        return len(self.items) >= MAX_ERRORS

    def add(self, message: str, always: bool = False) -> None:
        if always or len(self.items) < MAX_ERRORS:
            self.items.append(message)
        else:
            self.dropped += 1

    def finish(self) -> list[str]:
        out = list(self.items)
        if self.dropped:
            out.insert(MAX_ERRORS, f"... and {self.dropped} more errors")
        return out



@dataclass
class Replayed:
    """What replaying a plan's ops measured, budgets aside (`replay`)."""

    peak: int
    time: float
    computes: int
    errors: list[str] = field(default_factory=list)
    # layered graphs only (None / defaults on a Checkmate graph)
    save_peak: int | None = None  # the most memory during the loss phase; None: no loss phase
    save_at: int = -1  # op index of the save peak, -1: before the loss phase's first op
    host_peak: int | None = None  # bytes, rounded
    host_over: bool = False  # an offload went over the host budget
    wait_time: float = 0.0  # time the compute channel spent waiting for transfers
    # with `replay(..., record=True)`: one `OpMemory` per op of the plan
    steps: list | None = None



@dataclass(frozen=True)
class OpMemory:
    """Memory and time at one op of a replay (`replay(..., record=True)`): `peak`, the most
    bytes during the op (a compute's new copies, phantom and overhead included); `after`, the
    bytes once it is done; `start`/`end`, the compute channel's time before and after it."""

    peak: int
    after: int
    start: float
    end: float



def resolve(k: int, op_kind: str, name, index: dict[str, int], what: str, errors: Errors):
    """The index of the node/data/layer an op names, or None after recording why not."""
    i = index.get(name) if name is not None else None
    if i is None:
        if name is None:
            errors.add(f"op {k}: {op_kind} op names no {what}")
        else:
            errors.add(f"op {k}: {op_kind} of unknown {what} {name!r}{hint(name, index, errors)}")
    return i



def hint(name: str, index: dict[str, int], errors: Errors) -> str:
    # did_you_mean is cheap for a few listed errors on graphs of a few hundred nodes
    if errors.full or len(index) > 5000:
        return ""
    return did_you_mean(name, index)



# --- the replay state machines ---------------------------------------------------------------
class Replay(PlanInterpreter):
    """What both views share: the walk over the ops (`PlanInterpreter`: one `on_<kind>`
    method per op kind; a kind the view does not replay is an error), the data in memory and
    their `delete`, and the end-of-plan check that every compute node ran."""

    SAMPLED: frozenset[str] = frozenset()  # op kinds before which `sample` is called

    def __init__(self, plan: Plan, errors: Errors, names: list[str] | tuple[str, ...],
                 data_index: dict[str, int], size: list[int] | tuple[int, ...]):
        self.plan = plan
        self.errors = errors
        self.names = names  # compute nodes
        self.computed = [0] * len(names)  # how many times each node ran
        self.data_index = data_index  # data name -> position
        self.size = size  # bytes per datum
        self.live = bytearray(len(size))  # data in memory
        self.deleted_at = [-1] * len(size)  # op index of the latest delete, for messages
        self.mem = 0  # bytes in memory
        self.peak = 0
        self.time = 0.0  # the compute channel's current time
        self.computes = 0
        self.steps: list[OpMemory] | None = None  # per op, when recording (`replay`)
        self.before, self.start = 0, 0.0  # the running peak and the time before the op

    def replay(self) -> Replayed:
        """Every op in order (`PlanInterpreter.run`), then the end-of-plan checks."""
        self.run(self.plan.ops)
        self.finish()
        return self.result()

    def before_op(self, op: Op) -> None:
        if op.op in self.SAMPLED:
            self.sample()
        if self.steps is not None:  # the op's own peak: the running one restarts from here
            self.before, self.start, self.peak = self.peak, self.time, self.mem

    def after_op(self, op: Op) -> None:
        if self.steps is not None:  # (a compute's peak is its own: a node with a sub-step
            # profile may have freed inside what the deletes after it free again)
            here = self.peak if op.op == "compute" else max(self.peak, self.mem)
            self.steps.append(OpMemory(here, self.mem, self.start, self.time))
            self.peak = max(self.before, here)

    def on_unknown(self, op: Op) -> None:
        self.errors.add(f"op {self.index}: unknown op kind {op.op!r}")

    def on_drop_phantom(self, op: Op) -> None:
        self.errors.add(self.unsupported(self.index, op.op))

    on_offload = on_prefetch = on_wait = on_drop_phantom  # what the view does not replay

    def sample(self) -> None:
        """Called before each op of a kind in `SAMPLED`."""

    def unsupported(self, k: int, kind: str) -> str:
        raise NotImplementedError

    def datum_state(self, d: int) -> str:
        """Where datum d is, for messages about it not being in memory."""
        raise NotImplementedError

    def release(self, k: int, d: int, name: str) -> None:
        """The delete at op k frees datum d (still live)."""

    def on_delete(self, op: Op) -> None:
        k = self.index
        name = op.data
        if name is None or (d := self.data_index.get(name)) is None:
            resolve(k, "delete", name, self.data_index, "data", self.errors)  # records why
            return
        if not self.live[d]:
            self.errors.add(f"op {k}: delete {name!r}, which is not in memory "
                            f"({self.datum_state(d)})")
            return
        self.release(k, d, name)
        self.live[d] = 0
        self.mem -= self.size[d]
        self.deleted_at[d] = k

    def finish(self) -> None:
        """The end-of-plan checks."""
        never = [self.names[i] for i, c in enumerate(self.computed) if not c]
        if never:
            shown = ", ".join(repr(x) for x in never[:10])
            more = f" and {len(never) - 10} more" if len(never) > 10 else ""
            noun = "node is" if len(never) == 1 else "nodes are"
            self.errors.add(f"{len(never)} {noun} never computed: {shown}{more}", always=True)

    def result(self) -> Replayed:
        return Replayed(peak=self.peak, time=self.time, computes=self.computes)



class CheckmateReplay(Replay):
    """The Checkmate view's replay (module docstring): live outputs, their bytes, the peak."""

    def __init__(self, plan: Plan, graph_name: str, idx: CheckmateIndex, errors: Errors):
        super().__init__(plan, errors, idx.names, idx.index, idx.size)  # a node's output is its name
        self.graph_name = graph_name
        self.idx = idx

    def datum_state(self, i: int) -> str:
        if not self.computed[i]:
            return "never computed before"
        return f"deleted by op {self.deleted_at[i]}"

    def on_compute(self, op: Op) -> None:
        k = self.index
        idx, live, name = self.idx, self.live, op.node
        i = resolve(k, "compute", name, idx.index, "node", self.errors)
        if i is None:
            return
        if op.option is not None:
            self.errors.add(f"op {k}: compute {name!r} with option {op.option!r}, but node "
                            f"{name!r} has a single way to run (omit 'option')")
        for p in idx.preds[i]:
            if not live[p]:
                self.errors.add(f"op {k}: compute {name!r} needs {idx.names[p]!r}, which is not "
                                f"in memory ({self.datum_state(p)})")
        with_output = self.mem + idx.size[i]
        if with_output > self.peak:
            self.peak = with_output
        if not live[i]:
            live[i] = 1
            self.mem = with_output
        # else: the old copy is released once the new one exists; live bytes unchanged
        self.computed[i] = 1
        self.time += idx.time[i]
        self.computes += 1

    def unsupported(self, k: int, kind: str) -> str:
        if kind in ("offload", "prefetch", "wait"):
            return (f"op {k}: {kind} ops are not supported for this graph (graph "
                    f"'{self.graph_name}' is in the Checkmate view; transfers are replayed on "
                    "layered graphs only)")
        return (f"op {k}: {kind} ops are not supported for this graph "
                f"(graph '{self.graph_name}' has no layers, phantoms or offload channels)")
