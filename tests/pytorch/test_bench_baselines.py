"""`bench/bench_baselines.py`'s own accounting, on models it was not tuned on: the floor is a
floor (no measured schedule goes below it), each stack of blocks is one container's, and a
CUDA run without CUDA is a clear exit. The bench's speed targets are not tested here (they
are ratios measured side by side, `bench/README.md`)."""
from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

from tests.paths import ROOT

pytest.importorskip("transformers")

TINY = {"batch": 2, "seq": 16, "layers": 2, "dim": 32}


@pytest.fixture(scope="module")
def bench():
    path = ROOT / "bench" / "bench_baselines.py"
    spec = importlib.util.spec_from_file_location("bench_baselines", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_encoder_and_decoder_blocks_of_one_class_are_two_stacks(bench):
    """T5's encoder and decoder blocks share a class: `checkpoint_sequential` runs on each
    stack alone (a group across them cannot run: the decoder does not take the encoder's
    last block's output)."""
    from schedlang.pytorch.frontends.blocks.find import find_blocks

    model, args, kwargs, _ = bench.FACTORIES["t5"](**TINY)
    found = find_blocks(model, args, kwargs)
    found.release_samples()
    stacks = bench.stacks_of(found)
    assert [[n.rpartition(".")[0] for n in s] for s in stacks] == [
        ["encoder.block"] * 2, ["decoder.block"] * 2]
    choices = bench.sequential_choices(stacks, 2)
    assert set(choices) == {"encoder.block.0", "decoder.block.0"}


@pytest.mark.parametrize("name", ["opt", "distilbert"])
def test_the_floor_is_below_every_measured_schedule(bench, name):
    """The physical floor (`floor_bytes`) lies at or below the measured peak of per-block
    checkpointing, the schedule that reaches the fixed options' least working set (a layer's
    parameter gradients were counted twice: OPT's floor was above that peak)."""
    from schedlang.pytorch.fit import prepare

    make = bench.maker(name, dict(TINY, batch=4, seq=32))
    model, args, kwargs, loss_fn = make()
    prep = prepare(model, args, loss_fn=loss_fn, sample_kwargs=kwargs, frontend="blocks",
                   repeats=1, block_options=False)
    floor, where = bench.floor_bytes(prep, model)
    inputs = bench.tensors_of(args, kwargs)
    held = bench.loss_bytes_of(model, args, kwargs, loss_fn)
    methods = bench.baselines(make, args, kwargs)
    peaks = {k: bench.peak_of(lambda m=m: m(*args, **kwargs), owner, inputs, loss_fn, held)
             for k, (m, owner) in methods.items()}
    assert where
    assert floor <= min(peaks.values())
    assert peaks["ckpt-block"] < peaks["plain"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message for a machine without CUDA")
def test_a_cuda_run_without_cuda_exits_2(bench, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["bench_baselines.py", "--device", "cuda",
                                      "--models", "gpt2-124m"])
    assert bench.main() == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_models_the_bench_cannot_build_on_cuda_are_named(bench, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(sys, "argv", ["bench_baselines.py", "--device", "cuda",
                                      "--models", "bert", "gpt2-124m"])
    assert bench.main() == 2
    err = capsys.readouterr().err
    assert "bert build on the CPU only" in err and "gpt2-124m" in err.split("on CUDA:")[1]
