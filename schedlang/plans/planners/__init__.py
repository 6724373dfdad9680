"""Heuristic planners: graph data (+ a peak budget) -> a Plan, like the ILPs' decoded plans.

Every planner returns the same `Plan` type, so the simulator, the sweep, the plots and the
runtime treat heuristic and ILP plans alike. One module per family of planners; each module
defines ``PLANNERS: dict[str, Planner]`` and is listed in ``MODULES`` below.

A planner that needs layered data (options, phantoms) and is given a Checkmate-style graph (or
the reverse) raises `PlannerNotApplicable` (exit 2) saying why.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from ...graphs.graph import Graph
from ...language.errors import SchedError, did_you_mean
from ..plan import Plan

# Modules that define PLANNERS, in the order `schedlang plan --list` shows them.
MODULES = ["baselines", "mutwo", "shift", "gaps", "lp_rounding", "portfolio"]


class PlannerNotApplicable(SchedError):
    """The planner cannot work on this kind of graph data (exit 2)."""


@dataclass(frozen=True)
class Planner:
    name: str
    description: str  # one line, for `schedlang plan --list`
    run: Callable[..., Plan]  # run(graph, budget: int | None, **options) -> Plan
    views: tuple[str, ...] = ("checkmate", "layered")  # the graph vocabularies it works on


def graph_view(graph: Graph) -> str:
    return "layered" if graph.is_layered else "checkmate"


def planners() -> dict[str, Planner]:
    out: dict[str, Planner] = {}
    for name in MODULES:
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"{__name__}.{name}":
                continue  # a planner module that is not written yet
            raise
        out.update(module.PLANNERS)
    return out


def run_planner(name: str, graph: Graph, budget: int | None = None, **options) -> Plan:
    table = planners()
    planner = table.get(name)
    if planner is None:
        raise SchedError(f"unknown planner '{name}'{did_you_mean(name, table)}; planners: "
                         f"{', '.join(table)} (schedlang plan --list)")
    view = graph_view(graph)
    if view not in planner.views:
        raise PlannerNotApplicable(
            f"planner '{name}' works on {' and '.join(planner.views)} graph data, and graph "
            f"'{graph.name}' is {view} data", graph.loc)
    plan = planner.run(graph, budget, **options)
    plan.budget_peak = budget
    plan.meta.setdefault("planner", name)
    return plan
