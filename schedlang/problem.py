"""The Python API: load -> check -> lower -> solve -> decode -> simulate, timed per stage.

    prob = schedlang.load("examples/chain.sched", budget="90%")
    result = prob.solve(backend="pyomo", solver="highs", time_limit=60)
    result.status, result.objective, result.plan, result.simulated

`schedlang.cli` is a thin layer over this module.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from .check import check_program
from .decoders import decode
from .errors import CheckError, DataError, Loc
from .graph import Graph
from .ir import IRModel
from .plan import Plan
from .program import Program, load_program
from .simulate import SimResult, no_recompute_peak, simulate
from .solution import Solution, Status
from .units import parse_size


def resolve_budget(text, graph: Graph | None, loc: Loc = Loc("--budget")) -> int:
    """A budget given as bytes, a size ('14GiB') or a percent of the no-recomputation peak."""
    if isinstance(text, (int, float)):
        return int(text)
    s = str(text).strip()
    if s.endswith("%"):
        if graph is None:
            raise DataError("a budget in percent needs graph data", loc)
        try:
            pct = float(s[:-1])
        except ValueError:
            raise DataError(f"'{s}' is not a percentage", loc) from None
        if pct <= 0:
            raise DataError(f"budget {s} must be positive", loc)
        # rounded up, so that 90% of vgg16_train is the architecture doc's 14242598093 B
        return -(-no_recompute_peak(graph) * int(round(pct * 1000)) // 100_000)
    try:
        value = parse_size(s)
    except ValueError as exc:
        raise DataError(str(exc), loc) from None
    if value <= 0:
        raise DataError(f"budget {s} must be positive", loc)
    return value


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
            "plan": plan_field,
        }


@dataclass
class Problem:
    program: Program
    timings: dict = field(default_factory=dict)
    ir: IRModel | None = None

    @property
    def graph(self) -> Graph | None:
        return self.program.graph

    @property
    def budgets(self) -> dict:
        return self.program.budgets

    def check(self) -> None:
        t0 = time.perf_counter()
        check_program(self.program)
        self.timings["check"] = time.perf_counter() - t0

    def lower(self) -> IRModel:
        from .lower import lower_program

        if "check" not in self.timings:
            self.check()
        t0 = time.perf_counter()
        self.ir = lower_program(self.program, self.graph, self.budgets)
        self.timings["lower"] = time.perf_counter() - t0
        return self.ir

    def solve(self, backend: str = "pyomo", solver: str = "highs", time_limit: float | None = None,
              gap: float | None = None, threads: int | None = None, presolve: bool = True,
              warm_start=None, verbose: bool = False) -> Result:
        from .backends import solve_ir

        ir = self.ir if self.ir is not None else self.lower()
        sol = solve_ir(ir, backend=backend, solver=solver, time_limit=time_limit, gap=gap,
                       threads=threads, presolve=presolve, warm_start=warm_start, verbose=verbose)
        timings = dict(self.timings)
        timings["presolve"] = sol.timings.get("presolve", 0.0)
        timings["build"] = sol.timings.get("build", 0.0)
        timings["solve"] = sol.timings.get("solve", 0.0)
        plan = sim = None
        if sol.status.has_solution and self.graph is not None:
            t0 = time.perf_counter()
            plan = decode(self.program, ir, sol, self.graph)
            timings["decode"] = time.perf_counter() - t0
            if plan is not None:
                plan.budget_peak = self.budgets.get("peak")
                plan.budget_save = self.budgets.get("save")
                t0 = time.perf_counter()
                sim = simulate(plan, self.graph)
                timings["simulate"] = time.perf_counter() - t0
        return Result(sol.status, sol.objective, sol.bound, sol.gap, sol.backend, sol.solver,
                      sol.model_size or ir.size_summary(), timings, plan, sim, sol, sol.message,
                      self.budgets.get("peak"))


def load(*paths, model: str | None = None, budget=None, text: str | None = None) -> Problem:
    """Parse and merge files (and/or text) into a Problem; `budget` overrides the data's peak."""
    t0 = time.perf_counter()
    program = load_program([Path(p) for p in paths], [model] if model else None, text=text)
    if not program.has_formulation and program.graph is not None:
        if program.graph.layers:
            raise CheckError(f"graph '{program.graph.name}' is layered data and no formulation was "
                             "given: `use` a model that indexes the H-graph, or pass --model",
                             program.graph.loc)
        # node/edge graph data alone: solve it with Checkmate, the classic formulation
        program = load_program([Path(p) for p in paths], ["checkmate"], text=text)
    elapsed = time.perf_counter() - t0
    if budget is not None:
        program.budgets["peak"] = resolve_budget(budget, program.graph)
    return Problem(program, {"parse": elapsed})

