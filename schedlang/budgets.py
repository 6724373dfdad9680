"""Memory budgets given by users: parsing, the percentage rule, and which budget wins.

A budget is given as

* bytes: an int (or a float with a whole value: ``1.5`` is an error that suggests ``"150%"``,
  never 1 B), e.g. ``3221225472``;
* a size: ``"14GiB"``, ``"900MiB"``, ``"1.5e9"`` (`schedlang.language.units.parse_size`);
* a percentage ``"P%"`` of a *reference*: for a graph, the peak of its no-recomputation plan
  (`schedlang.plans.planners.no_recompute.no_recompute_peak`); for `schedlang.pytorch.fit`, the predicted peak
  of plain execution of the whole training step.

**The rounding rule** (the one place it is applied: `percent_of`): P is read to 1/1000 of a
percent (rounded to the nearest 0.001), and the budget is the reference times P / 100,
rounded *up* to a whole byte: ``ceil(reference * round(1000 P) / 100000)``. Rounded up so
that ``100%`` is the reference exactly and a budget is never below the fraction asked for
(90% of vgg16_train is 14242598093 B). Every budget must be positive.

**Which budget wins** (`peak_budget`): a budget given on the command line or to the API
(``--budget``, ``load(budget=...)``) over the data's ``budget peak`` declaration, over the
one a plan file carries. Budgets declared in `.sched` files are parsed with the language
(`schedlang.graphs.graphdata.budget_value`).

Lists of budgets (``schedlang sweep --budgets``, `parse_list`): comma-separated items, each
a budget as above or a range ``LOW..HIGH/N`` of N budgets evenly spaced from LOW to HIGH,
both included; when both ends are percentages the percentages are spaced, each resolved by
the rule above, so ``P%`` in a sweep is the budget of ``solve --budget P%``.

Errors are `DataError`s located at `loc` (the flag, or ``budget`` for the API).
"""
from __future__ import annotations

import math
from collections.abc import Callable

from .language.errors import DataError, Loc
from .language.units import parse_size
from .plans.planners.no_recompute import no_recompute_peak

Reference = int | Callable[[], int] | None  # bytes, computed on demand, or none

PERCENT_STEPS = 1000  # a percentage is read to 1/PERCENT_STEPS of a percent
MAX_RANGE = 1000  # budgets in one range; more is a typo, not a sweep
LIST_LOC = Loc("--budgets")
NO_BUDGETS = "no budgets given; write e.g. 30%..100%/8 or 1GiB,2GiB,75%"


def percent_of(reference: int, pct: float) -> int:
    """`pct` percent of `reference` bytes, by the rounding rule of the module docstring."""
    steps = int(round(pct * PERCENT_STEPS))
    return -(-int(reference) * steps // (100 * PERCENT_STEPS))


def percent(text: str) -> float | None:
    """The number P of ``"P%"``; None when `text` is not written as a percentage."""
    if not text.endswith("%"):
        return None
    try:
        return float(text[:-1])
    except ValueError:
        return None


def _reference_bytes(reference: Reference, text: str, loc: Loc, reference_name: str) -> int:
    """The bytes the percentage `text` is a share of; DataError where there are none."""
    ref = reference() if callable(reference) else reference
    if ref is None:
        raise DataError(f"budget '{text}' is a percent of {reference_name}, and this "
                        "program has no graph data; give sizes (e.g. 14GiB)", loc)
    if ref <= 0:
        raise DataError(f"budget '{text}' is a percent of {reference_name}, which is "
                        f"{ref} B here (no compute nodes?); give sizes", loc)
    return ref


def parse(value, reference: Reference, loc: Loc = Loc("--budget"),
          reference_name: str = "the no-recomputation peak") -> int:
    """One budget in bytes (see the module docstring); `reference` (bytes, or a function
    computing them) resolves a percentage, and is needed only for one."""
    if isinstance(value, bool):
        raise DataError(f"budget {value!r} is not a size or a percentage", loc)
    if isinstance(value, (int, float)):
        if not value > 0:
            raise DataError(f"budget {value} must be positive", loc)
        if not math.isfinite(value):
            raise DataError(f"budget {value!r} is not a number of bytes", loc)
        if value != int(value):
            hint = (f"; for a share of {reference_name} write '{100 * value:g}%'"
                    if value < 10 else "")
            raise DataError(f"budget {value!r} is a number of bytes, and not a whole one"
                            f"{hint} (or a size: '{value:g}GiB')", loc)
        return int(value)
    text = str(value).strip()
    if text.endswith("%"):
        pct = percent(text)
        if pct is None or not math.isfinite(pct):
            raise DataError(f"'{text}' is not a percentage", loc)
        if pct <= 0:
            raise DataError(f"budget {text} must be positive", loc)
        return percent_of(_reference_bytes(reference, text, loc, reference_name), pct)
    try:
        nbytes = parse_size(text)
    except ValueError as exc:
        raise DataError(str(exc), loc) from None
    if nbytes <= 0:
        raise DataError(f"budget {text} must be positive", loc)
    return nbytes


def graph_reference(graph) -> Reference:
    """The reference of percentages on `graph`: its no-recomputation peak (None: no graph)."""
    if graph is None:
        return None

    def peak() -> int:
        return no_recompute_peak(graph) if graph.nodes or graph.layers else 0
    return peak


def for_graph(value, graph, loc: Loc = Loc("--budget")) -> int:
    """`parse` with percentages of `graph`'s no-recomputation peak."""
    return parse(value, graph_reference(graph), loc)


def peak_budget(given, graph=None, data_budgets: dict | None = None, plan=None,
                loc: Loc = Loc("--budget")) -> int | None:
    """The peak budget in force: `given` (parsed, percentages of `graph`), else the data's
    ``budget peak``, else the plan's; None when there is none."""
    if given is not None and given != "":
        return for_graph(given, graph, loc)
    if data_budgets and data_budgets.get("peak") is not None:
        return data_budgets["peak"]
    return getattr(plan, "budget_peak", None)


# ---------------------------------------------------------------------------- lists and ranges

def parse_list(spec, graph, loc: Loc = LIST_LOC) -> list[int]:
    """A list of budgets (see the module docstring) -> bytes, ascending, deduplicated.

    `spec` may also be a list of items (ints are bytes)."""
    if isinstance(spec, (list, tuple)):
        items = list(spec)
    else:
        text = str(spec).strip()
        if not text:
            raise DataError(NO_BUDGETS, loc)
        items = [part.strip() for part in text.split(",")]
    if not items:
        raise DataError(NO_BUDGETS, loc)
    ref = _cached(graph_reference(graph))
    out: set[int] = set()
    for item in items:
        if isinstance(item, (int, float)) and not isinstance(item, bool):
            out.add(parse(item, ref, loc))
            continue
        item = str(item).strip()
        if not item:
            raise DataError(f"empty item in the budget list '{spec}'; separate budgets by "
                            "single commas", loc)
        if ".." in item:
            out.update(_parse_range(item, ref, loc))
        else:
            out.add(parse(item, ref, loc))
    return sorted(out)


def _cached(reference: Reference) -> Reference:
    if not callable(reference):
        return reference
    memo: list[int] = []

    def value() -> int:
        if not memo:
            memo.append(reference())
        return memo[0]
    return value


def _parse_range(item: str, ref: Reference, loc: Loc) -> list[int]:
    parts = item.split("..")
    if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
        raise DataError(f"'{item}' is not a budget range; write LOW..HIGH/N, e.g. "
                        "30%..100%/8 or 1GiB..4GiB/4", loc)
    lo_text = parts[0].strip()
    hi_text, slash, n_text = parts[1].partition("/")
    hi_text = hi_text.strip()
    if not slash:
        raise DataError(f"the range '{item}' has no count; write {lo_text}..{hi_text}/N for "
                        "N evenly spaced budgets", loc)
    try:
        n = int(n_text.strip())
    except ValueError:
        raise DataError(f"the count '{n_text.strip()}' of the range '{item}' is not a whole "
                        "number", loc) from None
    lo = parse(lo_text, ref, loc)
    hi = parse(hi_text, ref, loc)
    if lo > hi:
        raise DataError(f"the range '{item}' goes down ({lo_text} is more than {hi_text}); "
                        "write LOW..HIGH/N", loc)
    if n < 1 or (n == 1 and lo != hi):
        raise DataError(f"the range '{item}' needs a count of at least 2 (its two ends), "
                        f"got {n}", loc)
    if n > MAX_RANGE:
        raise DataError(f"the range '{item}' asks for {n} budgets; at most {MAX_RANGE}", loc)
    if n == 1:
        return [lo]
    p_lo, p_hi = percent(lo_text), percent(hi_text)
    if p_lo is not None and p_hi is not None:
        reference = _reference_bytes(ref, lo_text, loc, "the no-recomputation peak")
        return [percent_of(reference, p_lo + (p_hi - p_lo) * k / (n - 1)) for k in range(n)]
    return [int(round(lo + (hi - lo) * k / (n - 1))) for k in range(n)]
