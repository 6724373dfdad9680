"""Hand-built IR models for backend and presolve tests."""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from schedlang.compile.ir import ConstraintBlock, IRModel, Objective, VarFamily


def make_ir(families, blocks, c, sense="min", constant=0.0, name="m"):
    """families: [(name, kind, lb, ub)]; blocks: [(name, dense A over all columns, lo, hi)]."""
    fams, offset = [], 0
    for fname, kind, lb, ub in families:
        lb = np.asarray(lb, dtype=float)
        ub = np.asarray(ub, dtype=float)
        fams.append(VarFamily(fname, [(fname, i) for i in range(lb.size)], kind, lb, ub,
                              offset=offset))
        offset += lb.size
    blks = []
    for bname, A, lo, hi in blocks:
        A = np.atleast_2d(np.asarray(A, dtype=float))
        blks.append(ConstraintBlock(bname, [(bname, i) for i in range(A.shape[0])],
                                    sp.csr_matrix(A), np.asarray(lo, dtype=float),
                                    np.asarray(hi, dtype=float)))
    obj = None if c is None else Objective("obj", sense, np.asarray(c, dtype=float), constant)
    return IRModel(name, fams, blks, obj)
