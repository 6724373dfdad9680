"""What a solver adapter is: the knowledge of one solver, for every backend.

An adapter (one module per solver in this package: `highs`, `gurobi`, `scip`, `cbc`,
`glpk`) is a `SolverAdapter` subclass instance that says

* its name, its default relative MIP gap, the Pyomo interfaces that drive it (tried in
  order), its cvxpy constant, which backends can pass it a MIP start;
* `options(backend, ...)`: the common options (`time_limit` in seconds, relative MIP `gap`,
  `threads`) in its native spelling for that backend;
* how to read its answer: `read_cvxpy` (cvxpy's raw solver answer -> `RawResult`) and
  `adjust_classic` (Pyomo's classic plugins: log-reading quirks), with its own termination
  table where it has native statuses;
* `session(threads, verbose)`: a context manager around one solve, for process-wide solver
  state that must be set and then restored (HiGHS's thread scheduler, its banner).

Registering it is one line in `schedlang/solve/solvers/__init__.py` (`ADAPTERS`). Nothing here
builds a model; the backends (`schedlang/solve/backends/`) call these hooks.
"""
from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass, field

import numpy as np

from ..status import CVXPY, ERROR, LIMIT, OPTIMAL, UNKNOWN, RawResult, termination


@dataclass
class NativeOptions:
    """Options in the spelling of one solver interface, plus notes on what was dropped."""

    options: dict
    notes: list[str] = field(default_factory=list)


@dataclass
class CvxpyAnswer:
    """What cvxpy's solving chain returned for one solve, for an adapter to read.

    `raw`: the solver interface's raw answer (a dict); `status`: cvxpy's status after
    unpacking (None when unpacking raised); `x`: the cvxpy Variable; bounds the solvers
    report are for the canonical problem ``min sense*c@x`` without the objective constant:
    in the model's terms a value v is ``sense*v + constant`` (`model_value`)."""

    raw: dict
    status: str | None
    x: object
    sense: float
    constant: float
    options: dict
    time_limit: float | None = None
    solve_time: float = 0.0

    def x_value(self) -> np.ndarray | None:
        v = self.x.value
        return None if v is None else np.asarray(v, dtype=float).ravel()

    def model_value(self, v: float) -> float:
        return self.sense * v + self.constant


@dataclass(frozen=True)
class SolverAdapter:
    name: str
    default_gap: float  # the solver's own default relative MIP gap
    pyomo: tuple[str, ...]  # Pyomo interface names, tried in order; the first available wins
    cvxpy: str  # the cvxpy solver constant (as `cvxpy.installed_solvers()` lists it)
    warm_start: frozenset = frozenset()  # backends that can pass it a MIP start
    doc: str = ""
    #: how to install it, per backend: (("pyomo", "pip install pyscipopt"), ...); "*": any
    install: tuple = ()

    def install_hint(self, backend: str) -> str:
        """The command that makes this solver available with `backend` ('' if unknown)."""
        table = dict(self.install)
        return table.get(backend) or table.get("*", "")

    # ---------------------------------------------------------------- options
    def options(self, backend: str, time_limit: float | None, gap: float | None,
                threads: int | None) -> NativeOptions:
        """The common options in this solver's spelling for `backend` (validated already)."""
        raise NotImplementedError

    # ---------------------------------------------------------------- availability
    def pyomo_interface_available(self, interface: str) -> bool | None:
        """True/False for an interface this adapter provides itself; None: ask Pyomo."""
        return None

    # ---------------------------------------------------------------- reading answers
    def read_cvxpy(self, ans: CvxpyAnswer) -> RawResult:
        """cvxpy's answer -> RawResult; by default from cvxpy's own status."""
        return read_cvxpy_status(ans, f"cvxpy status {ans.status}")

    def cvxpy_solve(self, chain, prob, data, warm: bool, verbose: bool, opts: dict,
                    start: np.ndarray | None, dropped: list):
        """Run cvxpy's solving chain on `data`; `start`: the MIP start (None: none). An
        adapter that cannot pass `start` appends the reason to `dropped`."""
        return chain.solve_via_data(prob, data, warm, verbose, opts)

    def adjust_classic(self, raw: RawResult, log: str, is_mip: bool,
                       sense_min: bool) -> RawResult:
        """Fix up what Pyomo's classic plugin made of this solver's answer (its `log`)."""
        return raw

    # ---------------------------------------------------------------- process state
    @contextlib.contextmanager
    def session(self, threads: int | None, verbose: bool):
        """Around one solve: set up, then restore, what the solver keeps per process."""
        yield


def spell(names: tuple, time_limit: float | None, gap: float | None, threads: int | None,
          **fixed) -> dict:
    """The common options under a solver's `names` for (time limit, relative gap, threads)
    (None: the solver has no such option), those not given left out, plus `fixed`."""
    opts = dict(fixed)
    for name, value, kind in zip(names, (time_limit, gap, threads), (float, float, int)):
        if name is not None and value is not None:
            opts[name] = kind(value)
    return opts


def read_cvxpy_status(ans: CvxpyAnswer, detail: str) -> RawResult:
    term = termination(CVXPY, ans.status) if ans.status is not None else ERROR
    xv = ans.x_value() if term in (OPTIMAL, LIMIT, UNKNOWN) else None
    return RawResult(term, x=xv, detail=detail)


@contextlib.contextmanager
def output_to_stderr():
    """Solvers print banners and logs on file descriptor 1 (Gurobi's licence line, HiGHS and
    cvxpy logs with verbose=True); send them to stderr so that stdout stays clean for
    `schedlang solve --json`. File descriptor 1 is restored on exit."""
    with _fd1_to(2):
        yield


@contextlib.contextmanager
def output_discarded():
    """File descriptor 1 to /dev/null while the block runs; restored on exit."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        with _fd1_to(null):
            yield
    finally:
        os.close(null)


@contextlib.contextmanager
def _fd1_to(fd: int):
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError, AttributeError):
        yield
        return
    try:
        os.dup2(fd, 1)
        yield
    finally:
        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            pass
        os.dup2(saved, 1)
        os.close(saved)
