"""Every figure schedlang draws, with matplotlib on an Agg canvas (no pyplot, no global
backend switch): a sweep's memory/time curves (`plot_sweep`, `sweep_figure`), and the pieces
other figures share (`figure`, `size_unit`, `check_plot_target`; `pytorch/timeline.py`
draws a step's per-op memory with them). matplotlib is optional: it is imported where a
figure is made, and its absence is a located error."""
from __future__ import annotations

from .language.errors import DataError, Loc, SchedError
from .language.files import atomic_open
from .language.paths import writable_file
from .solve.solution import Status
from .sweep import SweepPoint


def size_unit(values) -> tuple[str, int]:
    top = max(values, default=0)
    return ("GiB", 2**30) if top >= 2**30 else ("MiB", 2**20) if top >= 2**20 else ("KiB", 2**10)



def _pct(p: float | None) -> str:
    return "-" if p is None else f"{p:.4g}%"



def plot_sweep(points, out, title: str = "", ref_peak: int | None = None,
               loc: Loc = Loc("--plot")) -> None:
    """Write the memory/time Pareto curve of a sweep to `out` (PNG, matplotlib's Agg backend).

    `points` is one sweep (a list of `SweepPoint`) or several, as {label: points} (one curve
    each, e.g. recompute only / offload only / both). x: simulated peak memory of each solved
    point; y: time overhead in percent; each point is labelled with its budget(s); budgets
    without a solution are marked on the x axis at their budget. Raises `SchedError` (exit 2)
    when matplotlib is missing or `out` cannot be written.
    """
    fig = sweep_figure(points, title, ref_peak, loc)

    try:
        with atomic_open(out, "wb") as f:
            fig.savefig(f, format="png")
    except DataError as exc:
        raise DataError(exc.message.replace("cannot write ", "cannot write the plot to ", 1), loc) from None



def sweep_figure(points, title: str = "", ref_peak: int | None = None,
                 loc: Loc = Loc("--plot")):
    """The matplotlib `Figure` `plot_sweep` writes (see there)."""
    curves = points if isinstance(points, dict) else {"": points}
    fig = figure(loc)
    every = [p for pts in curves.values() for p in pts]
    unit, scale = size_unit([p.simulated_peak for p in every if p.solved and p.simulated_peak is not None]
                             + [p.budget_bytes for p in every] + ([ref_peak] if ref_peak else []))
    ax = fig.subplots()
    colors = ["tab:blue", "tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive"]
    ys_all: list[float] = []
    for n, (label, pts) in enumerate(curves.items()):
        ys_all += _plot_curve(ax, pts, label, colors[n % len(colors)], unit, scale,
                              annotate=len(curves) == 1)
    if ref_peak:
        ax.axvline(ref_peak / scale, color="gray", linestyle="--", linewidth=1,
                   label=f"no recomputation ({ref_peak / scale:.3g} {unit})")
    ax.set_xlabel(f"peak memory ({unit})")
    ax.set_ylabel("time overhead vs no recomputation (%)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    if ys_all and min(ys_all) >= 0:
        ax.set_ylim(bottom=min(-0.05 * max(max(ys_all), 1.0), 0))
    elif not ys_all:  # nothing solved: an axis of overheads, not one around 0 +- 0.04%
        ax.set_ylim(0, 100)
        ax.text(0.5, 0.5, "no budget was solved", transform=ax.transAxes, ha="center",
                va="center", fontsize=12, color="tab:red")
    fig.tight_layout()
    return fig



def _plot_curve(ax, points: list[SweepPoint], label: str, color: str, unit: str, scale: int,
                annotate: bool) -> list[float]:
    """One sweep's solved points as a line, its unsolved budgets on the x axis; the y values."""
    solved = [p for p in points
              if p.solved and p.simulated_peak is not None and p.overhead is not None]
    unsolved = [p for p in points if not p.solved]
    # several budgets may give the same plan: one marker, the budgets in one label
    groups: dict[tuple, list[SweepPoint]] = {}
    for p in solved:
        assert p.overhead is not None  # (kept above)
        groups.setdefault((p.simulated_peak, round(100.0 * p.overhead, 9)), []).append(p)
    keys = sorted(groups)
    xs = [k[0] / scale for k in keys]
    ys = [k[1] for k in keys]
    prefix = f"{label}: " if label else ""
    if keys:
        ax.plot(xs, ys, "-o", color=color, zorder=3,
                label=prefix + "solved: simulated peak vs time overhead")
        for x, y, key in zip(xs, ys, keys):
            if not annotate:
                continue
            names = ", ".join(_pct(p.budget_percent) if p.budget_percent is not None
                              else f"{p.budget_bytes / scale:.3g} {unit}" for p in groups[key])
            feasible = any(p.status is Status.FEASIBLE for p in groups[key])
            ax.annotate(names + (" (gap)" if feasible else ""), (x, y),
                        textcoords="offset points", xytext=(6, 6), fontsize=8)
    if unsolved:
        import matplotlib.transforms as mtransforms

        trans = mtransforms.blended_transform_factory(ax.transData, ax.transAxes)
        for status, marker, mark_color in ((Status.INFEASIBLE, "x", "tab:red"),
                                           (Status.UNBOUNDED, "x", "tab:red"),
                                           (Status.NO_SOLUTION, "s", "tab:orange"),
                                           (Status.ERROR, "D", "tab:gray")):
            group = [p for p in unsolved if p.status is status]
            if not group:
                continue
            ax.plot([p.budget_bytes / scale for p in group], [0.0] * len(group), marker,
                    color=mark_color if annotate else color, markersize=9, mew=2, transform=trans,
                    clip_on=False, zorder=4, label=f"{prefix}{status.value} budget")
            for p in group:
                if annotate:
                    ax.annotate(_pct(p.budget_percent) if p.budget_percent is not None else
                                f"{p.budget_bytes / scale:.3g} {unit}", (p.budget_bytes / scale, 0.0),
                                xycoords=trans, textcoords="offset points", xytext=(0, 9),
                                ha="center", fontsize=8, color=mark_color)
    return ys



def figure(loc: Loc = Loc("--plot")):
    """A matplotlib `Figure` on an Agg canvas (no pyplot, no global backend switch), or a
    `SchedError` that says how to install matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise SchedError("plotting needs matplotlib, which is not installed: pip install "
                         "matplotlib (or pip install 'schedlang[plot]')", loc) from None
    fig = Figure(figsize=(8, 5), dpi=120)
    FigureCanvasAgg(fig)
    return fig



def check_plot_target(out, loc: Loc = Loc("--plot")) -> None:
    """Fail early (before a long sweep) when matplotlib is missing or `out` cannot be
    written (`schedlang.language.paths.writable_file`)."""
    figure(loc)
    writable_file(out, loc, "plot")
