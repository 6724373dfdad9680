"""Execution plans: ordered ops, and their JSON file format ``schedlang.plan/1``.

A plan file is a JSON object, readable without schedlang::

    {
      "schema": "schedlang.plan/1",
      "graph": "vgg16_train",
      "budget": {"peak_bytes": 14242598093, "save_bytes": null},
      "ops": [{"op": "compute", "node": "block1_conv1"}, {"op": "delete", "data": "block1_conv1"}],
      "predicted": {"peak_bytes": 13153337344, "time": 15805}
    }

Ops are objects holding ``op`` and only the fields that are present. Op indices in messages
are 0-based positions in the ``ops`` array (``op 12`` is ``ops[12]``). An optional top-level
``meta`` object carries free-form information (planner name, solver status, ...); readers
ignore top-level keys they do not know. ``docs/plans.md`` describes every op and what the
simulator checks; ``offload`` / ``prefetch`` name exactly one of ``data`` or ``layer`` (that
layer's saved phantom) with an optional ``fraction`` in (0, 1], and ``wait`` a ``channel``
(``"offload"`` or ``"prefetch"``), optionally with ``data`` or ``layer``.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..language.errors import DataError, Loc, did_you_mean
from ..language.files import write_file
from ..language.paths import read_text

SCHEMA = "schedlang.plan/1"

#: op kind -> (required fields, optional fields)
OP_FIELDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "compute": (("node",), ("option",)),
    "delete": (("data",), ()),
    "drop_phantom": (("layer",), ()),
    # offload / prefetch: exactly one of data / layer (checked in `_op_from_json`)
    "offload": ((), ("data", "layer", "fraction")),
    "prefetch": ((), ("data", "layer", "fraction")),
    "wait": (("channel",), ("data", "layer")),
}
OP_KINDS = tuple(OP_FIELDS)
#: the transfer channels a ``wait`` op names (device -> host, host -> device)
CHANNELS = ("offload", "prefetch")

_STR_FIELDS = ("node", "data", "option", "layer", "channel")
_ALL_FIELDS = ("node", "data", "option", "layer", "fraction", "channel")


@dataclass
class Op:
    """One plan step. Which fields are set depends on `op` (see `OP_FIELDS`)."""

    op: str
    node: str | None = None
    data: str | None = None
    option: str | None = None
    layer: str | None = None
    fraction: float | None = None
    channel: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.op}
        for name in _ALL_FIELDS:
            value = getattr(self, name)
            if value is not None:
                out[name] = float(value) if name == "fraction" else value
        return out

    def required(self, field: str) -> str:
        """The name in `field` ("node", "data", "layer", ...) that this op's kind needs;
        ValueError naming the op when it is unset (a plan read by `Plan.load` has them all,
        one built in code may not)."""
        value = getattr(self, field)
        if not isinstance(value, str):
            raise ValueError(f"op '{self}' names no {field}")
        return value

    def __str__(self) -> str:
        parts = [self.op]
        for name in _ALL_FIELDS:
            value = getattr(self, name)
            if value is not None:
                parts.append(f"{name}={value!r}")
        return " ".join(parts)


@dataclass
class Plan:
    graph: str
    ops: list[Op]
    budget_peak: int | None = None
    budget_save: int | None = None
    predicted_peak: int | None = None
    predicted_time: float | None = None
    meta: dict = field(default_factory=dict)

    # --- JSON ----------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": SCHEMA,
            "graph": self.graph,
            "budget": {"peak_bytes": _bytes_out(self.budget_peak),
                       "save_bytes": _bytes_out(self.budget_save)},
            "ops": [op.to_json() for op in self.ops],
            "predicted": {"peak_bytes": _bytes_out(self.predicted_peak),
                          "time": None if self.predicted_time is None
                          else float(self.predicted_time)},
        }
        if self.meta:
            out["meta"] = self.meta
        return out

    @classmethod
    def from_json(cls, obj: Any, source: str = "<plan>") -> Plan:
        """Build a plan from a decoded JSON value; problems raise a `DataError` at `source`."""
        loc = Loc(source)

        def fail(message: str) -> DataError:
            return DataError(message, loc)

        if not isinstance(obj, dict):
            raise fail(f"a plan file holds a JSON object, not {_json_type(obj)}")
        schema = obj.get("schema")
        if schema is None:
            raise fail(f"missing 'schema' (expected \"{SCHEMA}\")")
        if schema != SCHEMA:
            raise fail(f"unsupported plan schema {schema!r} (expected \"{SCHEMA}\")")

        graph = obj.get("graph")
        if not isinstance(graph, str):
            raise fail("'graph' must be a string (the graph's name)"
                       if "graph" in obj else "missing 'graph' (the graph's name)")

        budget = _object(obj, "budget", fail)
        budget_peak = _opt_bytes(budget.get("peak_bytes"), "budget.peak_bytes", fail)
        budget_save = _opt_bytes(budget.get("save_bytes"), "budget.save_bytes", fail)

        predicted = _object(obj, "predicted", fail)
        predicted_peak = _opt_bytes(predicted.get("peak_bytes"), "predicted.peak_bytes", fail)
        predicted_time = _opt_number(predicted.get("time"), "predicted.time", fail)

        meta = obj.get("meta", {})
        if meta is None:
            meta = {}
        if not isinstance(meta, dict):
            raise fail(f"'meta' must be an object, not {_json_type(meta)}")

        if "ops" not in obj:
            raise fail("missing 'ops' (the list of plan steps)")
        raw_ops = obj["ops"]
        if not isinstance(raw_ops, list):
            raise fail(f"'ops' must be a list, not {_json_type(raw_ops)}")
        ops = [_op_from_json(i, raw, fail) for i, raw in enumerate(raw_ops)]

        return cls(graph=graph, ops=ops, budget_peak=budget_peak, budget_save=budget_save,
                   predicted_peak=predicted_peak, predicted_time=predicted_time, meta=dict(meta))

    def dumps(self) -> str:
        """The plan file text: indented, one op per line, so that plan files diff well."""
        body = []
        for key, value in self.to_json().items():
            if key == "ops":
                if value:
                    op_lines = ",\n".join("    " + json.dumps(op) for op in value)
                    body.append(f'  "ops": [\n{op_lines}\n  ]')
                else:
                    body.append('  "ops": []')
            elif isinstance(value, dict) and not any(isinstance(v, (dict, list))
                                                     for v in value.values()):
                body.append(f"  {json.dumps(key)}: {json.dumps(value, default=_json_default)}")
            else:
                text = json.dumps(value, indent=2, default=_json_default)
                body.append(f"  {json.dumps(key)}: {_indent(text)}")
        return "{\n" + ",\n".join(body) + "\n}\n"

    def save(self, path: str | Path) -> None:
        """Write the plan to `path` atomically (schedlang.language.files): a failed write keeps the old file."""
        write_file(path, self.dumps())

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        source = str(path)
        try:
            text = read_text(path, what="plan file")
        except DataError as exc:
            raise DataError(f"cannot read plan file: {exc.message}", exc.loc) from None
        return cls.loads(text, source)

    @classmethod
    def loads(cls, text: str, source: str = "<plan>") -> Plan:
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            loc = Loc(source, exc.lineno, exc.colno)
            raise DataError(f"invalid JSON: {exc.msg}", loc) from None
        return cls.from_json(obj, source)

    # --- conveniences --------------------------------------------------------------------
    def computes(self) -> list[str]:
        return [op.node for op in self.ops if op.op == "compute" and op.node is not None]


def _bytes_out(value: Any) -> int | None:
    """Byte counts are whole numbers in the file (solvers hand back floats like 1e9+1e-6)."""
    return None if value is None else int(round(float(value)))


def _json_default(value: Any) -> Any:
    """JSON for values numpy and friends put in `meta`: their Python scalar, else text."""
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return item()
        except (TypeError, ValueError):
            pass
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


def _indent(text: str) -> str:
    return text.replace("\n", "\n  ")


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _object(obj: dict, key: str, fail) -> dict:
    """The optional JSON object `obj[key]` ({} when absent or null)."""
    value = obj.get(key, {})
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise fail(f"'{key}' must be an object, not {_json_type(value)}")
    return value


def _opt_bytes(value: Any, what: str, fail) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail(f"'{what}' must be a number of bytes or null, not {_json_type(value)}")
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise fail(f"'{what}' must be a whole number of bytes, not {value!r}")
        value = int(value)
    if value < 0:
        raise fail(f"'{what}' must not be negative ({value})")
    return value


def _opt_number(value: Any, what: str, fail) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail(f"'{what}' must be a number or null, not {_json_type(value)}")
    if not math.isfinite(value):
        raise fail(f"'{what}' must be finite, not {value!r}")
    return float(value)


def _op_from_json(index: int, raw: Any, fail) -> Op:
    where = f"op {index}"
    if not isinstance(raw, dict):
        raise fail(f"{where}: an op is a JSON object, not {_json_type(raw)}")
    kind = raw.get("op")
    if kind is None:
        raise fail(f"{where}: missing field 'op' (one of {', '.join(OP_KINDS)})")
    if not isinstance(kind, str):
        raise fail(f"{where}: field 'op' must be a string, not {_json_type(kind)}")
    if kind not in OP_FIELDS:
        raise fail(f"{where}: unknown op {kind!r}{did_you_mean(kind, OP_KINDS)}"
                   f" (known ops: {', '.join(OP_KINDS)})")
    required, optional = OP_FIELDS[kind]
    allowed = set(required) | set(optional)
    for key in raw:
        if key != "op" and key not in allowed:
            hint = did_you_mean(key, sorted(allowed))
            raise fail(f"{where}: unexpected field {key!r} in a {kind} op{hint}")
    for key in required:
        if raw.get(key) is None:
            raise fail(f"{where}: {kind} op is missing field {key!r}")
    values: dict[str, Any] = {}
    for key in allowed:
        value = raw.get(key)
        if value is None:
            continue
        if key in _STR_FIELDS:
            if not isinstance(value, str):
                raise fail(f"{where}: field {key!r} must be a string, not {_json_type(value)}")
            if not value:
                raise fail(f"{where}: field {key!r} must not be empty")
        elif key == "fraction":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise fail(f"{where}: field 'fraction' must be a number, not {_json_type(value)}")
            if not (0.0 < value <= 1.0):  # also rejects NaN
                raise fail(f"{where}: field 'fraction' must be between 0 (excluded) and 1, "
                           f"not {value!r}")
            value = float(value)
        values[key] = value
    if kind in ("offload", "prefetch"):
        named = [key for key in ("data", "layer") if key in values]
        if len(named) != 1:
            what = "both" if named else "neither"
            raise fail(f"{where}: {_a(kind)} op names exactly one of 'data' (a data node) or "
                       f"'layer' (that layer's saved phantom), not {what}")
    elif kind == "wait":
        channel = values["channel"]
        if channel not in CHANNELS:
            raise fail(f"{where}: field 'channel' must be one of {', '.join(map(repr, CHANNELS))}"
                       f", not {channel!r}{did_you_mean(channel, CHANNELS)}")
        if "data" in values and "layer" in values:
            raise fail(f"{where}: a wait op names at most one of 'data' or 'layer', not both")
    return Op(op=kind, **values)


def _a(word: str) -> str:
    """`word` with its indefinite article: 'an offload', 'a prefetch'."""
    return f"{'an' if word[:1] in 'aeiou' else 'a'} {word}"
