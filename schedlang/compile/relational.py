"""Vectorized index machinery: element codes, sets as code tables, joins, linear columns.

Index generation is relational: a domain `[t in V, (u, v) in E where v <= t]` is a table with
one column per bound name, grown binding by binding with sort-based joins (numpy), never by
filtering a dense product that could have been avoided. Expressions evaluate to whole columns
over a table: constants (`Const`), elements (`Elem`) or linear forms (`Lin`, sparse triplets).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

INVALID = -1  # the code of "no element" (next(last), an out-of-range t+1, ...)


class Universe:
    """Every element (node names, literal strings, integers) has one int64 code.

    Codes are given in order of registration; graph nodes are registered first, in
    topological order, so comparing codes compares positions in the graph's order.
    Integers compare by value.
    """

    def __init__(self) -> None:
        self.codes: dict[object, int] = {}
        self.values: list = []
        self._numeric: list[float] = []

    def code(self, value) -> int:
        key = _key(value)
        c = self.codes.get(key)
        if c is None:
            c = len(self.values)
            self.codes[key] = c
            self.values.append(key)
            self._numeric.append(float(key) if isinstance(key, int) else np.nan)
        return c

    def codes_of(self, values) -> np.ndarray:
        return np.fromiter((self.code(v) for v in values), dtype=np.int64, count=len(values))

    def numeric(self) -> np.ndarray:
        return np.asarray(self._numeric, dtype=np.float64)

    def value(self, code: int):
        return self.values[code] if code >= 0 else None

    def __len__(self) -> int:
        return len(self.values)


def _key(value):
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    return value


@dataclass
class SetVal:
    """A set: rows of element codes (n x arity), in order. Arity 1 sets are ordered sets."""

    cols: np.ndarray  # (n, arity) int64
    name: str = ""
    _pos: np.ndarray | None = field(default=None, repr=False)

    @property
    def arity(self) -> int:
        return self.cols.shape[1]

    def __len__(self) -> int:
        return self.cols.shape[0]

    def positions(self, universe_size: int) -> np.ndarray:
        """code -> position in this (1-D) set, -1 when absent."""
        if self._pos is None or len(self._pos) < universe_size:
            pos = np.full(max(universe_size, 1), -1, dtype=np.int64)
            pos[self.cols[:, 0]] = np.arange(len(self), dtype=np.int64)
            self._pos = pos
        return self._pos


def unique_rows(cols: np.ndarray) -> np.ndarray:
    """Rows without duplicates, first occurrence order kept."""
    if len(cols) == 0:
        return cols
    _, first = np.unique(cols, axis=0, return_index=True)
    return cols[np.sort(first)]


# ------------------------------------------------------------------------ key encoding
def encode(cols: list[np.ndarray], base: int) -> np.ndarray:
    """Several code columns -> one int64 key per row (INVALID anywhere -> INVALID)."""
    if not cols:
        return np.zeros(0 if cols == [] else len(cols[0]), dtype=np.int64)
    base = max(base, 2)
    if base ** len(cols) >= 2**62:
        raise OverflowError("too many index positions to encode")
    key = np.zeros(len(cols[0]), dtype=np.int64)
    bad = np.zeros(len(cols[0]), dtype=bool)
    for c in cols:
        key = key * base + c
        bad |= c < 0
    key[bad] = INVALID
    return key


class KeyIndex:
    """Lookup of key tuples (rows of codes) -> row number, vectorized."""

    def __init__(self, cols: np.ndarray, base: int):
        self.base = base
        self.arity = cols.shape[1]
        self.n = cols.shape[0]
        keys = encode([cols[:, j] for j in range(self.arity)], base) if self.arity else np.zeros(self.n, np.int64)
        self.order = np.argsort(keys, kind="stable")
        self.sorted = keys[self.order]

    def lookup(self, query: list[np.ndarray], m: int | None = None) -> np.ndarray:
        """Row number of each query tuple, -1 when absent (first match on duplicates)."""
        if self.arity == 0:
            return np.zeros(m if m is not None else 1, dtype=np.int64) if self.n else np.full(m or 1, -1)
        q = encode(query, self.base)
        pos = np.searchsorted(self.sorted, q)
        pos_c = np.minimum(pos, max(self.n - 1, 0))
        hit = (pos < self.n) & (q >= 0)
        if self.n:
            hit &= self.sorted[pos_c] == q
        out = np.full(len(q), -1, dtype=np.int64)
        out[hit] = self.order[pos_c[hit]]
        return out

    def join_size(self, query: list[np.ndarray]) -> int:
        """How many pairs `join(query)` makes, without making them."""
        q = encode(query, self.base)
        lo = np.searchsorted(self.sorted, q, side="left")
        hi = np.searchsorted(self.sorted, q, side="right")
        return int(np.where(q >= 0, hi - lo, 0).sum())

    def join(self, query: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """All (query row, table row) pairs with equal keys, in query order."""
        q = encode(query, self.base)
        lo = np.searchsorted(self.sorted, q, side="left")
        hi = np.searchsorted(self.sorted, q, side="right")
        counts = np.where(q >= 0, hi - lo, 0)
        qrows = np.repeat(np.arange(len(q), dtype=np.int64), counts)
        starts = np.repeat(lo, counts)
        offsets = np.arange(counts.sum(), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
        return qrows, self.order[starts + offsets]


# ------------------------------------------------------------------------ tables
@dataclass
class Table:
    """A binding table: m rows, one code column per bound name."""

    m: int
    cols: dict[str, np.ndarray] = field(default_factory=dict)
    homes: dict[str, SetVal | None] = field(default_factory=dict)  # for next/prev

    @staticmethod
    def unit() -> Table:
        return Table(1)

    def take(self, rows: np.ndarray) -> Table:
        return Table(len(rows), {k: v[rows] for k, v in self.cols.items()}, dict(self.homes))

    def with_col(self, name: str, values: np.ndarray, home: SetVal | None = None) -> Table:
        cols = dict(self.cols)
        cols[name] = values
        homes = dict(self.homes)
        homes[name] = home
        return Table(self.m, cols, homes)


def with_row_id(t: Table) -> Table:
    """t with a column `__row`: each row's number (to group what is generated from it)."""
    return t.with_col("__row", np.arange(t.m, dtype=np.int64))


@dataclass
class SetRel:
    """A set that depends on the rows of a table: row `rows[i]` contains element `cols[i]`."""

    rows: np.ndarray
    cols: np.ndarray  # (n, arity)


@dataclass
class Family:
    """An instantiated indexed declaration: its domain rows and their key index."""

    keys: np.ndarray  # (n, arity) codes
    index: KeyIndex
    table: Table


def cross_rows(m: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.repeat(np.arange(m, dtype=np.int64), n), np.tile(np.arange(n, dtype=np.int64), m)


def expand_ranges(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For row i, the integers lo[i]..hi[i] inclusive: (row ids, values)."""
    counts = np.maximum(hi - lo + 1, 0).astype(np.int64)
    rows = np.repeat(np.arange(len(lo), dtype=np.int64), counts)
    offsets = np.arange(counts.sum(), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    return rows, np.repeat(lo.astype(np.int64), counts) + offsets


# ------------------------------------------------------------------------ values
@dataclass
class Const:
    v: np.ndarray  # float64 (m,), or bool (m,)
    dim: str = ""


@dataclass
class Elem:
    codes: np.ndarray  # int64 (m,)
    home: SetVal | None = None


@dataclass
class Lin:
    """m linear forms: sum of coefs * x[cols] over triplets with the same row, plus const."""

    m: int
    rows: np.ndarray
    cols: np.ndarray
    coefs: np.ndarray
    const: np.ndarray

    @staticmethod
    def constant(values: np.ndarray) -> Lin:
        e = np.zeros(0, dtype=np.int64)
        return Lin(len(values), e, e, np.zeros(0), np.asarray(values, dtype=np.float64))

    def __add__(self, other: Lin) -> Lin:
        return Lin(self.m, np.concatenate([self.rows, other.rows]), np.concatenate([self.cols, other.cols]),
                   np.concatenate([self.coefs, other.coefs]), self.const + other.const)

    def scale(self, factor: np.ndarray) -> Lin:
        """Multiply row i by factor[i] (factor of length m)."""
        factor = np.broadcast_to(np.asarray(factor, dtype=np.float64), (self.m,))
        return Lin(self.m, self.rows, self.cols, self.coefs * factor[self.rows], self.const * factor)

    def gather(self, src_rows: np.ndarray) -> Lin:
        """A new Lin whose row r is this Lin's row src_rows[r] (0 where src_rows[r] == -1)."""
        m = len(src_rows)
        valid = src_rows >= 0
        const = np.zeros(m)
        const[valid] = self.const[src_rows[valid]]
        if len(self.rows) == 0:
            return Lin.constant(const)
        order = np.argsort(self.rows, kind="stable")
        rows_sorted = self.rows[order]
        starts = np.searchsorted(rows_sorted, np.arange(self.m), side="left")
        ends = np.searchsorted(rows_sorted, np.arange(self.m), side="right")
        src = np.where(valid, src_rows, 0)
        counts = np.where(valid, ends[src] - starts[src], 0)
        out_rows = np.repeat(np.arange(m, dtype=np.int64), counts)
        offsets = np.arange(counts.sum(), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
        pick = order[np.repeat(starts[src], counts) + offsets]
        return Lin(m, out_rows, self.cols[pick], self.coefs[pick], const)

    def reduce(self, group: np.ndarray, m: int) -> Lin:
        """Sum rows into m groups (row r goes to group[r])."""
        return Lin(m, group[self.rows], self.cols, self.coefs, np.bincount(group, self.const, minlength=m)[:m])

    def take_rows(self, keep: np.ndarray) -> Lin:
        """Keep the rows where keep is True, renumbered."""
        new_id = np.cumsum(keep) - 1
        t = keep[self.rows]
        return Lin(int(keep.sum()), new_id[self.rows[t]], self.cols[t], self.coefs[t], self.const[keep])

    def activity_bounds(self, lb: np.ndarray, ub: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Smallest and largest value of each row given column bounds (may be +-inf)."""
        c = self.coefs
        with np.errstate(invalid="ignore"):
            lo_t = np.where(c > 0, c * lb[self.cols], c * ub[self.cols])
            hi_t = np.where(c > 0, c * ub[self.cols], c * lb[self.cols])
        lo_t = np.where(c == 0, 0.0, lo_t)
        hi_t = np.where(c == 0, 0.0, hi_t)
        return (np.bincount(self.rows, lo_t, minlength=self.m)[: self.m] + self.const,
                np.bincount(self.rows, hi_t, minlength=self.m)[: self.m] + self.const)
