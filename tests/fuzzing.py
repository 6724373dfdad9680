"""Fuzzing helpers (issue 11): token-level mutation of `.sched` text, JSON mutation, and a
runner that drives the real CLI entry (`schedlang.cli.main`) in-process with its output
captured, and says what was wrong with a run.

A run is clean when it returns an exit code (never raises: a traceback is a bug), a non-zero
code comes with at least one located message on stderr (`path:line:col: error: ...`, or
`path: error: ...` for a whole file), and it stays within the time given. Memory is bounded by
the size guard: the fuzz tests run with a small `--max-elements`, and `peak_rss_growth` checks
the process did not grow past a bound while they ran.
"""
from __future__ import annotations

import contextlib
import io
import json
import random
import re
import resource
import time
from dataclasses import dataclass

# one token of .sched text: a string, a quantity/number, a name, a two-character operator, any
# other character; whitespace and comments are kept as separators
TOKEN = re.compile(r'"(?:[^"\\\n]|\\.)*"|\d+(?:\.\d+)?(?:[eE][-+]?\d+)?[A-Za-z/]*|'
                   r'[A-Za-z_][A-Za-z0-9_.]*|\.\.|->|\+=|<=|>=|==|!=|\S')

# replacement tokens: edges of numbers, keywords, punctuation
EDGE_TOKENS = [
    "0", "1", "-1", "0.0", "1e308", "1e-308", "9223372036854775807", "9223372036854775808",
    "18446744073709551616", "1e400", "inf", "nan", "-inf", "0B", "1B", "8EiB", "16384TiB",
    "1e30TiB", "0ms", "1e300s", "0.5", "2", "3", "100000", "1..0", "1..100000",
    '""', '"x y"', '"\\""', "set", "param", "var", "expr", "constraint", "minimize", "maximize",
    "sum", "max", "min", "any", "all", "in", "not", "where", "if", "then", "else", "and", "or",
    "implies", "iff", "binary", "integer", "continuous", "default", "use", "drop", "when",
    "graph", "node", "edge", "data", "layer", "option", "loss", "budget", "bandwidth", "backward",
    "forward", "fwd", "bwd", "phantom", "overhead", "needs", "pinned", "grad", "input", "output",
    "V", "E", "F", "B", "succ", "pred", "peak", "[", "]", "(", ")", "{", "}", ",", ":", "=",
    "==", "<=", ">=", "<", ">", "!=", "+", "-", "*", "/", "..", "->", "+=", "union", "inter",
    "diff", "for", "#", "\n", "lhs", "rhs", "decode", "model",
    # paths, for `use "..."`: too long, a folder, a device, nothing
    '"' + "x" * 300 + '"', '"' + "d/" * 40 + "x" * 260 + '.sched"', '"."', '"/"', '"/dev/null"',
    '"/proc/self/fd/0"', '"no/such/folder/m.sched"',
]

#: the kinds of path `weird_path` makes: what a user may give where a file is read or written
PATH_KINDS = ("long", "long_part", "folder", "fifo", "missing", "missing_parent", "file_parent",
              "empty", "nul", "device", "dot")


def weird_path(root, kind: str, suffix: str = ".sched") -> str:
    """A path of `kind` under `root` (made on disk as needed): a name too long (300
    characters; or one part of 300 inside a folder), a folder, a FIFO, nothing there, a
    missing parent, a file as parent, the empty name, a NUL character, a device, '.'."""
    import os
    from pathlib import Path

    root = Path(root)
    if kind == "long":
        return str(root / ("x" * 300 + suffix))
    if kind == "long_part":
        return str(root / "x" / ("y" * 300) / f"m{suffix}")
    if kind == "folder":
        (root / f"folder{suffix}").mkdir(exist_ok=True)
        return str(root / f"folder{suffix}")
    if kind == "fifo":
        fifo = root / f"fifo{suffix}"
        if not fifo.exists():
            os.mkfifo(fifo)
        return str(fifo)
    if kind == "missing":
        return str(root / f"missing{suffix}")
    if kind == "missing_parent":
        return str(root / "no" / "such" / f"folder{suffix}")
    if kind == "file_parent":
        (root / "a_file").write_text("x")
        return str(root / "a_file" / f"inside{suffix}")
    if kind == "empty":
        return ""
    if kind == "nul":
        return str(root / f"nul\0{suffix}")
    if kind == "device":
        return "/dev/null"
    if kind == "dot":
        return "."
    raise ValueError(kind)


def tokens(text: str) -> list[tuple[int, int]]:
    """The (start, end) spans of the tokens of `text` (comments skipped)."""
    spans = []
    for line_start, line in _lines(text):
        cut = _comment_start(line)
        for m in TOKEN.finditer(line[:cut]):
            spans.append((line_start + m.start(), line_start + m.end()))
    return spans


def _lines(text: str):
    start = 0
    for line in text.splitlines(keepends=True):
        yield start, line
        start += len(line)


def _comment_start(line: str) -> int:
    """Where a `#` comment starts in `line` (outside strings), else its length."""
    in_string = False
    escaped = False
    for i, ch in enumerate(line):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch == "#":
            return i
    return len(line)


def mutate(text: str, rng: random.Random, edits: int | None = None) -> str:
    """`text` with 1-3 token edits: delete, duplicate, swap with the next, replace by another
    token of the text or an edge token, or insert one."""
    edits = edits if edits is not None else rng.choice((1, 1, 1, 2, 3))
    for _ in range(edits):
        spans = tokens(text)
        if not spans:
            return text + rng.choice(EDGE_TOKENS)
        k = rng.randrange(len(spans))
        s, e = spans[k]
        tok = text[s:e]
        kind = rng.randrange(6)
        pool_tok = (rng.choice(EDGE_TOKENS) if rng.random() < 0.6
                    else text[slice(*spans[rng.randrange(len(spans))])])
        if kind == 0:  # delete
            text = text[:s] + text[e:]
        elif kind == 1:  # duplicate
            text = text[:e] + " " + tok + text[e:]
        elif kind == 2 and k + 1 < len(spans):  # swap with the next token
            s2, e2 = spans[k + 1]
            text = text[:s] + text[s2:e2] + text[e:s2] + tok + text[e2:]
        elif kind == 3:  # insert before
            text = text[:s] + pool_tok + " " + text[s:]
        elif kind == 4 and re.fullmatch(r"\d+(\.\d+)?([eE][-+]?\d+)?", tok):  # a number's edge
            text = text[:s] + rng.choice(["0", "1e308", "9223372036854775807", "1e400", "0.0",
                                          str(2 ** 63), str(2 ** 64 + 1), "1e-400"]) + text[e:]
        else:  # replace
            text = text[:s] + pool_tok + text[e:]
    return text


def mutate_json(value, rng: random.Random):
    """A copy of a JSON value with one random change somewhere inside it."""
    edges = [None, True, False, 0, -1, 1, 0.5, 1e308, float("inf"), float("nan"), 2 ** 63,
             -(2 ** 63), "", "x", "f1", "compute", "delete", [], {}, [1], {"op": "compute"}]

    def walk(v, depth):
        if isinstance(v, dict) and v and rng.random() < 0.8:
            key = rng.choice(list(v))
            out = dict(v)
            r = rng.random()
            if r < 0.15:
                del out[key]
            elif r < 0.25:
                out[rng.choice(["op", "node", "data", "layer", "fraction", "channel", "id",
                                "source", "target", "extra"])] = rng.choice(edges)
            else:
                out[key] = walk(v[key], depth + 1)
            return out
        if isinstance(v, list) and v and rng.random() < 0.8:
            out = list(v)
            k = rng.randrange(len(out))
            r = rng.random()
            if r < 0.15:
                del out[k]
            elif r < 0.3:
                out.insert(k, out[rng.randrange(len(out))])
            elif r < 0.4:
                j = rng.randrange(len(out))
                out[k], out[j] = out[j], out[k]
            else:
                out[k] = walk(out[k], depth + 1)
            return out
        return rng.choice(edges)

    return walk(value, 0)


def dump_json(value) -> str:
    """JSON text, non-finite numbers written as JSON's reader of Python takes them."""
    return json.dumps(value, allow_nan=True)


# --------------------------------------------------------------------------- running the CLI

LOCATED = re.compile(r"^\S[^\n]*?(:\d+:\d+)?: (error|note|warning): ", re.M)


@dataclass
class Run:
    argv: list
    code: int | None
    out: str
    err: str
    exc: BaseException | None
    seconds: float

    def problems(self, max_seconds: float) -> list[str]:
        """What was wrong with this run ([] when clean)."""
        found = []
        if self.exc is not None:
            found.append(f"raised {type(self.exc).__name__}: {self.exc}")
        elif self.code is None or not isinstance(self.code, int):
            found.append(f"returned {self.code!r}, not an exit code")
        elif self.code not in (0, 2, 3, 4, 5):
            found.append(f"exit code {self.code}")
        elif self.code == 2 and not LOCATED.search(self.err):
            found.append("exit 2 without a located error message")
        if "Traceback" in self.err or "Traceback" in self.out:
            found.append("a traceback was printed")
        if self.seconds > max_seconds:
            found.append(f"took {self.seconds:.2f} s (> {max_seconds} s)")
        return found

    def describe(self, extra: str = "") -> str:
        return (f"schedlang {' '.join(map(str, self.argv))}\n{extra}\nexit {self.code}, "
                f"{self.seconds:.2f} s\nstderr: {self.err[-1500:]}\nexception: {self.exc!r}")


def run_cli(argv: list) -> Run:
    """`schedlang.cli.main(argv)` in-process, its stdout/stderr captured, never raising.
    argparse's exits (usage errors) are read as their exit code."""
    import logging

    from schedlang.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    exc = None
    code = None
    t0 = time.perf_counter()
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main([str(a) for a in argv])
            except SystemExit as e:  # argparse
                code = e.code if isinstance(e.code, int) else 2
                if code == 2:
                    err.write("<argparse>: error: usage\n")
            except BaseException as e:  # noqa: BLE001 (what the fuzz tests look for)
                exc = e
    finally:
        logging.disable(logging.NOTSET)
    return Run(list(argv), code, out.getvalue(), err.getvalue(), exc, time.perf_counter() - t0)


def peak_rss_bytes() -> int:
    """The process's peak resident set size so far (Linux: ru_maxrss is in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
