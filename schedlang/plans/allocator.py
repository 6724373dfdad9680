"""Buffer assignment for a plan: liveness analysis, memory sharing and arena offsets.

A plan says *when* each value is in memory; this module decides *where*. It follows the
memory-optimization transpiler of PaddlePaddle (seed 002: liveness by the dataflow equations,
in-place reuse, a pool of dead buffers) and adds "greedy by size" offset assignment
(Pisarchyk & Lee 2020, as in TFLite and ExecuTorch).

Liveness (`liveness`)
    The plan is a straight-line program: its control-flow graph is ENTRY -> op 0 -> ... ->
    op n-1 -> EXIT. Every definition of a value starts a new *value* (static single
    assignment: recomputing ``h1`` defines ``h1@2``, a new buffer lifetime). Definitions and
    uses per op:

    * ``compute`` uses the current copy of every datum it reads (Checkmate: each predecessor's
      output; layered graphs: the node's inputs, plus the option's ``needs`` and the layer's
      phantom for a backward) and defines its outputs: a new copy of each datum it creates, the
      phantom its forward saves, and a *workspace* value for the option's transient overhead
      (with a sub-step profile: the largest of its steps' overheads and the flat one). A
      contribution to a live gradient with several creators is accumulated in place: a use of
      the gradient's current copy, not a new value;
    * ``delete`` / ``drop_phantom`` end a lifetime; a backward ends its phantom's;
    * ENTRY defines the graph's inputs; EXIT uses every value the plan leaves in memory, which
      includes the graph outputs (role ``output``, e.g. input gradients): they are never given
      away (PaddlePaddle reused buffers that the user still fetched; this does not).

    ``live_in[n] = use[n] | (live_out[n] - def[n])``, ``live_out[n] = union of live_in[s]`` over
    the successors s, solved by iteration to the fixed point.

    With ``free_at="delete"`` (the default) a value is held until the plan frees it, as the
    simulator counts memory: a ``delete``/``drop_phantom`` (and the recomputation that replaces
    a live copy) is a use of the value it frees, and the max-live bytes equal the simulator's
    peak (a sub-step profile can make them larger: the whole workspace is held for the whole op).
    With ``free_at="last_use"`` a value dies after its last real read, as in PaddlePaddle;
    that bound can be below the plan's peak (the plan frees late).

Intervals
    A value occupies ``[start, end]`` (op indices, both included; -1 is ENTRY, ``len(ops)`` is
    EXIT). A value that dies at a ``delete`` right after a compute ends at that compute: the
    frees between two computes happen before the next one allocates. Two values are
    *simultaneously live* when their intervals intersect; max-live bytes, the lower bound of
    every placement, is the most bytes live at one op.

Methods (`allocate`; `METHODS`)
    ``greedy_by_size``
        One arena; values by decreasing size, each at the lowest offset that does not overlap
        an already placed value whose interval intersects its own.
    ``pool``
        PaddlePaddle's memory sharing: ops in order; each value defined takes the smallest
        free buffer that fits (best fit), else the largest free buffer grown to its size, else a
        new buffer; values that die at the op return to the pool after the op's definitions
        (``pool --> o; i --> pool``). The buffers are laid out end to end.
    ``inplace``
        ``pool`` with in-place reuse first (``i --> pool; pool --> o`` for the dying inputs).

In-place reuse (opt-in: the ``inplace`` argument)
    An op may write a data output into the buffer of a data input it *reads* and that dies
    there (its interval ends at that op; not a phantom, not a workspace, not a value kept at
    the end), when the input is at least as large as the output. The output's assignment
    records ``inplace_of``; the two share bytes at that op only. ``inplace=True`` allows every
    compute node, a collection of node names or a predicate ``name -> bool`` allows some.
    Method ``inplace`` uses ``inplace=True`` unless told otherwise; ``greedy_by_size`` and
    ``pool`` use it only when given. With in-place reuse the report's ``max_live_bytes`` is the
    bound of the merged buffers (an output living in its input's buffer counts the larger of
    the two), which can be below or above the plain max-live; `AllocationReport.plain_max_live`
    keeps the plain one.

The arena includes fragmentation: ``arena_bytes >= max_live_bytes`` always.
"""
from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from ..graphs.graph import Graph
from ..language.errors import DataError, Loc
from ..language.units import format_size
from .interpreter import PlanInterpreter
from .plan import Op, Plan
from .simulate import NO_LIMIT, simulate

METHODS = ("inplace", "pool", "greedy_by_size")
FREE_AT = ("delete", "last_use")



@dataclass(frozen=True)
class Value:
    """One buffer lifetime: a definition of a datum, a saved phantom, or an op's workspace."""

    id: int
    name: str  # "h1", "h1@2" (its second definition), "phantom(block1)", "workspace@op7"
    kind: str  # "data", "phantom" or "workspace"
    key: str  # the datum, layer or op it belongs to
    size: int
    start: int  # op index of its definition; -1: an input, in memory at ENTRY
    end: int  # last op index where it is live; len(ops): kept to EXIT


@dataclass
class Liveness:
    """The dataflow solution over a plan (see the module docstring)."""

    values: list[Value]
    # per CFG node: index 0 is ENTRY, k + 1 is op k, len(ops) + 1 is EXIT; sets of value ids
    defs: list[frozenset]
    uses: list[frozenset]
    live_in: list[frozenset]
    live_out: list[frozenset]
    reads: list[frozenset]  # the data values a compute really reads (in-place candidates)
    max_live_bytes: int
    max_live_at: int  # op index (-1: ENTRY, len(ops): EXIT)
    iterations: int  # sweeps to the fixed point
    free_at: str
    op_names: list[str | None]  # per op: the compute node's name, None for other ops

    def live_at(self, op: int) -> set:
        """Value ids occupying memory during op `op` (-1: ENTRY, len(ops): EXIT)."""
        node = op + 1
        return set(self.live_in[node]) | set(self.defs[node])


@dataclass
class Assignment:
    value: str
    kind: str
    size: int
    start: int
    end: int
    offset: int
    buffer: int | None = None  # pool methods: the buffer it shares
    inplace_of: str | None = None  # the dying input whose bytes it reuses

    def to_json(self) -> dict:
        out = {"value": self.value, "kind": self.kind, "size": self.size, "start": self.start,
               "end": self.end, "offset": self.offset}
        if self.buffer is not None:
            out["buffer"] = self.buffer
        if self.inplace_of is not None:
            out["inplace_of"] = self.inplace_of
        return out


@dataclass
class AllocationReport:
    arena_bytes: int
    max_live_bytes: int  # lower bound for this method's buffers
    method: str
    assignments: list[Assignment]
    plain_max_live: int | None = None  # max-live without in-place merging
    buffers: int | None = None  # pool methods: how many buffers
    inplace_reuses: int = 0

    @property
    def fragmentation(self) -> float:
        """Arena bytes over the lower bound, minus one (0.0: optimal)."""
        return self.arena_bytes / self.max_live_bytes - 1.0 if self.max_live_bytes else 0.0

    def to_json(self, with_assignments: bool = False) -> dict:
        out = {"method": self.method, "arena_bytes": self.arena_bytes,
               "max_live_bytes": self.max_live_bytes,
               "fragmentation": round(self.fragmentation, 6),
               "inplace_reuses": self.inplace_reuses}
        if self.buffers is not None:
            out["buffers"] = self.buffers
        if with_assignments:
            out["assignments"] = [a.to_json() for a in self.assignments]
        return out


# --- liveness ------------------------------------------------------------------------------
class _Builder:
    """Renames the plan's definitions into values and records def/use per CFG node."""

    def __init__(self, n_ops: int, free_at: str) -> None:
        self.names: list[str] = []
        self.kinds: list[str] = []
        self.keys: list[str] = []
        self.sizes: list[int] = []
        self.def_node: list[int] = []
        self.count: dict[tuple[str, str], int] = {}
        nodes = n_ops + 2
        self.defs: list[set] = [set() for _ in range(nodes)]
        self.uses: list[set] = [set() for _ in range(nodes)]
        self.reads: list[set] = [set() for _ in range(nodes)]
        self.release = free_at == "delete"

    def new(self, node: int, kind: str, key: str, size: int) -> int:
        c = self.count.get((kind, key), 0) + 1
        self.count[(kind, key)] = c
        base = {"data": key, "phantom": f"phantom({key})", "workspace": f"workspace@{key}"}[kind]
        v = len(self.names)
        self.names.append(base if c == 1 else f"{base}@{c}")
        self.kinds.append(kind)
        self.keys.append(key)
        self.sizes.append(int(size))
        self.def_node.append(node)
        self.defs[node].add(v)
        return v

    def use(self, node: int, v: int, read: bool = True) -> None:
        self.uses[node].add(v)
        if read and self.kinds[v] == "data":
            self.reads[node].add(v)

    def size_of(self, v: int) -> int:
        return self.sizes[v]

    def free(self, node: int, v: int) -> None:
        """The plan frees `v` here: a use with free_at="delete"."""
        if self.release:
            self.uses[node].add(v)


def _validate(plan: Plan, graph: Graph) -> None:
    res = simulate(plan, graph, budget=NO_LIMIT, save_budget=NO_LIMIT)
    if not res.valid:
        more = f" (and {len(res.errors) - 1} more)" if len(res.errors) > 1 else ""
        raise DataError(f"cannot allocate buffers for a plan that does not replay: "
                        f"{res.errors[0]}{more}", graph.loc or Loc(graph.name or "<graph>"))


class _Values(PlanInterpreter):
    """The values a plan defines and uses, op by op (node k + 1 is op k; node 0 the inputs,
    the last node the plan's end), for the liveness analysis."""

    def __init__(self, b: _Builder) -> None:
        self.b = b
        self.op_names: list[str | None] = []

    @property
    def node(self) -> int:
        return self.index + 1

    def before_op(self, op: Op) -> None:
        self.op_names.append(op.node if op.op == "compute" else None)

    def values(self, plan: Plan) -> list[str | None]:
        self.run(plan.ops)
        exit_node = len(plan.ops) + 1
        for v in self.live_at_end():
            self.b.use(exit_node, v, read=False)
        return self.op_names

    def live_at_end(self) -> list[int]:
        raise NotImplementedError


class _CheckmateValues(_Values):
    """The Checkmate view: one value per computed output."""

    def __init__(self, graph: Graph, b: _Builder) -> None:
        super().__init__(b)
        self.arr = graph.checkmate_index()
        self.cur: dict[int, int] = {}

    def on_compute(self, op: Op) -> None:
        arr, b, node = self.arr, self.b, self.node
        i = arr.index[op.required("node")]
        for p in arr.preds[i]:
            b.use(node, self.cur[p])
        if i in self.cur:  # recomputation: the old copy goes when the new one exists
            b.free(node, self.cur[i])
        self.cur[i] = b.new(node, "data", arr.names[i], arr.size[i])

    def on_delete(self, op: Op) -> None:
        self.b.free(self.node, self.cur.pop(self.arr.index[op.required("data")]))

    def live_at_end(self) -> list[int]:
        return list(self.cur.values())


class _LayeredValues(_Values):
    """The layered view: data (with their contributions), phantoms, workspaces, and the
    buffers of transfers until they are waited."""

    def __init__(self, graph: Graph, b: _Builder) -> None:
        super().__init__(b)
        ha = self.ha = graph.layered_index()
        self.ncre = [len(c) for c in ha.creators]
        self.cur: dict[int, int] = {}
        self.mask: dict[int, int] = {}
        self.ph: dict[int, int] = {}
        for d in ha.inputs:
            self.cur[d] = b.new(0, "data", ha.data[d], ha.size[d])
            self.mask[d] = 0
        self.sending: dict[tuple, list[int]] = {}  # offloads not waited: tensor -> values read
        self.incoming: dict[tuple, list] = {}  # prefetch rounds: tensor -> [buffer, fraction]
        self.host_phantom: dict[int, int] = {}  # layer -> bytes of its phantom's host copy

    def on_compute(self, op: Op) -> None:
        ha, b, node, cur, mask, ph = self.ha, self.b, self.node, self.cur, self.mask, self.ph
        i = ha.index[op.required("node")]
        o = 0 if op.option is None else ha.opt_index[i][op.option]
        kind, j, lo = ha.kind[i], ha.layer[i], ha.opt_layer_opt[i][o]
        read = list(ha.uses[i]) + (list(ha.opt_uses[i][o]) if kind == "bwd" else [])
        for d in read:
            b.use(node, cur[d])
        if kind == "bwd":  # consumes its layer's phantom
            b.use(node, ph.pop(j), read=False)
        for d, bit in ha.creates[i]:
            if d in cur and self.ncre[d] > 1 and not (mask[d] & bit):
                b.use(node, cur[d], read=False)  # accumulated into the live gradient
                mask[d] |= bit
                continue
            if d in cur:
                b.free(node, cur[d])
            cur[d] = b.new(node, "data", ha.data[d], ha.size[d])
            mask[d] = bit
        if kind == "fwd" and lo >= 0:
            if j in ph:
                b.free(node, ph[j])
            ph[j] = b.new(node, "phantom", ha.layers[j], ha.phantom[j][lo])
        work = max([ha.opt_overhead[i][o]] + [s[0] for s in ha.opt_steps[i][o]])
        if work > 0:
            b.new(node, "workspace", f"op{self.index}", work)

    def on_delete(self, op: Op) -> None:
        d = self.ha.data_index[op.required("data")]
        self.b.free(self.node, self.cur.pop(d))
        self.mask.pop(d, None)

    def on_drop_phantom(self, op: Op) -> None:
        self.b.free(self.node, self.ph.pop(self.ha.layer_index[op.required("layer")]))

    def _tensor(self, op: Op) -> tuple[tuple, dict[int, int]]:
        ha = self.ha
        key = (("data", ha.data_index[op.data]) if op.data is not None
               else ("layer", ha.layer_index[op.required("layer")]))
        return key, (self.cur if key[0] == "data" else self.ph)

    def on_offload(self, op: Op) -> None:
        key, live = self._tensor(op)
        if op.layer is not None:
            self.host_phantom[key[1]] = self.b.size_of(self.ph[key[1]])
        # the device copy is read until the transfer is waited
        self.b.use(self.node, live[key[1]], read=False)
        self.sending.setdefault(key, []).append(live[key[1]])

    def on_prefetch(self, op: Op) -> None:
        ha = self.ha
        key, _ = self._tensor(op)
        if key not in self.incoming:  # a prefetch round allocates the whole tensor at its start
            kind, name, size = (("data", ha.data[key[1]], ha.size[key[1]]) if key[0] == "data"
                                else ("phantom", ha.layers[key[1]], self.host_phantom[key[1]]))
            self.incoming[key] = [self.b.new(self.node, kind, name, size), 0.0]
        self.incoming[key][1] += 1.0 if op.fraction is None else op.fraction

    def on_wait(self, op: Op) -> None:
        ha, sending, incoming = self.ha, self.sending, self.incoming
        for key in [x for x in list(sending) + list(incoming) if _waits_for(op, x, ha)]:
            if op.channel == "offload" and key in sending:
                for v in sending.pop(key):
                    self.b.use(self.node, v, read=False)
            elif op.channel == "prefetch" and key in incoming and incoming[key][1] >= 1.0 - 1e-9:
                value, _ = incoming.pop(key)
                (self.cur if key[0] == "data" else self.ph)[key[1]] = value
                if key[0] == "data":
                    self.mask[key[1]] = ha.full[key[1]]

    def live_at_end(self) -> list[int]:
        return list(self.cur.values()) + list(self.ph.values())


def _waits_for(op, key: tuple, ha) -> bool:
    """Whether a `wait` op covers the transfers of `key` (("data", d) or ("layer", j))."""
    if op.data is not None:
        return key == ("data", ha.data_index[op.data])
    if op.layer is not None:
        return key == ("layer", ha.layer_index[op.layer])
    return True


def liveness(plan: Plan, graph: Graph, *, free_at: str = "delete",
             validate: bool = True) -> Liveness:
    """Solve the liveness dataflow equations over `plan` on `graph` (module docstring).

    The plan must replay in the simulator (budgets aside): `DataError` otherwise.
    """
    if free_at not in FREE_AT:
        raise ValueError(f"free_at must be one of {', '.join(FREE_AT)}, not {free_at!r}")
    if validate:
        _validate(plan, graph)
    n = len(plan.ops)
    b = _Builder(n, free_at)
    walk = _LayeredValues(graph, b) if graph.is_layered else _CheckmateValues(graph, b)
    op_names = walk.values(plan)

    # the dataflow equations on the CFG ENTRY -> op 0 -> ... -> EXIT, by round-robin sweeps in
    # reverse order until nothing changes (one sweep and a confirming one for a straight line)
    nodes = n + 2
    succ = [[s + 1] if s + 1 < nodes else [] for s in range(nodes)]
    live_in: list[set] = [set() for _ in range(nodes)]
    live_out: list[set] = [set() for _ in range(nodes)]
    iterations = 0
    changed = True
    while changed:
        changed = False
        iterations += 1
        for node in reversed(range(nodes)):
            out = set().union(*(live_in[s] for s in succ[node]))
            inn = b.uses[node] | (out - b.defs[node])
            if inn != live_in[node] or out != live_out[node]:
                live_in[node], live_out[node] = inn, out
                changed = True

    # intervals: from the definition to the last node where the value is live-in, a trailing
    # run of deletes attributed to the compute before it
    last_compute = []
    lc = -1
    for k, op in enumerate(plan.ops):
        if op.op == "compute":
            lc = k
        last_compute.append(lc)
    nv = len(b.names)
    raw_end = list(b.def_node)
    for node in range(nodes):
        for v in live_in[node]:
            if node > raw_end[v]:
                raw_end[v] = node
    values = []
    for v in range(nv):
        start = b.def_node[v] - 1
        e = raw_end[v]
        if e == nodes - 1:
            end = n
        elif e == 0:
            end = -1
        else:
            end = max(start, last_compute[e - 1])
        values.append(Value(v, b.names[v], b.kinds[v], b.keys[v], b.sizes[v], start, end))

    best, best_at = -1, -1
    for node in range(nodes):
        total = sum(b.sizes[v] for v in live_in[node] | b.defs[node])
        if total > best:
            best, best_at = total, node - 1
    return Liveness(values=values, defs=[frozenset(s) for s in b.defs],
                    uses=[frozenset(s) for s in b.uses],
                    live_in=[frozenset(s) for s in live_in],
                    live_out=[frozenset(s) for s in live_out],
                    reads=[frozenset(s) for s in b.reads], max_live_bytes=max(best, 0),
                    max_live_at=best_at, iterations=iterations, free_at=free_at,
                    op_names=op_names)


def max_live(values: list[Value]) -> int:
    """The most bytes of `values` whose intervals contain one op: a lower bound of any arena."""
    events: dict[int, int] = {}
    for v in values:
        events[v.start] = events.get(v.start, 0) + v.size
        events[v.end + 1] = events.get(v.end + 1, 0) - v.size
    best = cur = 0
    for t in sorted(events):
        cur += events[t]
        best = max(best, cur)
    return best


# --- in-place pairs ------------------------------------------------------------------------
InplaceRule = bool | Collection[str] | Callable[[str], bool]


def _allows(rule: InplaceRule) -> Callable[[str], bool]:
    if rule is True:
        return lambda name: True
    if rule is False or rule is None:
        return lambda name: False
    if callable(rule):
        return rule
    names = set(rule)
    return lambda name: name in names


def inplace_pairs(lv: Liveness, rule: InplaceRule = True) -> dict[int, int]:
    """{output value id: input value id} for the in-place reuses `rule` allows.

    At each compute op the rule allows, the data outputs, largest first, each take the smallest
    still unclaimed dying input (a data value the op reads whose interval ends there) at least
    as large as the output.
    """
    allow = _allows(rule)
    pairs: dict[int, int] = {}
    vals = lv.values
    for k, name in enumerate(lv.op_names):
        if name is None or not allow(name):
            continue
        node = k + 1
        dying = [v for v in lv.reads[node] if vals[v].end == k and vals[v].kind == "data"]
        if not dying:
            continue
        outs = sorted((v for v in lv.defs[node] if vals[v].kind == "data"),
                      key=lambda v: (-vals[v].size, v))
        for o in outs:
            fits = [v for v in dying if vals[v].size >= vals[o].size]
            if not fits:
                continue
            src = min(fits, key=lambda v: (vals[v].size, v))
            dying.remove(src)
            pairs[o] = src
    return pairs


# --- methods -------------------------------------------------------------------------------
def _greedy_by_size(items: list[tuple[int, int, int, int]], restarts: int = 0, seed: int = 0
                    ) -> tuple[dict[int, int], int]:
    """items: (key, size, start, end) -> ({key: offset}, arena bytes).

    Values by decreasing size (ties: earlier start, then key), each at the lowest offset free
    of the placed values it is live with. `restarts` > 0 also tries that many orders by
    randomly perturbed sizes (size * (1 + 3u), u uniform in [0, 1), seeded by `seed`) and keeps
    the smallest arena: the plain greedy order is always the first try, so restarts never do
    worse.
    """
    import random

    best = _place(sorted(items, key=lambda it: (-it[1], it[2], it[0])))
    rng = random.Random(seed)
    for _ in range(restarts):
        jitter = {it[0]: it[1] * (1.0 + 3.0 * rng.random()) for it in items}
        got = _place(sorted(items, key=lambda it: (-jitter[it[0]], it[2], it[0])))
        if got[1] < best[1]:
            best = got
    return best


def _place(order: list[tuple[int, int, int, int]]) -> tuple[dict[int, int], int]:
    placed: list[tuple[int, int, int, int]] = []  # (offset, size, start, end)
    offsets: dict[int, int] = {}
    arena = 0
    for key, size, start, end in order:
        busy = sorted((off, off + sz) for off, sz, s, e in placed
                      if sz > 0 and s <= end and start <= e)
        off = 0
        for a, z in busy:
            if a >= off + size:
                break
            off = max(off, z)
        offsets[key] = off
        placed.append((off, size, start, end))
        arena = max(arena, off + size)
    return offsets, arena


def _pool(values: list[Value], pairs: dict[int, int]
          ) -> tuple[dict[int, int], dict[int, int], list[int]]:
    """Best-fit pool; returns ({value: buffer}, {value: offset}, buffer sizes)."""
    by_start: dict[int, list[Value]] = {}
    by_end: dict[int, list[Value]] = {}
    for v in values:
        by_start.setdefault(v.start, []).append(v)
        by_end.setdefault(v.end, []).append(v)
    sizes: list[int] = []
    free: set[int] = set()
    buf: dict[int, int] = {}
    handed = set(pairs.values())  # inputs whose buffer goes on to an in-place output
    for t in sorted(set(by_start) | set(by_end)):
        born = sorted(by_start.get(t, []), key=lambda v: (-v.size, v.id))
        for v in born:  # in-place first: the output takes its dying input's buffer
            if v.id in pairs:
                buf[v.id] = buf[pairs[v.id]]
                sizes[buf[v.id]] = max(sizes[buf[v.id]], v.size)
        for v in born:
            if v.id in pairs:
                continue
            fit = [x for x in free if sizes[x] >= v.size]
            if fit:
                x = min(fit, key=lambda x: (sizes[x], x))
            elif free:  # grow the largest free buffer: cheaper than a new one
                x = max(free, key=lambda x: (sizes[x], -x))
                sizes[x] = v.size
            else:
                x = len(sizes)
                sizes.append(v.size)
            free.discard(x)
            buf[v.id] = x
        for v in by_end.get(t, []):
            if v.id not in handed:
                free.add(buf[v.id])
    offsets, off = [], 0
    for s in sizes:
        offsets.append(off)
        off += s
    return buf, {v: offsets[x] for v, x in buf.items()}, sizes


def allocate(plan: Plan, graph: Graph, method: str = "greedy_by_size", *,
             inplace: InplaceRule | None = None, free_at: str = "delete",
             lv: Liveness | None = None, restarts: int = 0) -> AllocationReport:
    """Assign every value of `plan` an offset in one arena with `method` (see `METHODS`).

    `inplace`: which compute nodes may reuse a dying input in place (True: all; a collection of
    node names; a predicate). Default: True for method ``inplace``, off for the others.
    `lv`: a `liveness` result to reuse (its `free_at` wins). `restarts` (``greedy_by_size``
    only): extra seeded orders to try, keeping the smallest arena (see `_greedy_by_size`).
    """
    if method not in METHODS:
        raise ValueError(f"unknown allocation method {method!r} (one of {', '.join(METHODS)})")
    if lv is None:
        lv = liveness(plan, graph, free_at=free_at)
    return allocate_values(lv, method, inplace=inplace, restarts=restarts)


def allocate_values(lv: Liveness, method: str = "greedy_by_size", *,
                    inplace: InplaceRule | None = None, restarts: int = 0) -> AllocationReport:
    """`allocate` on a solved `Liveness`."""
    if method not in METHODS:
        raise ValueError(f"unknown allocation method {method!r} (one of {', '.join(METHODS)})")
    if inplace is None:
        inplace = method == "inplace"
    pairs = inplace_pairs(lv, inplace) if inplace is not False else {}
    values = lv.values
    plain = max_live(values)

    # in-place chains share one buffer: merge them into groups (root: the chain's first value)
    root = {v.id: v.id for v in values}
    for o in sorted(pairs, key=lambda o: values[o].start):
        root[o] = root[pairs[o]]
    groups: dict[int, list[Value]] = {}
    for v in values:
        groups.setdefault(root[v.id], []).append(v)
    merged = [Value(r, values[r].name, "group", values[r].key, max(v.size for v in vs),
                    min(v.start for v in vs), max(v.end for v in vs))
              for r, vs in groups.items()]
    bound = max_live(merged) if pairs else plain

    buffer_of: dict[int, int] = {}
    nbuf = None
    if method == "greedy_by_size":
        offs, arena = _greedy_by_size([(g.id, g.size, g.start, g.end) for g in merged],
                                      restarts=restarts)
        offset = {v.id: offs[root[v.id]] for v in values}
    else:
        buffer_of, offset, sizes = _pool(values, pairs)
        arena = sum(sizes)
        nbuf = len(sizes)
    assignments = [Assignment(v.name, v.kind, v.size, v.start, v.end, offset[v.id],
                              buffer_of.get(v.id),
                              values[pairs[v.id]].name if v.id in pairs else None)
                   for v in values]
    return AllocationReport(arena_bytes=arena, max_live_bytes=bound, method=method,
                            assignments=assignments, plain_max_live=plain, buffers=nbuf,
                            inplace_reuses=len(pairs))


def allocate_all(plan: Plan, graph: Graph, *, free_at: str = "delete",
                 inplace: InplaceRule = True, restarts: int = 0) -> tuple[Liveness, list[AllocationReport]]:
    """The liveness and one report per method in `METHODS` (``inplace`` uses `inplace`;
    ``greedy_by_size`` tries `restarts` perturbed orders after the plain one)."""
    lv = liveness(plan, graph, free_at=free_at)
    reports = [allocate_values(lv, m, inplace=inplace if m == "inplace" else False,
                               restarts=restarts if m == "greedy_by_size" else 0)
               for m in METHODS]
    return lv, reports


def conflicts(assignments: list[Assignment]) -> list[str]:
    """Pairs of values that are live at the same op and share bytes, except an in-place output
    and the input it took over at the op where one is born and the other dies. Empty: sound.
    """
    out: list[str] = []
    items = sorted((a for a in assignments if a.size > 0), key=lambda a: a.start)
    for i, a in enumerate(items):
        for b in items[i + 1:]:
            if b.start > a.end:
                break
            if b.offset >= a.offset + a.size or a.offset >= b.offset + b.size:
                continue
            lo, hi = max(a.start, b.start), min(a.end, b.end)
            if lo == hi and ((b.inplace_of == a.value and a.end == b.start) or
                             (a.inplace_of == b.value and b.end == a.start)):
                continue
            out.append(f"{a.value} [{a.start}, {a.end}] at [{a.offset}, {a.offset + a.size}) "
                       f"overlaps {b.value} [{b.start}, {b.end}] at "
                       f"[{b.offset}, {b.offset + b.size})")
    return out


# --- the CLI's view ------------------------------------------------------------------------
def summary(plan: Plan, graph: Graph, *, free_at: str = "delete", restarts: int = 0) -> dict:
    """What ``schedlang simulate --allocator`` reports, as JSON-ready data.

    ``{"free_at", "max_live_bytes", "max_live_at", "values", "methods": [report.to_json()]}``,
    or ``{"error": message}`` when the plan does not replay (budgets aside).
    """
    try:
        lv, reports = allocate_all(plan, graph, free_at=free_at, restarts=restarts)
    except DataError as exc:
        return {"error": exc.message}
    return {"free_at": free_at, "max_live_bytes": lv.max_live_bytes,
            "max_live_at": lv.max_live_at, "values": len(lv.values),
            "methods": [r.to_json() for r in reports]}


def format_summary(s: dict) -> str:
    if "error" in s:
        return f"allocator: {s['error']}"
    at = s["max_live_at"]
    where = "at the start" if at < 0 else f"at op {at}"
    lines = [f"allocator: max-live {format_size(s['max_live_bytes'])} ({s['max_live_bytes']} B, "
             f"{where}; the lower bound), {s['values']} values"]
    for m in s["methods"]:
        line = (f"  {m['method']:<15} arena {format_size(m['arena_bytes'])} ({m['arena_bytes']} B,"
                f" {100 * m['fragmentation']:+.2f}% over its bound")
        if m["max_live_bytes"] != s["max_live_bytes"]:
            line += f" {format_size(m['max_live_bytes'])}"
        if m.get("inplace_reuses"):
            line += f"; {m['inplace_reuses']} in-place reuses"
        lines.append(line + ")")
    return "\n".join(lines)
