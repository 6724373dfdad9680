"""What the API returns: a solve's `Result`, what became of its MIP start (`WarmStart`), and
a heuristic planner's replayed plan (`PlanReport`). `Problem` (problem.py) makes them; the
outside incumbent (solve/incumbent.py) and the CLI read them."""
from __future__ import annotations

from dataclasses import dataclass, field

from .graphs.graph import Graph
from .plans.plan import Plan
from .plans.planners import graph_view
from .plans.simulate import SimResult
from .solve.route import Route
from .solve.solution import Solution, Status


@dataclass
class Result:
    status: Status
    objective: float | None
    bound: float | None
    gap: float | None
    backend: str
    solver: str
    model_size: dict
    timings: dict
    plan: Plan | None = None
    simulated: SimResult | None = None
    solution: Solution | None = None
    message: str = ""
    budget_bytes: int | None = None
    plan_path: str | None = None
    warm_start: WarmStart | None = None
    strategy: Route | None = None  # the default solve's route (`schedlang.solve.route.Route`), if it ran

    def to_json(self) -> dict:
        plan_field = self.plan_path if self.plan_path else (
            [op.to_json() for op in self.plan.ops] if self.plan else None)
        return {
            "status": self.status.value,
            "objective": self.objective,
            "bound": self.bound,
            "gap": self.gap,
            "backend": self.backend,
            "solver": self.solver,
            "budget_bytes": self.budget_bytes,
            "model_size": self.model_size,
            "timings": {k: round(v, 6) for k, v in self.timings.items()},
            "predicted": {"peak_bytes": self.plan.predicted_peak if self.plan else None,
                          "time": self.plan.predicted_time if self.plan else None},
            "simulated": ({"valid": self.simulated.valid, "peak_bytes": self.simulated.peak_bytes,
                           "time": self.simulated.time, "errors": self.simulated.errors[:10]}
                          if self.simulated else None),
            "message": self.message,
            "warm_start": self.warm_start.to_json() if self.warm_start else None,
            "strategy": self.strategy.to_json() if self.strategy is not None else None,
            "plan": plan_field,
        }



@dataclass
class WarmStart:
    """What became of a requested MIP start (`Problem.solve(warm_start=...)`).

    `planner`: the planner's name (a Plan: its meta's planner, else "plan"; a vector: None);
    `time`, `peak_bytes`, `fits`: the plan replayed by the simulator against the budget
    (None for a vector); `encoded`: the plan was written in the model's variables;
    `feasible`: that vector satisfies the model's rows, bounds and integrality; `objective`:
    its objective value; `passed`: it was handed to the backend (only feasible vectors are);
    `accepted`: the backend gave it to the solver as a MIP start (the solver takes a feasible
    start as its first incumbent); `message`: why not, when not.
    """

    planner: str | None = None
    time: float | None = None
    peak_bytes: int | None = None
    fits: bool | None = None
    valid: bool | None = None
    encoded: bool = False
    feasible: bool = False
    objective: float | None = None
    passed: bool = False
    accepted: bool = False
    message: str = ""
    x: object = field(default=None, repr=False)  # the full-length vector, when encoded
    auto: list | None = None  # warm_start="auto": the planners tried (this one the best)
    plan: object = field(default=None, repr=False)  # the planner's Plan, when one ran
    # the plan fits but lies outside the model (e.g. `shift`'s reordering against a fixed-order
    # model): the solve's incumbent itself, returned when the solver finds nothing better
    outside: bool = False

    def to_json(self) -> dict:
        return {"planner": self.planner, "time": self.time, "peak_bytes": self.peak_bytes,
                "fits": self.fits, "valid": self.valid, "encoded": self.encoded,
                "feasible": self.feasible, "objective": self.objective,
                "passed": self.passed, "accepted": self.accepted, "message": self.message,
                "auto": self.auto}

    def summary(self) -> str:
        """One line for `Result.message` and the CLI."""
        who = f"planner {self.planner}" if self.planner else "the given vector"
        if self.auto:
            who += f" (best of {', '.join(self.auto)})"
        if self.time is not None:
            fit = "fits" if self.fits else ("over the budget" if self.valid else "invalid plan")
            who += f" (time {self.time:.6g}, {fit})"
        if self.accepted:
            return f"warm start from {who}: given to the solver as a MIP start"
        if self.outside:
            return f"warm start from {who}: outside the model, kept as the incumbent: {self.message}"
        return f"warm start from {who} not used, solved cold: {self.message}"



@dataclass
class PlanReport:
    """A heuristic planner's plan, replayed (`Problem.plan`).

    `simulated.valid`: the plan replays (dependencies, phantoms, every node computed);
    `fits`: its peak (and, on layered data, its loss-phase memory) is within the budgets;
    `problems`: the replay errors and the budget excesses; `overhead`: its time over the
    no-recomputation plan's (`reference`), minus 1."""

    planner: str
    graph: Graph
    plan: Plan
    simulated: SimResult
    reference: SimResult
    budget_bytes: int | None
    save_budget_bytes: int | None
    fits: bool
    overhead: float | None
    problems: list[str]
    timings: dict
    plan_path: str | None = None

    @property
    def status(self) -> str:
        """"feasible" when the plan fits (or there is no budget), else "infeasible"."""
        return "feasible" if self.fits else "infeasible"

    @property
    def exit_code(self) -> int:
        """`schedlang plan`'s: 0 fits, 3 over a budget, 5 a plan that does not replay."""
        if not self.simulated.valid:
            return 5
        return 0 if self.fits else 3

    def to_json(self) -> dict:
        sim, plan = self.simulated, self.plan
        return {
            "status": self.status,
            "objective": sim.time,
            "bound": plan.meta.get("lp_bound"),  # a planner that proves one (lp_rounding)
            "gap": plan.meta.get("gap"),
            "planner": self.planner,
            "view": graph_view(self.graph),
            "budget_bytes": self.budget_bytes,
            "save_budget_bytes": self.save_budget_bytes,
            "fits_budget": self.fits,
            "overhead": self.overhead,
            "reference": {"peak_bytes": self.reference.peak_bytes, "time": self.reference.time},
            "timings": {k: round(v, 6) for k, v in self.timings.items()},
            "predicted": {"peak_bytes": plan.predicted_peak, "time": plan.predicted_time},
            "simulated": {"valid": sim.valid, "peak_bytes": sim.peak_bytes, "time": sim.time,
                          "fits_budget": self.fits, "save_peak_bytes": sim.save_peak_bytes,
                          "errors": self.problems[:10]},
            "message": "" if sim.valid else "the plan does not replay in the simulator",
            "plan": self.plan_path if self.plan_path else [op.to_json() for op in plan.ops],
        }
