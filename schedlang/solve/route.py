"""What the default solve (`schedlang.solve.strategy`) did: its route and each step, as a
`Result` reports them (`Result.strategy`, the `strategy` line and `--json`'s "strategy")."""
from __future__ import annotations

from dataclasses import dataclass, field

from .orders import GRAPH_ORDER, SEQUENCE_ORDER

__all__ = ["Route", "Step"]


@dataclass
class Step:
    """One solve or planner run of a route, as reported."""

    what: str  # "planner", "cpsat", "highs"
    model: str | None
    seconds: float
    status: str
    objective: float | None = None
    bound: float | None = None
    note: str = ""

    def to_json(self) -> dict:
        return {"what": self.what, "model": self.model, "seconds": round(self.seconds, 3),
                "status": self.status, "objective": self.objective, "bound": self.bound,
                "note": self.note}


@dataclass
class Route:
    name: str  # "as written", "op graph", "large graph"
    reason: str
    model: str | None = None
    steps: list[Step] = field(default_factory=list)
    #: the node order of the stage model solved (`schedlang.solve.orders`): its optimum and
    #: bound hold for plans in that order; None when no stage model was solved
    order: str | None = None

    def to_json(self) -> dict:
        return {"route": self.name, "reason": self.reason, "model": self.model,
                "order": self.order, "steps": [s.to_json() for s in self.steps]}

    def summary(self) -> str:
        done = "; ".join(f"{s.what}{f' ({s.note})' if s.note else ''} {s.seconds:.1f} s: "
                         f"{s.status}" for s in self.steps)
        order = "" if self.order in (None, GRAPH_ORDER) else (
            ", in the order-free plan's node order" if self.order == SEQUENCE_ORDER
            else f", in planner {self.order}'s node order")
        return f"{self.name} ({self.reason}{order})" + (f": {done}" if done else "")
