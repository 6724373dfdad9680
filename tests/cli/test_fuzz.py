"""Fuzzing the whole pipeline through its real entry, `schedlang.cli.main` (issue 11, item 3).

Four sources of input, each a hypothesis test with a fixed seed (`derandomize=True`): token
mutations of every shipped model and example; grammar-built programs (`sched_strategies`);
plan JSON given to `simulate`; graph JSON given to `import`. Every case must end with an exit
code, never a traceback; a non-zero exit must come with a located message; no case may take
longer than `MAX_SECONDS`, and the size guard (`--max-elements`, small here) bounds memory:
the process's peak RSS may not grow by more than `MAX_RSS_GROWTH` over a whole test.

The default run makes a few hundred cases; `-m slow` runs more than 10,000
(`FUZZ_SLOW_CASES`); the printed summary gives the count and the longest case.
"""
from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ..fuzzing import PATH_KINDS, dump_json, mutate, mutate_json, peak_rss_bytes, run_cli, weird_path
from ..paths import EXAMPLES, ROOT
from ..sched_strategies import node_link_json, plan_json, sched_program

MAX_SECONDS = 15.0  # per case; measured longest: see docs/reliability.md (loaded 2-core machine)
MAX_RSS_GROWTH = 1 << 30
MAX_ELEMENTS = "200000"
SOLVE = ["--time-limit", "1", "--max-elements", MAX_ELEMENTS, "--quiet"]

# default run / slow run: cases per test (the slow ones add up to more than 10,000)
DEFAULT = {"mutation": 120, "program": 120, "plan": 80, "graph": 80, "path": 60}
# paths: 330 distinct cases exist (15 places x 11 kinds x inside a `use` or not)
SLOW = {"mutation": 4500, "program": 3000, "plan": 1500, "graph": 1500, "path": 300}
FUZZ_SLOW_CASES = sum(SLOW.values())
SCALES = [pytest.param(DEFAULT, id="default"),
          pytest.param(SLOW, id="slow", marks=pytest.mark.slow)]

MODELS = sorted((ROOT / "models").rglob("*.sched"))
SOURCES = sorted(EXAMPLES.glob("*.sched")) + MODELS


class Tally:
    """Cases run and the longest one, per test (printed at the end of the test)."""

    def __init__(self, name: str):
        self.name = name
        self.count = 0
        self.longest = (0.0, "")
        self.rss0 = peak_rss_bytes()

    def check(self, run, what: str = "") -> None:
        self.count += 1
        if run.seconds > self.longest[0]:
            self.longest = (run.seconds, " ".join(map(str, run.argv)))
        problems = run.problems(MAX_SECONDS)
        assert not problems, f"{problems}\n{run.describe(what)}"

    def finish(self, expected: int) -> None:
        grown = peak_rss_bytes() - self.rss0
        print(f"\nfuzz {self.name}: {self.count} cases, longest {self.longest[0]:.2f} s "
              f"({self.longest[1]}), peak RSS grew {grown / 2**20:.0f} MiB")
        assert grown < MAX_RSS_GROWTH
        assert self.count >= expected


def drive(make, n: int, name: str, *args) -> None:
    """Run the hypothesis test `make(n, name)` builds on `args`, then check its tally."""
    run, tally = make(n, name)
    run(*args)
    tally.finish(n)


def fuzz_settings(n: int):
    return settings(max_examples=n, derandomize=True, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck), print_blob=True)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A copy of examples/ and models/ (mutants sit beside the files they `use`)."""
    root = tmp_path_factory.mktemp("fuzz")
    shutil.copytree(EXAMPLES, root / "examples")
    shutil.copytree(ROOT / "models", root / "models")
    return root


# --------------------------------------------------------------------------- token mutation

def mutation_case(workdir: Path, tally: Tally, source: Path, seed: int, solve: bool) -> None:
    rel = source.relative_to(ROOT if source.is_relative_to(ROOT / "models") else EXAMPLES.parent)
    original = workdir / rel
    text = mutate(original.read_text(), random.Random(seed))
    mutant = original.with_name("mutant_" + original.name)
    mutant.write_text(text)
    try:
        if source in MODELS:  # a formulation: check and solve an example against it
            data = workdir / "examples" / ("chain.sched" if "checkmate" in source.name
                                           else "tiny_transformer.sched")
            argv = ["check", data, "--model", mutant, "--max-elements", MAX_ELEMENTS]
            solve_argv = ["solve", data, "--model", mutant, *SOLVE]
        else:
            argv = ["check", mutant, "--max-elements", MAX_ELEMENTS]
            solve_argv = ["solve", mutant, *SOLVE]
        run = run_cli(argv)
        tally.check(run, text)
        if solve and run.code == 0:
            tally.check(run_cli(solve_argv), text)
    finally:
        mutant.unlink(missing_ok=True)


def _mutation_test(n: int, name: str):
    tally = Tally(name)

    @fuzz_settings(n)
    @given(source=st.sampled_from(SOURCES), seed=st.integers(0, 2**32 - 1),
           solve=st.integers(0, 5).map(lambda k: k == 0))
    def run(workdir, source, seed, solve):
        mutation_case(workdir, tally, source, seed, solve)
    return run, tally


@pytest.mark.parametrize("scale", SCALES)
def test_fuzz_mutations(workdir, scale):
    drive(_mutation_test, scale["mutation"], "mutation", workdir)


# --------------------------------------------------------------------------- generated programs

def _program_test(n: int, name: str):
    tally = Tally(name)

    @fuzz_settings(n)
    @given(text=sched_program(), solve=st.booleans())
    def run(workdir, text, solve):
        path = workdir / "examples" / "generated.sched"
        path.write_text(text)
        first = run_cli(["check", path, "--max-elements", MAX_ELEMENTS, "--stats"])
        tally.check(first, text)
        if solve and first.code == 0 and "graph" in text:
            tally.check(run_cli(["solve", path, *SOLVE, "--json"]), text)
    return run, tally


@pytest.mark.parametrize("scale", SCALES)
def test_fuzz_programs(workdir, scale):
    drive(_program_test, scale["program"], "program", workdir)


# --------------------------------------------------------------------------- plan JSON

GRAPHS_FOR_PLANS = ["chain.sched", "tiny_transformer.sched", "transformer6_offload.sched"]


def _valid_plans(workdir) -> list:
    """Plans that replay (made by `schedlang plan`), to mutate."""
    plans = []
    for graph in GRAPHS_FOR_PLANS:
        out = workdir / f"{graph}.plan.json"
        run = run_cli(["plan", workdir / "examples" / graph, "--planner", "best", "--plan-out", out])
        assert run.code in (0, 3), run.describe()
        plans.append(json.loads(out.read_text()))
    return plans


def _plan_test(n: int, name: str):
    tally = Tally(name)

    @fuzz_settings(n)
    @given(doc=plan_json(), base=st.integers(0, len(GRAPHS_FOR_PLANS) - 1),
           mutated=st.integers(0, 2**32 - 1), graph=st.sampled_from(GRAPHS_FOR_PLANS),
           allocator=st.integers(0, 4).map(lambda k: k == 0))
    def run(workdir, plans, doc, base, mutated, graph, allocator):
        if mutated % 2:  # a replaying plan with a few changes
            doc = plans[base]
            for _ in range(1 + mutated % 3):
                doc = mutate_json(doc, random.Random(mutated))
                mutated //= 3
        path = workdir / "fuzz_plan.json"
        path.write_text(dump_json(doc))
        argv = ["simulate", path, "--graph", workdir / "examples" / graph, "--json"]
        tally.check(run_cli(argv + (["--allocator"] if allocator else [])), dump_json(doc)[:2000])
    return run, tally


@pytest.mark.parametrize("scale", SCALES)
def test_fuzz_plans(workdir, scale):
    drive(_plan_test, scale["plan"], "plan JSON", workdir, _valid_plans(workdir))


# --------------------------------------------------------------------------- graph JSON

def _graph_test(n: int, name: str):
    tally = Tally(name)

    @fuzz_settings(n)
    @given(doc=node_link_json(), budget=st.sampled_from([None, "90%", "1KiB", "0", "1e400"]),
           solve=st.integers(0, 3).map(lambda k: k == 0))
    def run(workdir, doc, budget, solve):
        src = workdir / "fuzz_graph.json"
        out = workdir / "fuzz_graph.sched"
        src.write_text(dump_json(doc))
        argv = ["import", src, "--format", "checkmate-nx", "-o", out]
        run_ = run_cli(argv + (["--budget", budget] if budget else []))
        tally.check(run_, dump_json(doc)[:2000])
        if run_.code == 0:
            tally.check(run_cli(["check", out, "--max-elements", MAX_ELEMENTS]), out.read_text())
            if solve:
                tally.check(run_cli(["solve", out, *SOLVE, "--budget", "90%"]), out.read_text())
                tally.check(run_cli(["plan", src, "--planner", "best", "--budget", "80%"]),
                            dump_json(doc)[:2000])
    return run, tally


@pytest.mark.parametrize("scale", SCALES)
def test_fuzz_graph_json(workdir, scale):
    drive(_graph_test, scale["graph"], "graph JSON", workdir)



# --------------------------------------------------------------------------- paths

#: every place the CLI takes a path: (argv with PATH where the path goes, the path's suffix);
#: the other paths are good ones (the chain example, a plan of it)
PATH_SLOTS = [
    (["check", "PATH"], ".sched"),
    (["solve", "PATH", *SOLVE], ".sched"),
    (["solve", "{chain}", "--model", "PATH", *SOLVE], ".sched"),
    (["solve", "{chain}", "--plan-out", "PATH", *SOLVE, "--json"], ".json"),
    (["plan", "PATH", "--planner", "best"], ".json"),
    (["plan", "{chain}", "--planner", "best", "--plan-out", "PATH"], ".json"),
    (["simulate", "PATH", "--graph", "{chain}"], ".json"),
    (["simulate", "{plan}", "--graph", "PATH", "--json"], ".sched"),
    (["import", "PATH", "--format", "checkmate-nx", "-o", "{out}"], ".json"),
    (["import", "{graph_json}", "--format", "checkmate-nx", "-o", "PATH"], ".sched"),
    (["sweep", "{chain}", "--budgets", "90%", "--out", "PATH", "--jobs", "1"], ".jsonl"),
    (["sweep", "{chain}", "--budgets", "90%", "--plot", "PATH", "--jobs", "1"], ".png"),
    (["sweep", "{chain}", "--budgets", "90%", "--compare", "PATH", "--jobs", "1"], ".sched"),
    (["run", "PATH:make", "--budget", "90%"], ".py"),
    (["trace", "PATH:make", "-o", "{out}"], ".py"),
]


def _path_test(n: int, name: str):
    tally = Tally(name)

    @fuzz_settings(n)
    @given(slot=st.integers(0, len(PATH_SLOTS) - 1), kind=st.sampled_from(PATH_KINDS),
           use=st.booleans())
    def run(workdir, plan, slot, kind, use):
        argv, suffix = PATH_SLOTS[slot]
        path = weird_path(workdir / "paths", kind, suffix)
        if use and suffix == ".sched" and kind != "nul":  # the path inside a `use`
            holder = workdir / "examples" / "uses_weird.sched"
            holder.write_text(f'use "{path}"\n')
            path = str(holder)
        good = {"chain": workdir / "examples" / "chain.sched", "plan": plan,
                "out": workdir / "paths_out.sched", "graph_json": workdir / "graph.json"}
        args = [path if a == "PATH" else a.replace("PATH", path) if "PATH" in a
                else a.format(**{k: str(v) for k, v in good.items()}) for a in argv]
        result = run_cli(args)
        tally.check(result, f"path kind {kind}")  # an exit code, located, no traceback
        if kind not in ("missing", "dot", "device") and not use:
            assert result.code != 0, result.describe(f"path kind {kind}")
        if "--json" in args:  # one JSON object, whatever happened
            json.loads(result.out)
    return run, tally


@pytest.mark.parametrize("scale", SCALES)
def test_fuzz_paths(workdir, scale):
    """Every path a user gives — too long, a folder, a FIFO, missing, under a file, empty, a
    NUL, a device — in every place the CLI takes one (and inside a `use`): an exit code and
    a located message, never a traceback or a hang (a FIFO is never opened)."""
    (workdir / "paths").mkdir(exist_ok=True)
    plan = workdir / "chain_plan.json"
    assert run_cli(["plan", workdir / "examples" / "chain.sched", "--planner", "best",
                    "--plan-out", plan]).code == 0
    (workdir / "graph.json").write_text(json.dumps(
        {"directed": True, "multigraph": False, "graph": {},
         "nodes": [{"id": 0, "name": "a", "cost_cpu": 1, "cost_ram": 8, "backward": False},
                   {"id": 1, "name": "b", "cost_cpu": 1, "cost_ram": 8, "backward": True}],
         "links": [{"source": 0, "target": 1}]}))
    drive(_path_test, scale["path"], "paths", workdir, plan)
