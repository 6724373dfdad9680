"""Decoders: a solved model's variables -> a Plan.

The compiler knows no formulation by name. A model says which decoder reads it and which of
its variables play which role, e.g. `decode stages(compute = R, keep = S, free = FREE)`.
One decoder per file; register it in DECODERS.

`encode` goes the other way (a Plan -> one value per column, e.g. a MIP start), through the
decoder's encoder in `ENCODERS` (stages, phases and steps).
"""
from __future__ import annotations

from ...language.errors import CheckError, did_you_mean
from .encode import ENCODERS as STAGE_PHASE_ENCODERS
from .encode import NotEncodable
from .phases import decode_phases
from .segments import decode_segments
from .stages import decode_stages
from .steps import decode_steps, encode_steps
from .steps import plan_space as steps_plan_space

DECODERS = {"stages": decode_stages, "phases": decode_phases, "segments": decode_segments,
            "steps": decode_steps}
ENCODERS = {**STAGE_PHASE_ENCODERS, "steps": encode_steps}


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


def plan_space(program, ir) -> str:
    """What the model's status, bound and gap hold for, when it is narrower than every plan of
    the graph its decoder reads ("" otherwise): a step model's steps bound the computations."""
    decl = program.decode
    if decl is None or decl.decoder != "steps":
        return ""
    return steps_plan_space(decl, ir)


def encode(program, ir, plan, graph, notes: list | None = None):
    """Values for every column of `ir` that carry out `plan` (the reverse of `decode`: e.g. a
    MIP start), or None when the model declares no decoder, its decoder has no encoder, or the
    plan cannot be written in the model's variables; then the reason is appended to `notes`.
    The vector is not checked against the rows: see `encode.check_point`."""
    decl = program.decode
    why = None
    if decl is None:
        why = "the model declares no decoder, so no plan can be encoded"
    elif decl.decoder not in ENCODERS:
        why = f"the '{decl.decoder}' decoder has no encoder"
    else:
        try:
            return ENCODERS[decl.decoder](decl, ir, plan, graph)
        except NotEncodable as exc:
            why = str(exc)
    if notes is not None:
        notes.append(why)
    return None


