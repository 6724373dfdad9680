"""Memory over a training step (schedlang.pytorch.timeline, `schedlang run --plot/--trace`).

The predicted series is the simulator's replay of the plan, op by op; the measured series is
the runtime's tracker at op boundaries, whose largest value is the step's measured peak; the
plot and the Chrome trace are written, readable, and carry what they claim.
"""
from __future__ import annotations

import json

import pytest

from schedlang.plans.simulate import replay, simulate

from ..offload_cases import linked_plan
from ..paths import EXAMPLES

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

from schedlang.testing.steps import fit_step  # noqa: E402
from schedlang.testing.torch_models import ALL, make_mlp  # noqa: E402


# --- the simulator's per-op record -----------------------------------------------------------
@pytest.mark.parametrize("name", ["transformer6_offload.sched", "unet.sched", "chain.sched"])
def test_replay_records_memory_and_time_per_op(name):
    import schedlang
    from schedlang.plans.plan import Plan

    from ..paths import DATA

    prob = schedlang.load(str(EXAMPLES / name))
    # a plan with transfers: pinned (a solve under a time limit may find none on a loaded
    # machine)
    plan = prob.plan("no_recompute").plan if "offload" not in name else \
        Plan.load(DATA / "plans" / "transformer6_offload.json")
    graph = prob.graph
    plain, rec = replay(plan, graph), replay(plan, graph, record=True)
    assert plain.steps is None and len(rec.steps) == len(plan.ops)
    # recording changes nothing the replay reports
    assert (rec.peak, rec.time, rec.save_peak) == (plain.peak, plain.time, plain.save_peak)
    assert max(s.peak for s in rec.steps) == simulate(plan, graph).peak_bytes
    assert rec.steps[-1].end == rec.time
    for s, nxt in zip(rec.steps, rec.steps[1:]):
        assert s.peak >= s.after and nxt.start == s.end
        assert nxt.peak >= s.after  # an op starts from the memory the previous one left


# --- the tracker's windows ---------------------------------------------------------------------
def test_tracker_mark_gives_the_peak_of_each_window():
    from schedlang.pytorch.memory import MemoryTracker

    x = torch.zeros(1000)
    with MemoryTracker(resident=[x]) as mt:
        a = x * 2
        b = a * 2
        del a
        w1 = mt.mark()
        c = b + 1
        del c
        w2 = mt.mark()
        assert mt.peak == mt.baseline + 8000
    assert w1 == (mt.baseline + 8000, mt.baseline + 4000)
    assert w2 == (mt.baseline + 8000, mt.baseline + 4000)  # b and c, then b
    del b


# --- a fitted module's timeline ----------------------------------------------------------------
@pytest.fixture  # per test: a model kept for the module would be memory later steps count
def gpt():
    from schedlang.pytorch.fit import prepare

    model, inputs, loss_fn = ALL["gpt"](batch=8, context=64, layers=4)
    return model, inputs, loss_fn, prepare(model, inputs, loss_fn=loss_fn, repeats=1)


@pytest.mark.parametrize("bandwidth", [None, "inf"])
def test_timeline_of_a_fitted_step(gpt, bandwidth, tmp_path):
    from schedlang.pytorch.fit import fit

    model, inputs, loss_fn, prep = gpt
    # with a link, the solver's offloading plan (fit keeps it only where it is faster than
    # recomputation alone)
    plan = None if bandwidth is None else linked_plan(prep, "50%", bandwidth)
    fm = fit(model, inputs, "50%", loss_fn=loss_fn, prepared=prep, bandwidth=bandwidth,
             calibrate=False, plan=plan)
    assert fm.timeline() is None
    fm.record_timeline()
    fit_step(fm, model, inputs, loss_fn)
    tl = fm.timeline()
    rep = fm.memory_report()
    ops = fm.plan.ops
    assert len(tl.labels) == len(tl.predicted_peak) == len(tl.measured_peak) == len(ops)
    # predicted: the simulator's replay of the plan plus the resident bytes; at the loss, the
    # loss function's memory on top of what the plan holds then
    steps = replay(fm.plan, fm.graph, record=True).steps
    loss = tl.loss_index
    assert ops[loss].node == "loss"
    resident = rep.resident_bytes
    for k, s in enumerate(steps):
        want = s.peak if k != loss else max(s.peak, s.after + rep.loss_bytes)
        assert tl.predicted_peak[k] == want + resident
        assert tl.predicted_after[k] == s.after + resident
    assert max(tl.predicted_peak) == rep.predicted_peak_bytes
    # measured: per op; the largest is the step's measured peak
    assert max(tl.measured_peak) == rep.measured_peak_bytes == tl.measured_step_peak
    assert all(p >= a for p, a in zip(tl.measured_peak, tl.measured_after))
    assert all(s <= e for s, e in zip(tl.start, tl.end))
    assert all(e <= s for e, s in zip(tl.end, tl.start[1:]))
    assert tl.budget_bytes == rep.budget_bytes

    trace = tl.chrome_trace()
    json.dumps(trace)
    events = trace["traceEvents"]
    tracks = {e["args"]["name"]: e["tid"] for e in events
              if e["name"] == "thread_name" and e["pid"] == 1}
    assert set(tracks) == {"compute", "offload (device -> host)", "prefetch (host -> device)"}
    complete = [e for e in events if e["ph"] == "X" and e["pid"] == 1]
    assert [e["args"]["op"] for e in complete] == list(range(len(ops)))
    # the plan as the simulator times it from the profile: a process of its own
    planned = [e for e in events if e["ph"] == "X" and e["pid"] == 2]
    assert planned and all(e["cat"] == "predicted" for e in planned)
    for e in planned:
        s = steps[e["args"]["op"]]
        assert e["ts"] == pytest.approx(1e6 * s.start) and \
            e["dur"] == pytest.approx(1e6 * (s.end - s.start))
    by_track = {tid: [e for e in complete if e["tid"] == tid] for tid in tracks.values()}
    offloads = sum(op.op == "offload" for op in ops)
    prefetches = sum(op.op == "prefetch" for op in ops)
    assert len(by_track[tracks["offload (device -> host)"]]) == offloads
    assert len(by_track[tracks["prefetch (host -> device)"]]) == prefetches
    assert (offloads > 0) == (bandwidth is not None)
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert {"memory measured (MiB)", "memory predicted (MiB)", "budget (MiB)"} <= counters
    measured = [e["args"]["MiB"] for e in events if e["name"] == "memory measured (MiB)"]
    assert max(measured) == rep.measured_peak_bytes / 2**20

    _check_files(tl, tmp_path)


def _check_files(tl, tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.image

    png, js = tmp_path / "memory.png", tmp_path / "trace.json"
    tl.plot(png)
    tl.write_trace(js)
    assert json.loads(js.read_text())["traceEvents"]
    img = matplotlib.image.imread(png)
    assert img.shape[0] > 300 and img.shape[1] > 600
    # not a blank canvas: the series' colours are drawn
    colours = {tuple((px[:3] * 255).round().astype(int)) for px in img.reshape(-1, img.shape[2])}
    assert len(colours) > 50
    assert (31, 119, 180) in colours or any(abs(r - 31) + abs(g - 119) + abs(b - 180) < 30
                                            for r, g, b in colours)  # tab:blue


def test_timeline_of_plain_execution(tmp_path):
    from schedlang.pytorch.fit import fit

    model, inputs, loss_fn = make_mlp(batch=256, width=32, depth=2)
    fm = fit(model, inputs, "150%", loss_fn=loss_fn, repeats=1)
    assert fm.plain
    fm.record_timeline()
    fit_step(fm, model, inputs, loss_fn)
    tl = fm.timeline()
    rep = fm.memory_report()
    assert tl.plain and tl.measured_peak is None
    assert tl.measured_step_peak == rep.measured_peak_bytes
    assert max(tl.predicted_peak) == rep.predicted_peak_bytes  # the no-recomputation plan's
    _check_files(tl, tmp_path)


# --- the command -------------------------------------------------------------------------------
def test_run_plot_and_trace(tmp_path, capsys):
    from schedlang.language.errors import SchedError

    from .run_command import RunCommand

    pytest.importorskip("matplotlib")
    command = RunCommand(tmp_path, "from schedlang.testing.torch_models import make_mlp\n"
                         "def small():\n    return make_mlp(batch=512, width=64, depth=2)\n")

    def run(*argv):
        return command.quick("small", *argv)

    png, js = tmp_path / "m.png", tmp_path / "t.json"
    assert run("--budget", "90%", "--json", "--plot", str(png), "--trace", str(js)) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["plot"] == str(png) and out["trace"] == str(js)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    events = json.loads(js.read_text())["traceEvents"]
    assert sum(e["ph"] == "X" and e["pid"] == 1 for e in events) == out["plan_ops"]
    # the trace is the last step; the JSON's measured peak may be another step's, which can
    # differ by a scalar (the loss value of a step)
    traced = max(e["args"]["MiB"] for e in events if e["name"] == "memory measured (MiB)")
    assert abs(traced * 2**20 - out["measured_peak_bytes"]) <= 64
    for argv, message in [
            (("--plot", str(tmp_path / "no" / "m.png")), "cannot write the plot to .* folder"),
            (("--trace", str(tmp_path / "no" / "t.json")), "cannot write the trace to .* folder"),
            (("--trace", str(tmp_path)), "it is a folder"),
            (("--plot", str(tmp_path)), "it is a folder"),
            (("--plot", str(png), "--trace", str(png)), "the same file")]:
        with pytest.raises(SchedError, match=message) as info:
            run(*argv)
        assert info.value.loc.path in ("--plot", "--trace")


@pytest.mark.gpu  # skipped without CUDA (conftest.py)
def test_timeline_on_cuda_shows_the_transfer_channels(tmp_path):
    """On CUDA: op times from CUDA events (transfers on their side streams), memory from the
    allocator; the per-op peaks' largest is the step's max_memory_allocated. (The model, its
    inputs and the loss's targets on the device.)"""
    from schedlang.pytorch.fit import fit, prepare

    model, inputs, loss_fn = ALL["gpt"](batch=16, context=128, layers=4, device="cuda")
    prep = prepare(model, inputs, loss_fn=loss_fn, repeats=3)
    fm = fit(model, inputs, "50%", loss_fn=loss_fn, prepared=prep, bandwidth="16GB/s",
             calibrate=False, op_options=False, plan=linked_plan(prep, "50%", "16GB/s"))
    fm.record_timeline()
    fit_step(fm, model, inputs, loss_fn)
    tl = fm.timeline()
    assert tl.device.startswith("cuda")
    assert max(tl.measured_peak) == fm.memory_report().measured_peak_bytes
    events = tl.chrome_trace()["traceEvents"]
    tids = {e["tid"] for e in events if e["ph"] == "X" and e["pid"] == 1}
    assert {1, 2, 3} <= tids
    _check_files(tl, tmp_path)
