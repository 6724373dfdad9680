"""The intermediate representation: what lowering produces and the only thing a backend sees.

A model is a list of variable families (contiguous column ranges) and a list of constraint
blocks (sparse rows ``lo <= A x <= hi``), plus a linear objective. Keys are the index tuples
of the `.sched` declaration (element names as Python values), kept for decoding and for
readable names in backends.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from ..language.errors import Loc

VAR_KINDS = ("binary", "integer", "continuous")


@dataclass
class VarFamily:
    name: str
    keys: list[tuple]  # one index tuple per column (() for a scalar)
    kind: str  # one of VAR_KINDS
    lb: np.ndarray  # float64, -inf allowed
    ub: np.ndarray  # float64, +inf allowed
    offset: int = 0  # first global column
    loc: Loc | None = None
    doc: str = ""

    @property
    def size(self) -> int:
        return len(self.keys)

    @property
    def columns(self) -> range:
        return range(self.offset, self.offset + self.size)


@dataclass
class ConstraintBlock:
    name: str
    keys: list[tuple]  # one index tuple per row
    A: sp.csr_matrix  # shape (len(keys), n_columns)
    lo: np.ndarray  # -inf allowed
    hi: np.ndarray  # +inf allowed; lo == hi is an equality
    loc: Loc | None = None

    @property
    def size(self) -> int:
        return len(self.keys)


@dataclass
class Objective:
    name: str
    sense: str  # "min" or "max"
    c: np.ndarray  # dense, length n_columns
    constant: float = 0.0
    loc: Loc | None = None


@dataclass
class Observed:
    """A named expression a decoder reads: value[i] = (E @ x)[i] + const[i] for keys[i]."""

    name: str
    keys: list[tuple]
    E: sp.csr_matrix
    const: np.ndarray

    def values(self, x: np.ndarray) -> dict:
        return dict(zip(self.keys, (self.E @ x + self.const).tolist()))


@dataclass
class IRModel:
    name: str
    variables: list[VarFamily] = field(default_factory=list)
    constraints: list[ConstraintBlock] = field(default_factory=list)
    objective: Objective | None = None
    observed: dict[str, Observed] = field(default_factory=dict)  # not seen by backends

    @property
    def n_columns(self) -> int:
        return sum(f.size for f in self.variables)

    @property
    def n_rows(self) -> int:
        return sum(b.size for b in self.constraints)

    @property
    def nnz(self) -> int:
        return int(sum(b.A.nnz for b in self.constraints))

    def family(self, name: str) -> VarFamily:
        for fam in self.variables:
            if fam.name == name:
                return fam
        raise KeyError(name)

    # Whole-model arrays, in column order; backends that want one matrix use these.
    def column_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.variables:
            return np.zeros(0), np.zeros(0)
        return (np.concatenate([f.lb for f in self.variables]),
                np.concatenate([f.ub for f in self.variables]))

    def integrality(self) -> np.ndarray:
        """Boolean mask: True where the column is binary or integer."""
        if not self.variables:
            return np.zeros(0, dtype=bool)
        return np.concatenate([np.full(f.size, f.kind != "continuous") for f in self.variables])

    def stacked(self) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray]:
        """All constraint blocks as one CSR matrix with row bounds."""
        n = self.n_columns
        if not self.constraints:
            return sp.csr_matrix((0, n)), np.zeros(0), np.zeros(0)
        A = sp.vstack([b.A for b in self.constraints], format="csr")
        return (A, np.concatenate([b.lo for b in self.constraints]),
                np.concatenate([b.hi for b in self.constraints]))

    def size_summary(self) -> dict[str, int]:
        return {"variables": self.n_columns, "constraints": self.n_rows, "nonzeros": self.nnz}
