"""A probe step measures this model's step: what CUDA's allocator counts (everything alive),
less what was alive before `fit` began and is neither the model's, its samples' nor its loss's
(`Prepared.others`). Without that, a second model fitted while a first one lives read the first
one's bytes as its own step measuring over its prediction, and `fit` failed (FitError) at
budgets it meets."""
from __future__ import annotations

import gc

import pytest

torch = pytest.importorskip("torch")

from schedlang.pytorch.fit import fit  # noqa: E402
from schedlang.pytorch.probing import probe_step  # noqa: E402
from schedlang.testing.torch_models import make_gpt  # noqa: E402

SIZES = dict(batch=4, context=32, dim=32, heads=4, layers=4, vocab=128)


def _probe(fm, inputs, loss_fn, others) -> int:
    prep = fm._prep
    return probe_step(fm.module, inputs, {}, loss_fn, 0, prep.output_bytes, run=fm._call,
                      outputs_held=prep.outputs_held, others=others)


@pytest.mark.parametrize("frontend", ["fx", "blocks"])
def test_a_model_alive_beside_does_not_count_as_this_models_step(frontend):
    first, first_inputs, first_loss = make_gpt(**SIZES, seed=1)
    fitted_first = fit(first, first_inputs, "60%", loss_fn=first_loss, frontend=frontend,
                       op_options=False)
    first_loss(fitted_first(*first_inputs)).backward()  # its gradients alive too

    model, inputs, loss_fn = make_gpt(**SIZES, seed=2)
    fm = fit(model, inputs, "60%", loss_fn=loss_fn, frontend=frontend, probe=True,
             op_options=False)
    assert fm.plan is not None
    beside = _probe(fm, inputs, loss_fn, fm._prep.others_still_alive())
    assert beside <= fm.memory_report().budget_bytes
    # the same step measured with everything alive counted is the first model's bytes higher
    first_bytes = sum(t.untyped_storage().nbytes() for t in
                      [*first.parameters(), *(p.grad for p in first.parameters())])
    assert _probe(fm, inputs, loss_fn, []) >= beside + first_bytes

    del fitted_first, first, first_inputs, first_loss
    gc.collect()
    assert _probe(fm, inputs, loss_fn, fm._prep.others_still_alive()) == beside


def test_what_a_step_leaves_alive_after_fit_began_still_counts():
    """`others` is taken when `fit` begins: a tensor the caller (or a leaking step) makes
    later is counted by every probe step."""
    model, inputs, loss_fn = make_gpt(**SIZES)
    fm = fit(model, inputs, "60%", loss_fn=loss_fn, frontend="fx", op_options=False)
    others = fm._prep.others_still_alive()
    before = _probe(fm, inputs, loss_fn, others)
    made_later = torch.zeros(64 * 1024)  # 256 KiB alive through the next step
    assert _probe(fm, inputs, loss_fn, fm._prep.others_still_alive()) \
        == before + made_later.untyped_storage().nbytes()
