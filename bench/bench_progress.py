"""How soon and how often `fit` says what it is doing (issue 26: "silence for minutes").

Runs ``fit(model, inputs, budget, loss_fn=...)`` in a child process with plain progress lines
(``SCHEDLANG_PROGRESS=lines``), stamps each stderr line as it arrives, and prints the time of
the first line, the longest silence between two lines (and after the last one, until the
child ends), the lines per phase, and how the fit ended. Target: the first line within 2 s
of `fit` starting, no silence over 5 s.

    python bench/bench_progress.py                                  # the MoE example at 40%
    python bench/bench_progress.py --factory examples/mymodels.py:make_gpt --budget 60%
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import importlib.util, json, sys, time
path, name, budget = sys.argv[1], sys.argv[2], sys.argv[3]
spec = importlib.util.spec_from_file_location("factory_module", path)
module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)
model, inputs, loss_fn = getattr(module, name)()
import schedlang.pytorch as sp
print("START", flush=True, file=sys.stderr)
t0 = time.monotonic()
try:
    fm = sp.fit(model, inputs, budget=budget, loss_fn=loss_fn)
    outcome = str(fm.memory_report()).splitlines()[0]
except Exception as exc:
    outcome = f"{type(exc).__name__}: {str(exc)[:200]}"
print("END " + json.dumps({"seconds": time.monotonic() - t0, "outcome": outcome}),
      flush=True, file=sys.stderr)
"""


def measure(factory: str, budget: str, timeout: float) -> dict:
    path, _, name = factory.rpartition(":")
    env = dict(os.environ, SCHEDLANG_PROGRESS="lines")
    proc = subprocess.Popen([sys.executable, "-c", CHILD, path, name, budget], cwd=ROOT,
                            env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            text=True, bufsize=1)
    started = None
    stamps: list[tuple[float, str]] = []
    end = None
    deadline = time.monotonic() + timeout
    for line in proc.stderr:
        now = time.monotonic()
        if line.startswith("START"):
            started = now
        elif line.startswith("END "):
            end = (now, json.loads(line[4:]))
        elif started is not None and line.startswith("schedlang: "):
            stamps.append((now - started, line[len("schedlang: "):].strip()))
        if now > deadline:
            proc.kill()
            break
    proc.wait()
    if started is None:
        raise SystemExit("the child failed before fit started")
    finish = (end[0] - started) if end else time.monotonic() - started
    times = [t for t, _ in stamps]
    gaps = [b - a for a, b in zip([0.0, *times], [*times, finish])]
    worst = max(range(len(gaps)), key=gaps.__getitem__)
    before = stamps[worst - 1][1] if worst > 0 else "(fit started)"
    after = stamps[worst][1] if worst < len(stamps) else "(fit ended)"
    phases: dict[str, int] = {}
    for _, text in stamps:
        key = re.match(r"[a-z >]*", text).group(0).strip() or text
        phases[key] = phases.get(key, 0) + 1
    return {"factory": factory, "budget": budget, "first_line_s": times[0] if times else None,
            "longest_silence_s": max(gaps), "lines": len(stamps), "fit_s": finish,
            "phases": phases, "outcome": end[1]["outcome"] if end else "timed out",
            "longest_silence_between": [before, after]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--factory", default="examples/mymodels.py:make_moe")
    ap.add_argument("--budget", default="40%")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    r = measure(args.factory, args.budget, args.timeout)
    if args.json:
        print(json.dumps(r))
        return
    first, longest = r["first_line_s"], r["longest_silence_s"]
    print(f"fit {r['factory']} at {r['budget']}: {r['fit_s']:.1f} s, {r['lines']} lines; "
          f"{r['outcome']}")
    print(f"first line after {first:.2f} s (target <= 2 s: "
          f"{'met' if first is not None and first <= 2 else 'NOT met'})")
    print(f"longest silence {longest:.2f} s (target <= 5 s: "
          f"{'met' if longest <= 5 else 'NOT met'}), between")
    for text in r["longest_silence_between"]:
        print(f"    {text}")
    for phase, n in r["phases"].items():
        print(f"  {n:5d}  {phase}")


if __name__ == "__main__":
    main()
