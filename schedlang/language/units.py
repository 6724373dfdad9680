"""Units of sizes (bytes) and times (seconds), and parsing of user-given quantities."""
from __future__ import annotations

import math
import re
from fractions import Fraction

SIZE_UNITS = {
    "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
}
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
UNITS = {**SIZE_UNITS, **TIME_UNITS}


def dimension(unit: str) -> str:
    """'size', 'time' or '' (a plain number)."""
    if unit in SIZE_UNITS:
        return "size"
    if unit in TIME_UNITS:
        return "time"
    return ""


def scale(value: float, unit: str) -> float:
    """The value in base units (bytes or seconds)."""
    return value * UNITS.get(unit, 1)


_QUANTITY = re.compile(r"^\s*(\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)\s*([A-Za-z]*)\s*$")


#: the largest size schedlang takes (bytes): what an int64 holds, 8 EiB
MAX_BYTES = 2**63 - 1


def exact_bytes(number: str, unit: str = "") -> int:
    """The whole bytes of `number` (decimal text, e.g. '9007199254740993' or '1.5') times
    `unit`, computed exactly (no float rounding: sizes near 2**63 stay exact), rounded to the
    nearest byte. Raises ValueError for a size over `MAX_BYTES`."""
    scale_ = SIZE_UNITS.get(unit, 1)
    approx = float(number) * scale_  # cheap first: never build 10**400 exactly
    if not math.isfinite(approx) or approx > 2.0 * MAX_BYTES:
        raise ValueError(f"'{number}{unit}' is too large: sizes are at most {MAX_BYTES:,} bytes "
                         "(2^63 - 1, 8 EiB)")
    nbytes = round(Fraction(number) * scale_)
    if nbytes > MAX_BYTES:
        raise ValueError(f"'{number}{unit}' is too large: sizes are at most {MAX_BYTES:,} bytes "
                         "(2^63 - 1, 8 EiB)")
    return nbytes


def float_at_least(nbytes: int) -> float:
    """The least float >= the integer `nbytes`: how a size enters a model (float(n) rounds to
    the nearest float, below n for some n over 2^53, and a model would then count less
    memory than a plan uses)."""
    f = float(nbytes)
    return math.nextafter(f, math.inf) if f < nbytes else f


def float_at_most(nbytes: int) -> float:
    """The greatest float <= the integer `nbytes` (so that a budget is never rounded up)."""
    f = float(nbytes)
    return math.nextafter(f, -math.inf) if f > nbytes else f


#: a budget enters a model exact to the byte below 2^BUDGET_EXACT_BITS bytes (8 GiB), and
#: rounded down to a multiple of 2^(bits - BUDGET_EXACT_BITS) above: a relative resolution of
#: 2^-33 to 2^-32, which HiGHS resolves (measured on the chain of tests/graphs/test_edges.py scaled by
#: 2^10 to 2^14: a budget a few bytes under a plan's peak, with a margin of 2^-36 of it or
#: less, made it declare the whole model infeasible; 2^-33 is 8 times that margin)
BUDGET_EXACT_BITS = 33


def budget_value(nbytes: int) -> float:
    """How a budget of `nbytes` enters a model (`budget.peak`, `budget.save`, `budget.host`):
    exact to the byte up to 8 GiB, rounded down to the solvers' resolution above
    (`BUDGET_EXACT_BITS`), as the greatest float not above it. Never above the budget: the
    simulator then checks each plan against the exact budget (`Problem.solve`)."""
    n = int(nbytes)
    if n > 0:
        step = 1 << max(0, n.bit_length() - BUDGET_EXACT_BITS)
        n -= n % step
    return float_at_most(n)


def parse_size(text: str) -> int:
    """'14GiB', '1.5e9', '3221225472B' -> bytes. Raises ValueError with a readable reason."""
    m = _QUANTITY.match(text)
    if not m:
        raise ValueError(f"'{text}' is not a size (expected e.g. 14GiB, 900MiB, 1e9)")
    number, unit = m.groups()
    if unit and unit not in SIZE_UNITS:
        kind = "a time" if unit in TIME_UNITS else "an unknown unit"
        raise ValueError(f"'{text}' is not a size: '{unit}' is {kind}; "
                         f"use one of {', '.join(SIZE_UNITS)}")
    return exact_bytes(number, unit)


def parse_rate(value) -> float:
    """A transfer rate in bytes per second: a number, or text such as '16GB/s', '12GiB/s',
    'inf' or '0'. Raises ValueError with a readable reason."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        rate = float(value)
    else:
        text = str(value).strip()
        unit = next((u for u in sorted(SIZE_UNITS, key=len, reverse=True) if text.endswith(u + "/s")), None)
        try:
            rate = float("inf") if text == "inf" else (
                float(text[: -len(unit) - 2]) * SIZE_UNITS[unit] if unit else float(text))
        except ValueError:
            raise ValueError(f"'{value}' is not a rate (expected bytes per second, e.g. 16GB/s, "
                             "12GiB/s, inf or a number)") from None
    if not rate >= 0:
        raise ValueError(f"'{value}' must be a non-negative rate")
    return rate


def format_size(nbytes: float) -> str:
    for unit in ("GiB", "MiB", "KiB"):
        if abs(nbytes) >= SIZE_UNITS[unit]:
            return f"{nbytes / SIZE_UNITS[unit]:.2f} {unit}"
    return f"{nbytes:.0f} B"
