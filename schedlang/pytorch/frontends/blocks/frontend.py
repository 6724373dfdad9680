"""The hook front end: the model's blocks found from its module tree and one hooked run
(`find`), profiled as layers (`hooked.trace_blocks`), and wrapped in place to run a plan's
per-block choices or checkpointed groups (`hooked.BlockWrappers`)."""
from __future__ import annotations

import logging

from ....language.errors import SchedError
from ...frontend import Frontend, Runner
from ...lifetimes import earliest_deletes
from ...model_state import own_checkpointing
from .families import group_plans, least_memory_plans
from .hooked import BLOCK_GROUPS, PER_BLOCK, BlockWrappers, block_partition, offload_profiles, trace_blocks
from .offload import with_offload_options
from .plan_reading import early_stops, plan_choices, rerun_correction

__all__ = ["BlocksFrontend", "BlockRunner", "BLOCKS"]

log = logging.getLogger("schedlang.pytorch")


class BlockRunner(Runner):
    """Applies each plan's choices to the model's wrapped blocks; the model's own forward
    runs."""

    in_place = True

    def __init__(self, prep):
        self.graph = prep.graph
        self.blocks = [b.name for b in prep.partitioned.found.blocks]
        self.wrappers = BlockWrappers(prep.partitioned.found)

    def set_plan(self, plan, on_error) -> None:
        self.wrappers.set(None if plan is None else plan_choices(plan, self.graph, self.blocks))

    def call(self, module, args: tuple, kwargs: dict):
        self.wrappers.ensure()  # another fit of this model may have set its own plan
        return module(*args, **kwargs)

    def ensure(self) -> None:
        self.wrappers.ensure()

    def unwrap(self) -> None:
        self.wrappers.unwrap()


class BlocksFrontend(Frontend):
    name = "blocks"
    groups = True
    probes_by_default = True
    replans_on_probe_excess = True

    def prepare(self, model, args: tuple, kwargs: dict, layers, graph, *, offload: bool,
                trace_kwargs: dict, block_options=False) -> tuple:
        with BlockWrappers.plain(model):  # a model an earlier fit wrapped: profiled plain
            tr = trace_blocks(model, args, kwargs, layers, offload=offload,
                              op_options=block_options, **trace_kwargs)
        if own_checkpointing(model):
            log.warning("schedlang fit: the model's own gradient checkpointing is on; it is "
                        "off while the model is fitted (the plan decides what is recomputed; "
                        "unwrap() turns it back on)")
        if tr.found.not_called:
            log.warning("schedlang fit: %d block(s) of %s's stack (%s) did not run in the "
                        "recorded forward (LayerDrop skips layers at random in training?): "
                        "they are not planned, and a step that runs them may measure above "
                        "the prediction (the first such step re-plans with the excess as a "
                        "margin; layerdrop=0 in the config plans every layer)",
                        len(tr.found.not_called), type(model).__name__,
                        ", ".join(tr.found.not_called))
        if tr.found.shared:
            name, calls = tr.found.shared[0]
            log.warning("schedlang fit: %s's submodule '%s' runs %d times per forward (shared "
                        "weights): a module called more than once cannot be a block, so the "
                        "blocks are the model's children (%s), and the plan's memory savings "
                        "are coarse", type(model).__name__, name, calls,
                        ", ".join(b.name for b in tr.found.blocks))
        if tr.found.cache_dropped:
            log.warning("schedlang fit: %d block(s) (%s ...) were called with a key/value "
                        "cache; in training they run without it, as transformers' gradient "
                        "checkpointing does, and the model's output carries an empty cache "
                        "(set config.use_cache=False to silence this)",
                        len(tr.found.cache_dropped), tr.found.cache_dropped[0])
        return tr.graph, tr

    def extensions(self, groups: bool = True) -> tuple:
        # the wrappers run per-block plans (per_block.sched) and checkpointed groups of blocks
        # (block_groups.sched, which extends it)
        return (BLOCK_GROUPS,) if groups else (PER_BLOCK,)

    def with_link(self, prep, link):
        """Each block gets the option ``offload`` (`offload.with_offload_options`), measured
        when the blocks were profiled (`prepare(..., offload=True)`) or on first use."""
        tr = prep.partitioned
        if tr.offload is None:
            if not tr.found.values:  # the sample values were released after the profile
                raise SchedError("fit(bandwidth=...) of a hook-front-end model needs its "
                                 "blocks' option offload measured: prepare(..., offload=True)")
            offload_profiles(tr, block_partition(tr.found))
        return with_offload_options(prep.graph, offload_profiles(tr), link)

    def runtime_frees(self, plan, prep):
        return earliest_deletes(plan, prep.graph)  # the model's own code frees every datum

    def time_correction(self, plan, graph) -> float:
        return rerun_correction(plan, graph)  # a group's reruns, priced as recomputations

    def priced_graph(self, plan, graph):
        return early_stops(plan, graph)  # a group's last block, as torch's checkpoint stops

    def group_plans(self, prep) -> list:
        blocks = [b.name for b in prep.partitioned.found.blocks]
        return [*least_memory_plans(prep.graph, blocks), *group_plans(prep.graph, blocks)]

    def runner(self, prep) -> Runner:
        return BlockRunner(prep)


BLOCKS = BlocksFrontend()
