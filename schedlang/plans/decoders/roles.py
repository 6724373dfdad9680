"""What every decoder reads: the values of the variable (or named expression) that plays a
role of the model's `decode` declaration."""
from __future__ import annotations

from typing import Literal, overload

from ...language.errors import CheckError


@overload
def role_values(decl, ir, solution, role: str, required: Literal[True] = True) -> dict: ...
@overload
def role_values(decl, ir, solution, role: str, required: bool) -> dict | None: ...


def role_values(decl, ir, solution, role: str, required: bool = True) -> dict | None:
    """{index tuple: value} of the variable that plays `role`."""
    name = decl.roles.get(role)
    if name is None:
        if required:
            raise CheckError(f"decoder '{decl.decoder}' needs the role '{role}'", decl.loc)
        return None
    if name in ir.observed:  # a named expression of the model
        return ir.observed[name].values(solution.x)
    fam = ir.family(name)
    values = solution.x[fam.offset: fam.offset + fam.size]
    return dict(zip(fam.keys, values.tolist()))
