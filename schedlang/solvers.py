"""The solver registry: one name per solver, whatever the backend.

A solver is chosen by one of `SOLVER_NAMES` (``highs`` by default). For each backend the
registry knows which native interface drives it (a Pyomo solver name, a CVXPY solver
constant), how the common options (`time_limit` in seconds, relative MIP `gap`, `threads`)
are spelled there, what the solver's default relative gap is, and whether the backend can
pass it a MIP start. Nothing here builds or solves a model.

Every option set carries the solver's absolute MIP gap set to 0 where the solver has one:
objectives are often small numbers (seconds), and a default absolute gap of 1e-6 would stop
far from the optimum.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

from .errors import SolverUnavailable, did_you_mean

BACKEND_NAMES = ("pyomo", "cvxpy")
SOLVER_NAMES = ("highs", "gurobi", "scip", "cbc", "glpk")
DEFAULT_SOLVER = "highs"


@dataclass(frozen=True)
class SolverInfo:
    name: str
    default_gap: float  # the solver's own default relative MIP gap
    # Pyomo: interface names tried in order; the first available one is used.
    pyomo: tuple[str, ...]
    # CVXPY: the solver constant (a string, as `cvxpy.installed_solvers()` lists it).
    cvxpy: str
    # Which backends can pass a MIP start to this solver.
    warm_start: frozenset = field(default_factory=frozenset)
    doc: str = ""


SOLVERS: dict[str, SolverInfo] = {
    "highs": SolverInfo(
        "highs", 1e-4, ("stdform_highs", "appsi_highs", "highs"), "HIGHS",
        warm_start=frozenset({"pyomo", "cvxpy"}),
        doc="HiGHS (highspy), embedded, the default"),
    "gurobi": SolverInfo(
        "gurobi", 1e-4, ("gurobi_direct",), "GUROBI",
        warm_start=frozenset({"pyomo", "cvxpy"}),
        doc="Gurobi (gurobipy); a size-limited licence caps models at 2000 variables/rows"),
    "scip": SolverInfo(
        "scip", 0.0, ("scip_direct",), "SCIP",
        warm_start=frozenset({"pyomo"}),
        doc="SCIP (pyscipopt)"),
    "cbc": SolverInfo(
        "cbc", 0.0, ("cbc",), "CBC",
        warm_start=frozenset({"pyomo"}),
        doc="COIN-OR CBC (the `cbc` binary for Pyomo, cylp for CVXPY)"),
    "glpk": SolverInfo(
        "glpk", 0.0, ("glpk",), "GLPK_MI",
        warm_start=frozenset(),
        doc="GLPK (the `glpsol` binary for Pyomo, cvxopt for CVXPY)"),
}

# Pyomo interface names that live in `pyomo.contrib.solver` (the new solver API); the
# others are Pyomo's classic `SolverFactory` plugins (appsi_highs has its own API), and
# `stdform_highs`: the model compiled by Pyomo's LinearStandardFormCompiler and handed to
# highspy in one call (schedlang's own driver; 6-9x faster than appsi_highs' translation).
PYOMO_CONTRIB = frozenset({"highs", "gurobi_direct", "scip_direct"})
PYOMO_OWN = frozenset({"stdform_highs"})


def check_backend(backend: str) -> str:
    if backend not in BACKEND_NAMES:
        raise SolverUnavailable(
            f"unknown backend '{backend}'{did_you_mean(backend, BACKEND_NAMES)}; "
            f"backends: {', '.join(BACKEND_NAMES)}")
    return backend


# --------------------------------------------------------------------------- availability

def _pyomo_interface_available(interface: str) -> bool:
    try:
        if interface == "stdform_highs":
            import highspy  # noqa: F401
            from pyomo.repn.plugins.standard_form import LinearStandardFormCompiler  # noqa: F401
            return True
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


@lru_cache(maxsize=None)
def pyomo_interface(solver: str) -> str | None:
    """The Pyomo interface name used for `solver`, or None when none is available."""
    for interface in SOLVERS[solver].pyomo:
        if _pyomo_interface_available(interface):
            return interface
    return None


@lru_cache(maxsize=None)
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


def resolve(solver: str, backend: str) -> SolverInfo:
    """The registry entry for `solver`, or `SolverUnavailable` naming the usable ones."""
    check_backend(backend)
    name = (solver or DEFAULT_SOLVER).lower()
    if name not in SOLVERS:
        raise SolverUnavailable(
            f"unknown solver '{solver}'{did_you_mean(name, SOLVER_NAMES)}; "
            f"solvers: {', '.join(SOLVER_NAMES)} "
            f"(available with the {backend} backend: "
            f"{', '.join(available_solvers(backend)) or 'none'})")
    if not is_available(name, backend):
        available = available_solvers(backend)
        raise SolverUnavailable(
            f"solver '{name}' is not available with the {backend} backend; "
            f"available: {', '.join(available) or 'none'}")
    return SOLVERS[name]


# --------------------------------------------------------------------------- option mapping

@dataclass
class NativeOptions:
    """Options in the spelling of one solver interface, plus notes on what was dropped."""

    options: dict
    notes: list[str] = field(default_factory=list)


def native_options(solver: str, backend: str, time_limit: float | None = None,
                   gap: float | None = None, threads: int | None = None) -> NativeOptions:
    """Map the common options to the native names of `solver` driven by `backend`.

    Pyomo interfaces get solver-native parameter names (passed as solver options); CVXPY gets
    the keyword arguments of its solver interface. Options a solver cannot honour are left
    out and reported in `notes`.
    """
    check_backend(backend)
    if time_limit is not None and (not math.isfinite(time_limit) or time_limit < 0):
        raise ValueError(f"time_limit must be a non-negative number of seconds, not {time_limit}")
    if gap is not None and not (gap >= 0):
        raise ValueError(f"gap must be a non-negative relative gap, not {gap}")
    if threads is not None and threads < 0:
        raise ValueError(f"threads must be non-negative, not {threads}")
    opts: dict = {}
    notes: list[str] = []
    s = solver
    if s == "highs":
        opts["mip_abs_gap"] = 0.0
        if time_limit is not None:
            opts["time_limit"] = float(time_limit)
        if gap is not None:
            opts["mip_rel_gap"] = float(gap)
        if threads is not None:
            opts["threads"] = int(threads)
    elif s == "gurobi":
        opts["MIPGapAbs"] = 0.0
        if time_limit is not None:
            opts["TimeLimit"] = float(time_limit)
        if gap is not None:
            opts["MIPGap"] = float(gap)
        if threads is not None:
            opts["Threads"] = int(threads)
    elif s == "scip":
        params = {"limits/absgap": 0.0}
        if time_limit is not None:
            params["limits/time"] = float(time_limit)
        if gap is not None:
            params["limits/gap"] = float(gap)
        if threads is not None:
            notes.append("scip solves with one thread; the threads option was ignored")
        if backend == "cvxpy":
            opts["scip_params"] = params
        else:
            opts.update(params)
    elif s == "cbc":
        if backend == "pyomo":  # command-line options of the cbc binary
            opts["allowableGap"] = 0.0
            if time_limit is not None:
                opts["sec"] = float(time_limit)
            if gap is not None:
                opts["ratioGap"] = float(gap)
            if threads is not None:
                opts["threads"] = int(threads)
        else:  # attributes of cylp's CyCbcModel
            opts["allowableGap"] = 0.0
            if time_limit is not None:
                opts["maximumSeconds"] = float(time_limit)
            if gap is not None:
                opts["allowableFractionGap"] = float(gap)
            if threads is not None:
                opts["numberThreads"] = int(threads)
    elif s == "glpk":
        # GLPK has no absolute MIP gap and runs on one thread.
        if threads is not None:
            notes.append("glpk solves with one thread; the threads option was ignored")
        if backend == "pyomo":  # glpsol command line: whole seconds
            if time_limit is not None:
                secs = max(1, math.ceil(time_limit))
                if secs != time_limit:
                    notes.append(f"glpsol takes whole seconds: time limit {time_limit:g} s "
                                 f"rounded up to {secs} s")
                opts["tmlim"] = secs
            if gap is not None:
                opts["mipgap"] = float(gap)
        else:  # cvxopt.glpk options: milliseconds
            if time_limit is not None:
                opts["tm_lim"] = max(1, int(math.ceil(time_limit * 1000)))
            if gap is not None:
                opts["mip_gap"] = float(gap)
    else:
        raise SolverUnavailable(f"unknown solver '{solver}'{did_you_mean(solver, SOLVER_NAMES)}")
    return NativeOptions(opts, notes)


def requested_gap(solver: str, gap: float | None) -> float:
    """The relative gap a run was asked to reach (the solver's default when not given)."""
    return float(gap) if gap is not None else SOLVERS[solver].default_gap


def supports_warm_start(solver: str, backend: str) -> bool:
    return backend in SOLVERS[solver].warm_start
