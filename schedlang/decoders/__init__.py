"""Decoders: a solved model's variables -> a Plan.

The compiler knows no formulation by name. A model says which decoder reads it and which of
its variables play which role, e.g. `decode stages(compute = R, keep = S, free = FREE)`.
One decoder per file; register it in DECODERS.
"""
from __future__ import annotations

from ..errors import CheckError, did_you_mean
from .phases import decode_phases
from .stages import decode_stages

DECODERS = {"stages": decode_stages, "phases": decode_phases}


def decode(program, ir, solution, graph):
    """The Plan of a solution, or None when the model declares no decoder."""
    decl = program.decode
    if decl is None or solution.x is None:
        return None
    fn = DECODERS.get(decl.decoder)
    if fn is None:
        raise CheckError(f"unknown decoder '{decl.decoder}'{did_you_mean(decl.decoder, DECODERS)}; "
                         f"decoders: {', '.join(DECODERS)}", decl.loc)
    return fn(decl, ir, solution, graph)


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
