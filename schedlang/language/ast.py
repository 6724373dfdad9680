"""The AST of a `.sched` file. Every node carries the `Loc` of the text it came from."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .errors import Loc


@dataclass
class Node:
    loc: Loc = field(repr=False, compare=False)


# ----------------------------------------------------------------------- expressions
@dataclass
class Num(Node):
    value: float
    unit: str = ""  # "" or one of units.UNITS
    text: str = ""


@dataclass
class Str(Node):
    value: str


@dataclass
class Name(Node):
    id: str


@dataclass
class Subscript(Node):  # x[a, b]
    name: str
    args: list


@dataclass
class Call(Node):  # f(a, b)
    func: str
    args: list


@dataclass
class Aggregate(Node):  # sum(i in I where c) body
    op: str
    items: list
    where: Node | None
    body: Node


@dataclass
class BinOp(Node):  # + - * / union diff inter
    op: str
    left: Node
    right: Node


@dataclass
class Neg(Node):
    operand: Node


@dataclass
class Compare(Node):
    op: str
    left: Node
    right: Node


@dataclass
class Member(Node):  # x in S / x not in S
    element: Node
    set: Node
    negated: bool = False


@dataclass
class Logic(Node):  # and / or / implies / iff
    op: str
    left: Node
    right: Node


@dataclass
class Not(Node):
    operand: Node


@dataclass
class Tuple(Node):
    items: list


@dataclass
class Range(Node):
    lo: Node
    hi: Node


@dataclass
class SetLit(Node):  # {a, b} or {i in I where c} (a builder when items are bindings)
    items: list
    where: Node | None


@dataclass
class SetFor(Node):  # {expr for i in I where c}
    expr: Node
    items: list
    where: Node | None


@dataclass
class Table(Node):  # {key: value, ...}
    pairs: list  # [(key expr, value expr)]


@dataclass
class Cond(Node):  # if c then a else b
    cond: Node
    then: Node
    other: Node


# ----------------------------------------------------------------------- declarations
@dataclass
class Index(Node):
    """A declaration's or aggregate's domain: `[items where cond]`."""

    items: list
    where: Node | None = None


@dataclass
class ModelDecl(Node):
    name: str
    doc: str = ""


@dataclass
class UseDecl(Node):
    target: str
    is_path: bool = False


@dataclass
class DropDecl(Node):
    name: str


@dataclass
class DecodeDecl(Node):
    decoder: str
    roles: dict  # role -> variable/expr name
    role_locs: dict = field(default_factory=dict, repr=False, compare=False)
    extend: bool = False  # `decode NAME += (...)`: roles added to a used file's decode


@dataclass
class SetDecl(Node):
    name: str
    index: Index | None
    value: Node
    when: Node | None = None  # `when COND` before it: exists only if COND holds


@dataclass
class ParamDecl(Node):
    name: str
    index: Index | None
    value: Node | None
    is_default: bool = False
    when: Node | None = None  # `when COND` before it: exists only if COND holds


@dataclass
class VarDecl(Node):
    name: str
    index: Index | None
    kind: str  # binary / integer / continuous
    lb: Node | None = None
    ub: Node | None = None
    doc: str = ""
    when: Node | None = None  # `when COND` before it: exists only if COND holds


@dataclass
class ExprDecl(Node):
    name: str
    index: Index | None
    value: Node
    when: Node | None = None  # `when COND` before it: exists only if COND holds


@dataclass
class ConstraintDecl(Node):
    name: str
    index: Index | None
    body: Node
    doc: str = ""
    when: Node | None = None  # `when COND` before it: exists only if COND holds


@dataclass
class Extension(Node):
    """A term added to a declaration, on the rows of `index`: `expr NAME[index] += value`
    (side "") or `constraint NAME[index]: lhs += value` (side "lhs" or "rhs")."""

    name: str
    index: Index | None
    side: str
    value: Node
    when: Node | None = None

    @property
    def extends(self) -> type:
        """The kind of declaration it adds to."""
        return ConstraintDecl if self.side else ExprDecl


@dataclass
class ObjectiveDecl(Node):
    sense: str  # min / max
    name: str
    body: Node
    extend: bool = False  # `minimize name += expr` adds terms to an inherited objective


# ----------------------------------------------------------------------- graph data
@dataclass
class Value(Node):
    """A number in graph data, with its unit ('' when none)."""

    value: float
    unit: str = ""
    text: str = ""


@dataclass
class NodeStmt(Node):
    name: str
    kind: str
    time: Value | None
    size: Value | None


@dataclass
class EdgeStmt(Node):
    source: str
    targets: list  # [(name, Loc)]


@dataclass
class DataStmt(Node):
    name: str
    size: Value
    role: str = ""
    pinned: bool = False


@dataclass
class OptionStmt(Node):
    name: str
    fwd: Value | None = None
    fwd_overhead: Value | None = None
    bwd: Value | None = None
    bwd_overhead: Value | None = None
    phantom: Value | None = None
    needs: list = field(default_factory=list)
    pinned: bool = False
    fwd_steps: list = field(default_factory=list)  # [StepStmt]
    bwd_steps: list = field(default_factory=list)
    segments: SegmentsStmt | None = None  # a generated option's cut of the layer's op units


@dataclass
class SegmentStmt(Node):
    """`keep 0..4` / `checkpoint 5..11 (...)`: op units first..last (positions, as written)
    and the segment's own cut."""

    kind: Any  # _GName-like text that remembers where it is written
    first: Value
    last: Value | None  # None: one unit (`keep 12`)
    children: list = field(default_factory=list)  # [SegmentStmt]


@dataclass
class SegmentsStmt(Node):
    signature: str  # the structure signature of the layer's op graph
    parts: list  # [SegmentStmt]


@dataclass
class StepStmt(Node):
    overhead: Value
    frees: list
    creates: list


@dataclass
class LayerStmt(Node):
    name: str
    inputs: list
    outputs: list
    grad_inputs: list
    grad_outputs: list
    options: list


@dataclass
class LossStmt(Node):
    inputs: list
    outputs: list
    time: Value | None


@dataclass
class GraphDecl(Node):
    name: str
    title: str
    items: list


@dataclass
class BudgetDecl(Node):
    kind: str
    value: Value


@dataclass
class BandwidthDecl(Node):
    kind: str          # "offload" (device -> host) or "prefetch" (host -> device)
    value: Value       # unit "B/s" (or a plain 0); `inf` as Value(inf, "", "inf")


@dataclass
class Module(Node):
    """One parsed file."""

    path: str
    items: list
