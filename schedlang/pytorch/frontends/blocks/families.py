"""The hook front end's heuristic plans: the solve's warm start and fallback, and the bound of
the smallest feasible budget `fit` names (`planning.group_plans_priced` prices them).

* `least_memory_plans`: plans without groups at the low end of memory (every block
  recomputed, every block at its least-memory option, a descent over the blocks' options);
* `group_plans`: checkpointed groups of consecutive blocks (`plan_reading.block_chains`),
  checkpoint_sequential's schedule among them.

Every plan is `planners.baselines.plan_checkpoint_groups`' (torch's own order, step for step)
and lies in the space of models/extensions/block_groups.sched.
"""
from __future__ import annotations

import math

from ....graphs.graph import Graph
from ....graphs.hgraph import FAST_FORWARD
from ....plans.planners.baselines import plan_checkpoint_groups
from ....plans.simulate import simulate
from .plan_reading import block_chains

__all__ = ["group_plans", "least_memory_plans"]


#: about this many group plans at most are priced per model (`group_plans`: 1–3 ms each;
#: a 48-block GPT-2 prices about 1,600 in 4 s)
MAX_GROUP_PLANS = 1000


def group_plans(graph: Graph, blocks: list[str], limit: int = MAX_GROUP_PLANS):
    """Plans with checkpointed groups of blocks (`planners.baselines.plan_checkpoint_groups`),
    the family `checkpoint_sequential` belongs to: in each chain (`block_chains`), c groups of
    L >= 2 consecutive blocks from its start, or from the start of a stack in it
    (`_from_stacks`); the r blocks after them recompute
    (``recompute``), the s after those keep selectively (``selective``), the rest keep all
    (the last blocks' backward comes first, so keeping them costs the least), for every r, s
    (on a coarser grid when there are more than `limit` plans); and, with several chains, the
    same L in every chain, the other blocks plain. They are all in the space of
    models/extensions/block_groups.sched: the solve's warm start and fallback."""
    from torch.utils import checkpoint as torch_checkpoint

    if not hasattr(torch_checkpoint, "_checkpoint_without_reentrant_generator"):
        return  # a torch without the checkpoint `groups.Group` opens across calls: no group plans
    whole = block_chains(graph, blocks)
    chains = [part for chain in whole for part in _from_stacks(chain)]
    has = {lay.name: {o.name for o in lay.options} for lay in graph.layers}
    arrangements = [(chain, size, count) for chain in chains
                    for size in range(2, len(chain) + 1)  # a group of one: `recompute`
                    for count in range(1, len(chain) // size + 1)]
    total = sum((m + 1) * (m + 2) // 2 for m in (len(c) - s * n for c, s, n in arrangements))
    stride = max(1, math.ceil(math.sqrt(total / max(1, limit))))
    for chain, size, count in arrangements:
        groups = [chain[k * size:(k + 1) * size] for k in range(count)]
        rest = chain[size * count:]
        steps = sorted({*range(0, len(rest) + 1, stride), len(rest)})
        for r in steps:
            for s in (x for x in steps if r + x <= len(rest)):
                options = {b: "recompute" for b in rest[:r]}
                options.update((b, "selective") for b in rest[r:r + s])
                if any(o not in has[b] for b, o in options.items()):
                    continue
                name = f"groups of {size} block(s) x{count} from {chain[0]}"
                if r or s:
                    name += f", then {r} recompute, {s} selective"
                yield plan_checkpoint_groups(graph, groups, options, name=name)
    if len(whole) > 1:
        for size in range(2, max(map(len, whole)) + 1):
            groups = [c[k * size:(k + 1) * size] for c in whole for k in range(len(c) // size)]
            if groups:
                yield plan_checkpoint_groups(graph, groups,
                                             name=f"groups of {size} block(s) in every chain")


def _from_stacks(chain: list[str]) -> list[list[str]]:
    """`chain`, and its tail from the first block of each stack in it after its start (a run
    of two blocks or more of one container: ``vit.layers.*`` after ``vit.embeddings``): the
    groups of `group_plans` start there too, as checkpoint_sequential over the stack does."""
    parents = [b.rpartition(".")[0] for b in chain]
    starts = [k for k in range(1, len(chain) - 1)
              if parents[k] != parents[k - 1] and parents[k] == parents[k + 1]]
    return [chain] + [chain[k:] for k in starts]


#: passes of `least_memory_plans`' descent over the blocks' options (each pass tries every
#: other option of every block, and of every chain of blocks together, once; it stops at a
#: pass that lowers nothing)
DESCENT_PASSES = 3


def least_memory_plans(graph: Graph, blocks: list[str]):
    """The low end of the heuristic family, plans without groups: every block ``recompute``
    (per-block checkpointing's schedule), every block at its least-memory option (the least
    it keeps to its backward, then the least its backward adds), and from the lower of the
    two a descent: one block's option changed, or one option for every block of a chain,
    kept when the replayed peak drops (a generated op-level option that keeps a little may
    hold much less than ``recompute`` in its backward: T5's decoder blocks, 0.13 MB kept for
    1.8 MB less in each backward). The group family alone (a group in one chain, the other
    chains plain) does not reach there on a model of several chains (T5's encoder and
    decoder), and a cold solve with generated options may find no plan near the least budget
    in its time (T5 at per-block checkpointing's peak: none in 10 s; from this start at
    once): they are the solve's start and fallback where no group plan fits, and bound the
    smallest feasible budget `fit` names."""
    layers = {lay.name: lay for lay in graph.layers}
    present = [b for b in blocks if b in layers]
    options = {b: [o for o in layers[b].options if o.name != FAST_FORWARD] for b in present}
    runnable = {b: [o.name for o in options[b]] for b in present}
    if not present or not all(runnable.values()):
        return

    def peak(choice: dict[str, str]) -> float:
        sim = simulate(plan_checkpoint_groups(graph, [], choice), graph)
        return sim.peak_bytes if sim.valid else math.inf

    starts: list[tuple[dict[str, str], str]] = []
    if all("recompute" in runnable[b] for b in present):
        starts.append((dict.fromkeys(present, "recompute"), "every block recomputed"))
    least = {b: min(options[b], key=lambda o: (o.phantom, max(o.bwd_overhead, 0))).name
             for b in present}
    if all(least != c for c, _ in starts):
        starts.append((least, "every block at its least-memory option"))
    best, low = min(((c, peak(c)) for c, _ in starts), key=lambda cp: cp[1])
    # moves: one block's option, or one option for every block of a chain (or of the model)
    # that has it: the blocks' backward peaks are level where each recomputes, and what one
    # block keeps to lower its own raises the others', so only the chain together goes lower
    sets = [[b] for b in present] + [c for c in block_chains(graph, present) if len(c) > 1]
    if len(present) > 1:
        sets.append(present)
    for _ in range(DESCENT_PASSES):
        lowered = False
        for members in sets:
            for name in sorted({n for b in members for n in runnable[b]}):
                trial = {**best, **{b: name for b in members if name in runnable[b]}}
                if trial == best:
                    continue
                p = peak(trial)
                if p < low:
                    best, low, lowered = trial, p, True
        if not lowered:
            break
    for choice, name in starts:
        yield plan_checkpoint_groups(graph, [], choice, name=name)
    if all(best != c for c, _ in starts):
        yield plan_checkpoint_groups(graph, [], best, name="the least peak of a descent over "
                                     "the blocks' options")
