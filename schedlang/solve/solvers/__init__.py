"""The solver registry: one name per solver, whatever the backend.

A solver is chosen by one of `SOLVER_NAMES` (``highs`` by default). Each solver is one
adapter module in this package (`highs.py`, `gurobi.py`, `scip.py`, `cbc.py`, `glpk.py`,
`cpsat.py`;
what an adapter says: `base.py`), and `ADAPTERS` below lists them: adding a solver is one
file and one line there. This module answers, for a solver and a backend: is it installed
(`is_available`, `pyomo_interface`), how are the common options spelled (`native_options`),
what gap counts as optimal (`requested_gap`), can a MIP start be passed
(`supports_warm_start`). How a solver's answer becomes a status: `status.py`. Nothing
here builds or solves a model (`schedlang.solve.backends` does).

Every option set carries the solver's absolute MIP gap set to 0 where the solver has one:
objectives are often small numbers (seconds), and a default absolute gap of 1e-6 would stop
far from the optimum.
"""
from __future__ import annotations

import math
from functools import cache

from ...language.errors import Loc, SolverUnavailable, did_you_mean
from . import cbc, cpsat, glpk, gurobi, highs, scip
from .base import CvxpyAnswer, NativeOptions, SolverAdapter

BACKEND_NAMES = ("pyomo", "cvxpy")

ADAPTERS: tuple[SolverAdapter, ...] = (
    highs.ADAPTER,
    gurobi.ADAPTER,
    scip.ADAPTER,
    cbc.ADAPTER,
    glpk.ADAPTER,
    cpsat.ADAPTER,
)
SOLVERS: dict[str, SolverAdapter] = {a.name: a for a in ADAPTERS}
SOLVER_NAMES = tuple(SOLVERS)
DEFAULT_SOLVER = "highs"
#: where an unknown or unavailable solver is reported: the command line's option
SOLVER_LOC = Loc("--solver")

# Pyomo interface names that live in `pyomo.contrib.solver` (the new solver API); the
# others are Pyomo's classic `SolverFactory` plugins, appsi_highs (its own API) and the
# interfaces an adapter provides itself (`highs.solve_pyomo_stdform`).
PYOMO_CONTRIB = frozenset({"highs", "gurobi_direct", "scip_direct"})

__all__ = ["ADAPTERS", "BACKEND_NAMES", "CvxpyAnswer", "DEFAULT_SOLVER", "NativeOptions",
           "PYOMO_CONTRIB", "SOLVERS", "SOLVER_NAMES", "SolverAdapter", "available_solvers",
           "check_backend", "is_available", "native_options", "pyomo_interface",
           "requested_gap", "resolve", "supports_warm_start"]


def check_backend(backend: str) -> str:
    if backend not in BACKEND_NAMES:
        raise SolverUnavailable(
            f"unknown backend '{backend}'{did_you_mean(backend, BACKEND_NAMES)}; "
            f"backends: {', '.join(BACKEND_NAMES)}")
    return backend


# --------------------------------------------------------------------------- availability

def _pyomo_interface_available(adapter: SolverAdapter, interface: str) -> bool:
    own = adapter.pyomo_interface_available(interface)
    if own is not None:
        return own
    try:
        import pyomo.environ  # noqa: F401  (registers every solver plugin)
        if interface in PYOMO_CONTRIB:
            from pyomo.contrib.solver.common.factory import SolverFactory
        else:
            from pyomo.environ import SolverFactory
        opt = SolverFactory(interface)
        if opt is None:
            return False
        if interface in PYOMO_CONTRIB:
            return bool(opt.available())
        return bool(opt.available(exception_flag=False))
    except Exception:  # a broken installation is an unavailable solver
        return False


@cache
def pyomo_interface(solver: str) -> str | None:
    """The Pyomo interface name used for `solver`, or None when none is available."""
    adapter = SOLVERS[solver]
    for interface in adapter.pyomo:
        if _pyomo_interface_available(adapter, interface):
            return interface
    return None


@cache
def _cvxpy_installed() -> frozenset:
    try:
        import cvxpy
        return frozenset(cvxpy.installed_solvers())
    except Exception:
        return frozenset()


def is_available(solver: str, backend: str) -> bool:
    check_backend(backend)
    if solver not in SOLVERS:
        return False
    if backend == "pyomo":
        return pyomo_interface(solver) is not None
    return SOLVERS[solver].cvxpy in _cvxpy_installed()


def available_solvers(backend: str) -> list[str]:
    """The registry's solver names usable with `backend`, in registry order."""
    check_backend(backend)
    return [name for name in SOLVER_NAMES if is_available(name, backend)]


def resolve(solver: str, backend: str) -> SolverAdapter:
    """The adapter for `solver`, or `SolverUnavailable` naming the usable ones."""
    check_backend(backend)
    name = (solver or DEFAULT_SOLVER).lower()
    if name not in SOLVERS:
        raise SolverUnavailable(
            f"unknown solver '{solver}'{did_you_mean(name, SOLVER_NAMES)}; "
            f"solvers: {', '.join(SOLVER_NAMES)} "
            f"(available with the {backend} backend: "
            f"{', '.join(available_solvers(backend)) or 'none'})", SOLVER_LOC)
    if not is_available(name, backend):
        available = available_solvers(backend)
        hint = SOLVERS[name].install_hint(backend)
        raise SolverUnavailable(
            f"solver '{name}' is not available with the {backend} backend"
            + (f": install it with `{hint}`" if hint else "")
            + f"; available: {', '.join(available) or 'none'}", SOLVER_LOC)
    return SOLVERS[name]


# --------------------------------------------------------------------------- options

def native_options(solver: str, backend: str, time_limit: float | None = None,
                   gap: float | None = None, threads: int | None = None,
                   extra: dict | None = None) -> NativeOptions:
    """Map the common options to the native names of `solver` driven by `backend`; `extra`:
    options already in the solver's spelling, set after them (so they may override them).

    Pyomo interfaces get solver-native parameter names (passed as solver options); CVXPY gets
    the keyword arguments of its solver interface. Options a solver cannot honour are left
    out and reported in `notes`. Invalid values raise `ValueError`.
    """
    check_backend(backend)
    if time_limit is not None and (not math.isfinite(time_limit) or time_limit < 0):
        raise ValueError(f"time_limit must be a non-negative number of seconds, not {time_limit}")
    if gap is not None and not (gap >= 0):
        raise ValueError(f"gap must be a non-negative relative gap, not {gap}")
    if threads is not None and threads < 0:
        raise ValueError(f"threads must be non-negative, not {threads}")
    if solver not in SOLVERS:
        raise SolverUnavailable(f"unknown solver '{solver}'{did_you_mean(solver, SOLVER_NAMES)}")
    opts = SOLVERS[solver].options(backend, time_limit, gap, threads)
    opts.options.update(extra or {})
    return opts


def requested_gap(solver: str, gap: float | None) -> float:
    """The relative gap a run was asked to reach (the solver's default when not given)."""
    return float(gap) if gap is not None else SOLVERS[solver].default_gap


def supports_warm_start(solver: str, backend: str) -> bool:
    return backend in SOLVERS[solver].warm_start
