"""Progress on stderr for long work (`schedlang.progress`, issue 26): nothing for a short
run, then the current phase at once, a line at least every few seconds while work runs
without reporting, at most one a second per phase; plain lines off a terminal, a live line on
one, nothing with --quiet / progress=False; the same lines on the INFO log. Driven by a fake
clock (`Session.tick` stands in for the session's thread), never by wall time."""
from __future__ import annotations

import io
import logging

import pytest

from schedlang import progress


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _session(mode="lines", **kw):
    clock = Clock()
    out = io.StringIO()
    s = progress.Session(mode, stream=out, clock=clock, thread=False, **kw)
    return s, clock, out


def _run(s, clock, seconds, report=None, every=0.25):
    """Advance the fake clock by `every` for `seconds`, ticking as the session's thread
    does, calling report(k) at each step when given."""
    for k in range(round(seconds / every)):
        clock.now += every
        if report is not None:
            report(k)
        s.tick()


def test_nothing_before_the_delay_then_the_phase_at_once_and_a_heartbeat():
    s, clock, out = _session()
    with s:
        with progress.phase("profiling", total=12):
            progress.step(1, "blocks.0")
            _run(s, clock, 0.75)
            assert s.lines == []  # a short run says nothing
            _run(s, clock, 0.5)
            assert len(s.lines) == 1 and s.lines[0][0] <= 2.0  # within 2 s of the start
            assert s.lines[0][1].startswith("profiling 1/12: blocks.0")
            _run(s, clock, 60)  # a minute without any report: the heartbeat
    times = [t for t, _ in s.lines]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert max(gaps) <= 5.0 and len(times) >= 60 / 5
    assert out.getvalue().splitlines()[0] == f"schedlang: {s.lines[0][1]}"
    assert float(s.lines[-1][1].rsplit("(", 1)[1].split()[0]) > 58  # the elapsed time moves


def test_every_phase_start_is_shown_and_steps_at_most_once_a_second():
    s, clock, _ = _session(delay=0.0)
    with s:
        with progress.phase("generating options", total=100):
            _run(s, clock, 10, report=lambda k: progress.step(k + 1, f"layer {k}"), every=0.1)
        for name in ("planning", "bisection", "probe step"):
            with progress.phase(name):
                clock.now += 0.01
    by_phase: dict[str, list[float]] = {}
    for t, line in s.lines:
        by_phase.setdefault(line.split(" ")[0], []).append(t)
    steps = by_phase["generating"]
    assert 9 <= len(steps) <= 12  # 100 steps in 10 s: about one line a second
    assert all(b - a >= 0.99 for a, b in zip(steps, steps[1:]))
    assert {"planning", "bisection", "probe"} <= set(by_phase)  # each start, however short


def test_nested_phases_and_notes_read_as_one_line():
    s, clock, _ = _session(delay=0.0)
    with s, progress.phase("fit"), progress.phase("planning"):
        progress.step(None, "budget 12 MiB")
        clock.now += 2
        with progress.phase("solving"):
            progress.step(None, "incumbent 1.5  bound 1.2")
        progress.note("bisection", "9 MiB: no plan")
    lines = [line for _, line in s.lines]
    assert "fit > planning > solving" in lines[-2] or "fit > planning > solving" in lines[-3]
    assert any(line.startswith("fit > planning > bisection: 9 MiB: no plan") for line in lines)


def test_off_prints_nothing_and_the_log_says_the_same(caplog):
    s, clock, out = _session("off", delay=0.0)
    with caplog.at_level(logging.INFO, logger="schedlang.progress"), s:
        with progress.phase("profiling", total=2):
            progress.step(1, "blocks.0")
            _run(s, clock, 4)
    assert out.getvalue() == ""
    assert [r.getMessage() for r in caplog.records] == [line for _, line in s.lines]
    assert "profiling 1/2: blocks.0" in caplog.text


def test_lines_leave_stderr_to_logging_when_logging_shows_them(caplog):
    s, clock, out = _session(delay=0.0)
    with caplog.at_level(logging.INFO, logger="schedlang.progress"), s:
        with progress.phase("profiling"):
            _run(s, clock, 1)
    assert out.getvalue() == "" and "profiling" in caplog.text  # printed once, by logging


def test_a_live_line_on_a_terminal_is_removed_at_the_end():
    from rich.console import Console

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    clock = Clock()
    s = progress.Session("live", stream=out, clock=clock, thread=False, console=console,
                         delay=0.0)
    with s, progress.phase("solving"):
        progress.step(None, "incumbent 50  bound 48  gap 4%")
        s._live.refresh()
    assert "solving: incumbent 50" in out.getvalue()
    assert s._live is None


def test_the_mode_follows_the_environment_and_the_terminal(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.delenv(progress.ENV, raising=False)
    assert progress.resolve_mode("auto", Tty()) == "live"
    assert progress.resolve_mode("auto", io.StringIO()) == "lines"
    monkeypatch.setenv(progress.ENV, "off")
    assert progress.resolve_mode("auto", Tty()) == "off"
    assert progress.resolve_mode("lines", Tty()) == "lines"
    with pytest.raises(Exception, match="progress must be one of"):
        progress.resolve_mode("loud", Tty())


def test_an_inner_session_reports_into_the_outer_one():
    s, clock, _ = _session(delay=0.0)
    with s, progress.phase("run"):
        with progress.session(True) as inner, progress.phase("fit"):
            assert inner is s
            progress.step(None, "profiling")
    assert any(line.startswith("run > fit") for _, line in s.lines)


def test_cli_quiet_turns_progress_off():
    import argparse

    from schedlang.cli.main import _progress_mode

    def mode(**flags):
        return _progress_mode(argparse.Namespace(**{"command": "solve", **flags}))

    assert mode() == "auto" and mode(quiet=True) == "off" and mode(verbose=True) == "off"
    assert _progress_mode(argparse.Namespace(command="sweep")) == "off"  # its own lines


def _small_moe():
    """The top-k MoE example (examples/mymodels.py), small; one intra-op thread."""
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    import importlib.util

    from .paths import EXAMPLES

    spec = importlib.util.spec_from_file_location("mymodels", EXAMPLES / "mymodels.py")
    mymodels = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mymodels)
    return mymodels.make_moe(batch=8, context=32, dim=32, layers=2)


def _every_report_due(mode: str, out) -> progress.Session:
    """A session whose clock moves 1 s per reading: every report is due, so the lines count
    reports."""
    ticks = iter(range(10**6))
    return progress.Session(mode, stream=out, clock=lambda: float(next(ticks)), thread=False)


@pytest.mark.parametrize("mode", ["lines", "off"])
def test_fit_on_the_moe_example_reports_every_phase(mode, monkeypatch):
    """fit on the top-k MoE example (a small one) reports its first phase at once and each
    profiled layer, the solve and the probe step; progress=False shows nothing."""
    model, inputs, loss_fn = _small_moe()
    out = io.StringIO()
    s = _every_report_due(mode, out)
    from schedlang.pytorch import fit

    with s:
        fm = fit(model, inputs, "80%", loss_fn=loss_fn, frontend="blocks", probe=True)
    phases = [line.split(" (")[0] for _, line in s.lines]
    assert phases[0] == "fit"  # from the first moment of the call
    blocks = [b.name for b in fm._prep.partitioned.found.blocks]
    profiled = [p for p in phases if p.startswith("fit > profiling ")
                and not p.startswith("fit > profiling 0/")]  # the phase's start: 0/2
    assert len(profiled) == len(blocks) == 2  # one report per block profiled
    assert any(p.startswith("fit > finding blocks") for p in phases)
    if not fm.plain:
        assert any(p.startswith("fit > planning > solving") for p in phases)
        assert any(p.startswith("fit > probe step") for p in phases)
    assert (out.getvalue() == "") == (mode == "off")


def test_prepare_reports_into_the_session_it_runs_in_and_takes_progress_false(capsys):
    """`prepare` (the profile a user makes once and hands to several `fit` calls) takes
    ``progress`` as `fit` does (it passed it to the hook front end's tracer: a TypeError from
    deep inside); inside a session (`fit`'s, a caller's phase) it reports its phases there,
    without a level of its own, so `fit`'s lines read as before."""
    model, inputs, loss_fn = _small_moe()
    from schedlang.pytorch.fit import prepare

    s = _every_report_due("lines", io.StringIO())
    with s, progress.phase("mine"):
        prep = prepare(model, inputs, loss_fn=loss_fn, frontend="blocks")
    phases = [line.split(" (")[0] for _, line in s.lines]
    assert any(p.startswith("mine > profiling ") for p in phases), phases
    assert not any(p.startswith("mine > prepare") for p in phases), phases
    capsys.readouterr()
    quiet = prepare(model, inputs, loss_fn=loss_fn, frontend="blocks", progress=False)
    assert capsys.readouterr().err == ""
    assert [b.name for b in quiet.partitioned.found.blocks] == \
        [b.name for b in prep.partitioned.found.blocks]
