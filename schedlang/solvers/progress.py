"""Progress of a running solve: incumbent, bound, gap, elapsed, fed by solver callbacks.

A backend that can hear from its solver while it runs (today: HiGHS through the Pyomo
backend's `stdform_highs` driver, by its MIP callback) calls ``run.progress(Progress(...))``
now and then; `LiveLine` shows the latest one as one line on stderr (rich), once the solve
has run `delay` seconds, and removes it when the solve ends. `schedlang solve` uses it when
stderr is a terminal, unless ``--quiet`` or ``--verbose`` (the solver's own log) is given;
stdout (``--json``) is not touched.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Progress:
    incumbent: float | None  # the best objective found so far (None: none yet)
    bound: float | None  # the best proven bound
    gap: float | None  # relative gap between them, as the solver computes it
    elapsed: float  # seconds since the solve started
    nodes: int | None = None  # branch-and-bound nodes explored

    def line(self) -> str:
        def num(v):
            return "-" if v is None or not math.isfinite(v) else f"{v:.6g}"
        gap = "-" if self.gap is None or not math.isfinite(self.gap) else f"{100 * self.gap:.3g}%"
        nodes = f"  nodes {self.nodes}" if self.nodes is not None else ""
        return (f"solving   incumbent {num(self.incumbent)}  bound {num(self.bound)}  "
                f"gap {gap}{nodes}  {self.elapsed:.1f} s")


class LiveLine:
    """A context manager: a callable taking `Progress` that keeps one live line on stderr,
    shown after `delay` seconds and at most `rate` times a second, removed on exit."""

    def __init__(self, delay: float = 2.0, rate: float = 4.0, console=None):
        self.delay = delay
        self.interval = 1.0 / rate
        self.console = console
        self._live = None
        self._last = 0.0

    def __enter__(self) -> "LiveLine":
        return self

    def __call__(self, p: Progress) -> None:
        if p.elapsed < self.delay:
            return
        now = time.monotonic()
        if self._live is not None and now - self._last < self.interval:
            return
        self._last = now
        from rich.text import Text  # plain text: no markup, no highlighting

        if self._live is None:
            from rich.console import Console
            from rich.live import Live

            console = self.console or Console(stderr=True)
            self._live = Live(Text(p.line()), console=console, auto_refresh=False,
                              transient=True)
            self._live.start()
        self._live.update(Text(p.line()), refresh=True)

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
