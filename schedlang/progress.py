"""Progress of long work, on stderr: the one place every long step reports to.

    from schedlang import progress

    with progress.session("auto"):                    # a command, or one `fit` call
        with progress.phase("profiling", total=len(blocks)):
            for k, block in enumerate(blocks, 1):
                progress.step(k, block.name)          # "profiling 3/12 model.layers.2"
        progress.note("bisection", "12 MiB: no plan")  # one event, in a phase of its own

Work reports what it does (`phase`, `step`, `note`; a solver's incumbent and bound through
`solver_callback`) and never decides how it is shown. A `session` decides, by its mode:

* ``"live"``: one line on a terminal (rich), redrawn as the work moves and removed at the end;
* ``"lines"``: plain lines, one per change (at most one a second per phase: a phase not
  shown yet at once), for logs and pipes;
* ``"off"``: nothing on stderr;
* ``"auto"`` (the default): ``$SCHEDLANG_PROGRESS`` when set (one of the three), else live on
  a terminal and lines otherwise.

Nothing is shown before the session has run `delay` seconds (1 s: short commands stay
quiet), and while work runs without reporting, the current line is shown again every
`heartbeat` seconds (3 s) with its elapsed time, by a thread of the session, so a long profile
or solve never leaves stderr silent for longer. Whatever the mode, the same lines are INFO
records of the ``schedlang.progress`` logger (where logging shows them, ``"lines"`` leaves
stderr to logging rather than print them twice). Sessions nest: an inner one (a `fit` inside
`schedlang run`) reports into the outer one. The clock and the thread are parameters, so
tests drive a session with a fake clock (`Session.tick`).
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .language.errors import Loc, SchedError

if TYPE_CHECKING:  # annotations only: rich is imported when a live display starts
    from rich.live import Live

__all__ = ["session", "phase", "step", "note", "solver_callback", "MODES", "ENV", "Session"]

log = logging.getLogger("schedlang.progress")

MODES = ("auto", "live", "lines", "off")
#: the environment variable that chooses the mode of an ``"auto"`` session
ENV = "SCHEDLANG_PROGRESS"
#: seconds a session runs before it shows anything
DELAY = 1.0
#: longest silence, in seconds, while work runs
HEARTBEAT = 3.0
#: in ``"lines"`` mode, the least time between two lines of one phase (phase starts excepted)
INTERVAL = 1.0

_active: ContextVar[Session | None] = ContextVar("schedlang_progress", default=None)


@dataclass
class _Phase:
    name: str
    started: float
    total: int | None = None
    done: int | None = None
    detail: str = ""


class Session:
    """Where the reports of one command (or one `fit`) go; see the module docstring."""

    def __init__(self, mode: str = "auto", *, stream=None, clock=time.monotonic,
                 delay: float = DELAY, heartbeat: float = HEARTBEAT, interval: float = INTERVAL,
                 thread: bool = True, console=None):
        self.mode = resolve_mode(mode, stream if stream is not None else sys.stderr)
        self.stream = stream
        self.clock = clock
        self.delay, self.heartbeat, self.interval = delay, heartbeat, interval
        self.started = clock()
        self.phases: list[_Phase] = []
        self.lines: list[tuple[float, str]] = []  # (time, line) of each line given out
        self._last_line = -1.0e18  # when the last line was given out
        self._last_of: dict[str, float] = {}  # per phase, when its last line was given out
        self._pending = False  # a change not given out yet (throttled, or before `delay`)
        self._lock = threading.RLock()
        self._thread = thread
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._console = console
        self._live: Live | None = None

    # --- what work reports -----------------------------------------------------------------
    def begin(self, name: str, total: int | None = None, detail: str = "") -> None:
        with self._lock:
            # a counted phase reads 0/12 from its start
            self.phases.append(_Phase(name, self.clock(), total, 0 if total else None, detail))
            self._changed()

    def end(self, name: str) -> None:
        with self._lock:
            for k in range(len(self.phases) - 1, -1, -1):
                if self.phases[k].name == name:
                    del self.phases[k:]
                    break

    def update(self, done: int | None = None, detail: str = "", total: int | None = None) -> None:
        with self._lock:
            if not self.phases:
                return
            ph = self.phases[-1]
            if done is not None:
                ph.done = done
            if total is not None:
                ph.total = total
            ph.detail = detail
            self._changed()

    # --- what is shown ---------------------------------------------------------------------
    def line(self) -> str:
        """The current state: the innermost phase (with its enclosing ones), its count and
        detail, and the time since the outermost phase began."""
        with self._lock:
            if not self.phases:
                return ""
            now = self.clock()

            def count(p: _Phase) -> str:
                if p.done is None:
                    return ""
                return f" {p.done}/{p.total}" if p.total else f" {p.done}"
            names = " > ".join(p.name + count(p) for p in self.phases)
            ph = self.phases[-1]
            detail = f": {ph.detail}" if ph.detail else ""
            return f"{names}{detail} ({now - self.phases[0].started:.1f} s)"

    def tick(self) -> None:
        """Give out what is pending once the delay has passed, and the current line again
        after `heartbeat` seconds of silence (the session's thread calls this)."""
        with self._lock:
            now = self.clock()
            if not self.phases or now - self.started < self.delay:
                return
            due = now - self._last_of.get(self.phases[-1].name, -1.0e18) >= self.interval
            if (self._pending and due) or now - self._last_line >= self.heartbeat:
                self._emit(now)

    def _changed(self) -> None:
        now = self.clock()
        self._pending = True
        if now - self.started < self.delay:
            return
        # a phase not shown yet is shown at once; one shown less than `interval` ago (a
        # step, or the same phase begun again: each solve of a bisection) waits for the tick
        name = self.phases[-1].name
        if now - self._last_of.get(name, -1.0e18) >= self.interval:
            self._emit(now)

    def _emit(self, now: float) -> None:
        text = self.line()
        self._pending = False
        self._last_line = now
        self._last_of[self.phases[-1].name] = now
        self.lines.append((now - self.started, text))
        log.info("%s", text)
        if self.mode == "lines" and not _logging_shows():
            stream = self.stream if self.stream is not None else sys.stderr
            try:
                print(f"schedlang: {text}", file=stream, flush=True)
            except (OSError, ValueError):  # a closed or broken stderr: progress is not vital
                pass
        elif self.mode == "live":
            self._show_live()

    def _show_live(self) -> None:
        if self._live is None:
            from rich.console import Console
            from rich.live import Live

            console = self._console or Console(file=self.stream or sys.stderr)
            self._live = Live(_Renderable(self), console=console, refresh_per_second=4,
                              transient=True, redirect_stdout=False, redirect_stderr=True)
            self._live.start()

    # --- the session's lifetime ------------------------------------------------------------
    def __enter__(self) -> Session:
        self._token = _active.set(self)
        if self._thread:
            self._ticker = threading.Thread(target=self._run, name="schedlang-progress",
                                            daemon=True)
            self._ticker.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            try:
                self.tick()
            except Exception:  # progress must never break the work it reports on
                log.debug("progress tick failed", exc_info=True)
                return

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=2)
        with self._lock:
            if self._live is not None:
                self._live.stop()
                self._live = None
        _active.reset(self._token)


class _Renderable:
    """The live line, rendered from the session at each refresh (the elapsed time moves)."""

    def __init__(self, s: Session):
        self.s = s

    def __rich__(self):
        from rich.text import Text  # plain text: no markup, no highlighting

        return Text(self.s.line(), no_wrap=True, overflow="ellipsis")


def resolve_mode(mode: str, stream) -> str:
    """``"live"``, ``"lines"`` or ``"off"`` for a session asked for `mode` on `stream`."""
    if mode not in MODES:
        raise SchedError(f"progress must be one of {', '.join(MODES)} (or True/False), got "
                         f"{mode!r}", Loc("progress"))
    if mode != "auto":
        return mode
    env = os.environ.get(ENV, "").strip().lower()
    if env in ("live", "lines", "off"):
        return env
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError, OSError):
        tty = False
    return "live" if tty else "lines"


def _logging_shows() -> bool:
    """Whether logging prints this module's INFO records already (a handler configured)."""
    return log.isEnabledFor(logging.INFO) and log.hasHandlers()


def session(mode="auto", **kwargs):
    """A `Session` for `mode` (True: ``"auto"``, False: ``"off"``), or, inside one already,
    a context that reports into that one."""
    if mode is True:
        mode = "auto"
    elif mode is False or mode is None:
        mode = "off"
    if _active.get() is not None:
        return contextlib.nullcontext(_active.get())
    return Session(mode, **kwargs)


@contextlib.contextmanager
def phase(name: str, total: int | None = None):
    """A phase of work (``profiling``, ``solving``, ...) for as long as the block runs."""
    s = _active.get()
    if s is None:
        log.debug("%s", name)
        yield
        return
    s.begin(name, total)
    try:
        yield
    finally:
        s.end(name)


def step(done: int | None = None, detail: str = "", total: int | None = None) -> None:
    """The current phase reached step `done` (of its `total`), with `detail`."""
    s = _active.get()
    if s is not None:
        s.update(done, detail, total)


def note(name: str, detail: str) -> None:
    """One event (a bisection's answer, a probe step's measure): a phase of its own that
    ends at once, shown as any phase start is."""
    s = _active.get()
    if s is None:
        log.debug("%s: %s", name, detail)
        return
    with s._lock:
        s.begin(name, detail=detail)
        s.end(name)


def solver_callback(given=None):
    """The `progress` callable a backend calls with each `solvers.progress.Progress`:
    `given` when there is one, else one that reports into the active session (None when
    there is none). The session is taken now: the solver may call back from its own thread,
    which does not see this thread's active session."""
    s = _active.get()
    if given is not None or s is None:
        return given

    def report(p) -> None:
        s.update(None, p.line().removeprefix("solving").strip())
    return report


def reporting(name: str, own_phase_when_nested: bool = True):
    """A decorator: the function gets a keyword argument ``progress`` (default True:
    ``"auto"``; False: off; or a mode) and runs in a `session` of that mode, as phase `name`
    (from its first moment: work before the first inner phase is shown too). A long library
    call (`fit`, `prepare`) shows its progress as the CLI's commands do.
    `own_phase_when_nested` False: called inside a session already (`prepare` by `fit`), the
    function reports into that one's phases without a phase of its own."""
    import functools

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, progress=True, **kwargs):
            if not own_phase_when_nested and _active.get() is not None:
                return fn(*args, **kwargs)
            with session(progress), phase(name):
                return fn(*args, **kwargs)
        return wrapper
    return decorate


def counted(name: str, items):
    """`items`, each one a step of phase `name` (``for x in counted("training step", xs)``)."""
    items = list(items)
    with phase(name, len(items)):
        for k, item in enumerate(items, 1):
            step(k)
            yield item
