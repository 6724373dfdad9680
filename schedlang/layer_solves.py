"""The op-level sub-solves of the hierarchy as independent jobs, and their on-disk cache.

`schedlang.pytorch.options.solve_spans` solves a layer's op graph (Checkmate-view graph data)
with the option-generating model at series of budgets; each series stops at its first budget
without a solution. The solves do not depend on each other, so `solve_series` runs them all
through `schedlang.parallel.run_jobs` (worker processes where cores allow, Ray when asked),
the series interleaved; the budgets of a series after one without a solution are not started
(one already running is wasted, not used). The series are then read in order, as the
one-after-the-other loop reads them: the same solutions, in the same order. With ``jobs=1``
they are solved in this process.

This module does not import torch, so that worker processes start without it.

On-disk cache (opt-in): with ``SCHEDLANG_CACHE_DIR`` set (or ``cache_dir=`` given), the
distinct solutions of a layer are stored as JSON under that folder, keyed by the layer's
structure key (what `generate_options` caches on in the process: partition signature, input
shapes, which inputs need a gradient), the text of the option model and of every file it
`use`s, the budget series, the solver and the schedlang version; a later process fitting a
structurally identical layer reads them instead of solving again. An unreadable entry is
solved again and rewritten.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
from pathlib import Path

import schedlang

from . import __version__, progress
from .language.errors import CheckError, Loc
from .language.files import write_file
from .language.paths import exists, writable_folder
from .language.program import load_program, resolve_model
from .parallel import run_jobs
from .plans.decoders.segments import segments_of

__all__ = ["budget_series", "free_peak", "solve_series", "solve_segments", "segments_allowed",
           "cache_path", "CACHE_ENV", "SUB_SOLVE_OPTIONS"]

CACHE_ENV = "SCHEDLANG_CACHE_DIR"

#: the solver's own options for the option model's sub-solves: HiGHS without its presolve. On
#: the op graphs of `transformers` blocks its presolve (probing thousands of binaries) took 6
#: to 8 s of a 10 s sub-solve before the first cut: T5's 152-node decoder block got no cut at
#: any budget, and so no generated option; without it, a cut at every budget that has one and
#: the same optima, sooner, where both prove one (bench/README.md, eleventh session)
SUB_SOLVE_OPTIONS = {"highs": {"presolve": "off"}}


def budget_series(graph, saved_total: int, fractions) -> list[list[dict]]:
    """The option model's two series of budgets on a layer's op graph (Checkmate view, no
    loss node) that autograd saves `saved_total` bytes inside: `fractions` of it on the
    backward's peak (`budget peak`), then on the phantom alone (`budget save`), each 1 KiB
    above; the phantom series with the peak left free (`free_peak`)."""
    free = free_peak(graph)
    return [[{"peak": int(saved_total * f) + 1024} for f in fractions],
            [{"peak": free, "save": int(saved_total * f) + 1024} for f in fractions]]


def free_peak(graph) -> int:
    """A peak budget that leaves a layer's op graph free: twice what all its forward's units
    create never binds (the phantom and a round hold at most all of it), and unlike an
    astronomical bound it keeps the `implies` rows' big-M, and so the tie-break on the peak, at
    the layer's scale."""
    return 2 * sum(n.size for n in graph.nodes if n.kind == "forward") + (1 << 20)


def solve_segments(budgets: dict, graph, model: str, solver: str, time_limit) -> list | None:
    """One sub-solve (a job): `model` on `graph` at `budgets`; the solution's segments
    (`decoders.segments.segments_of`, sorted), or None when it has no solution."""

    g = copy.copy(graph)
    g.budgets = dict(budgets)
    prob = schedlang.load(model=model, graph=g)
    res = prob.solve(solver=solver, time_limit=time_limit,
                     solver_options=SUB_SOLVE_OPTIONS.get(solver))
    if not res.status.has_solution:
        return None
    return sorted(tuple(s) for s in segments_of(prob.program, prob.ir, res.solution))


def segments_allowed(budgets: dict, graph, model: str, segments: list[tuple],
                     solver: str = "highs", time_limit=None) -> bool:
    """Whether `model` on `graph` at `budgets` has a solution with exactly `segments`
    ([(first unit, last unit, checkpointed)]): its `checkpointed` and `kept` roles fixed to
    them (column bounds), everything else left to the solver (False where a role is an
    expression, not a variable). The generator's own constructions on a solution
    (`options._with_rounds_merged`) are offered only where the formulation allows them."""
    g = copy.copy(graph)
    g.budgets = dict(budgets)
    prob = schedlang.load(model=model, graph=g)
    ir = prob.lower()
    decl = prob.program.decode
    if decl is None:
        raise CheckError(f"the option model '{model}' declares no decoder: its segments' roles "
                         "come with `decode segments(checkpointed = ..., kept = ...)`", Loc(model))
    for role, ckpt in (("checkpointed", True), ("kept", False)):
        chosen = {(a, b) for a, b, c in segments if bool(c) == ckpt}
        try:
            fam = ir.family(decl.roles[role])
        except KeyError:  # the role is an expression of the model: its value cannot be fixed
            return False
        for k, key in enumerate(fam.keys):
            v = 1.0 if tuple(key) in chosen else 0.0
            if not fam.lb[k] <= v <= fam.ub[k]:
                return False
            fam.lb[k] = fam.ub[k] = v
    return prob.solve(solver=solver, time_limit=time_limit,
                      solver_options=SUB_SOLVE_OPTIONS.get(solver)).status.has_solution


def solve_series(graph, series: list[list[dict]], model: str, solver: str = "highs",
                 time_limit=None, jobs: int | None = None, ray: str | None = None) -> list[list]:
    """The distinct solutions (segment lists) of `model` on `graph` along each series of
    budgets, in order; each series stops at its first budget without a solution."""
    args = (graph, model, solver, time_limit)
    found: list[list] = []
    # the series interleaved, so that each one advances; a series' budgets after one without
    # a solution are not started (they would not be used)
    order = sorted(((j, i) for i, budgets in enumerate(series) for j in range(len(budgets))))
    flat = [series[i][j] for j, i in order]
    position = {(i, j): k for k, (j, i) in enumerate(order)}


    solved = [0]

    def series_end(k, budgets, spans):
        solved[0] += 1
        progress.step(solved[0], f"{'a' if spans is not None else 'no'} solution",
                      total=len(flat))
        if spans is not None:
            return ()
        j, i = order[k]
        return [position[i, m] for m in range(j + 1, len(series[i]))]

    with progress.phase("budgets solved", len(flat)):
        done = run_jobs(solve_segments, flat, args=args, jobs=jobs, ray=ray,
                        on_result=series_end, preload=("schedlang.solve.backends.pyomo_backend",))
    results = iter(done[position[i, j]] for i, budgets in enumerate(series)
                   for j in range(len(budgets)))
    for budgets in series:
        ended = False
        for _ in budgets:
            spans = next(results)
            ended = ended or spans is None
            if not ended and spans not in found:
                found.append(spans)
    return found


# ---------------------------------------------------------------------------- on-disk cache

def _model_text(model: str) -> str:
    """The option model's text and that of the files it `use`s (what its solutions depend on)."""
    path = resolve_model(model, Path.cwd(), Loc(model))
    texts = [path.read_text(encoding="utf-8")]
    try:
        for p in sorted(load_program([path]).files):
            if Path(p).resolve() != path.resolve():
                texts.append(Path(p).read_text(encoding="utf-8"))
    except Exception:  # the model's own errors come from the solve, not from here
        pass
    return "\n".join(texts)


def cache_path(key, model: str, series, solver: str, cache_dir=None) -> Path | None:
    """The cache file of a layer's solutions, or None when the cache is off."""
    folder = cache_dir or os.environ.get(CACHE_ENV)
    if not folder:
        return None

    # a folder that cannot hold the cache is the user's to fix: said once, located
    writable_folder(folder, Loc(CACHE_ENV if not cache_dir else "cache_dir"), "cache folder")
    digest = hashlib.sha256(repr((key, _model_text(model), series, solver, __version__))
                            .encode()).hexdigest()[:32]
    return Path(folder) / f"layer-{digest}.json"


def read_cached(path: Path | None) -> list[list] | None:
    if path is None or not exists(path):
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return [[tuple(s) for s in spans] for spans in data["solutions"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_cached(path: Path | None, found: list[list]) -> None:
    if path is None:
        return

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_file(path, json.dumps({"solutions": [[list(s) for s in spans] for spans in found]}))
    except Exception:  # a cache that cannot be written only costs the next run a solve
        pass
