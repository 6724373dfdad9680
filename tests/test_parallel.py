"""`schedlang.parallel.run_jobs`: the same results as a serial loop, in the items' order, from
worker processes or Ray; a failing job reported with its item and location; Ctrl-C stops the
workers."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from schedlang.language.errors import SchedError
from schedlang.parallel import JobError, default_jobs, run_jobs

from . import parallel_jobs as jobs
from .paths import ROOT


def test_workers_give_the_serial_results_in_the_items_order():
    items = list(range(10))
    seen = []
    serial = run_jobs(jobs.square_late, items, kwargs={"scale": 3}, jobs=1)
    parallel = run_jobs(jobs.square_late, items, kwargs={"scale": 3, "delay": 0.05}, jobs=2,
                        on_result=lambda k, item, res: seen.append((k, item)))
    assert [r for r, _ in parallel] == [r for r, _ in serial] == [3 * i * i for i in items]
    assert {pid for _, pid in serial} == {os.getpid()}  # jobs=1: in this process
    pids = {pid for _, pid in parallel}
    assert os.getpid() not in pids and 1 <= len(pids) <= 2
    assert sorted(seen) == [(k, k) for k in items]  # each result reported once, as it came


@pytest.mark.parametrize("n", [1, 2])
def test_jobs_no_longer_needed_are_not_started(n, tmp_path, monkeypatch):
    """Item 0 drops items 6..9. Items 1.. wait behind a gate that opens only once the parent
    has handled item 0's result (its next wait for results), so the dropped items are
    still queued, not started, whatever the machine's load: no sleep orders the events."""
    import schedlang.parallel as parallel

    gate = tmp_path / "gate"
    if n == 1:
        gate.write_text("open")  # in this process: item 0 runs first anyway
    real_wait = parallel.wait
    waits = []

    def wait(*args, **kwargs):
        waits.append(1)
        if len(waits) == 2:  # item 0 handled and its drops cancelled
            gate.write_text("open")
        return real_wait(*args, **kwargs)

    monkeypatch.setattr(parallel, "wait", wait)
    ran = []

    def drop_the_rest(k, item, result):
        ran.append(item)
        return range(6, 10) if k == 0 else ()

    out = run_jobs(jobs.after_gate, range(10), args=(str(gate),), jobs=n,
                   on_result=drop_the_rest)
    assert out == [0, 1, 2, 3, 4, 5, None, None, None, None]
    assert sorted(ran) == [0, 1, 2, 3, 4, 5]


def test_jobs_default_and_bounds():
    assert default_jobs() >= 1
    assert run_jobs(jobs.square_late, [], jobs=4) == []
    assert run_jobs(jobs.square_late, [2], jobs=4)[0][1] == os.getpid()  # one item: no pool
    with pytest.raises(SchedError, match="jobs"):
        run_jobs(jobs.square_late, [1, 2], jobs=-1)


@pytest.mark.parametrize("n", [1, 2])
def test_a_failing_job_is_reported_with_its_item_and_location(n):
    with pytest.raises(JobError) as info:
        run_jobs(jobs.fails_on_three, range(6), jobs=n)
    err = info.value
    assert err.exit_code == 5
    assert "item 3" in err.message and "ValueError: three is not allowed" in err.message
    assert err.loc.path.endswith("parallel_jobs.py") and err.loc.line > 0


@pytest.mark.parametrize("n", [1, 2])
def test_bad_input_in_a_job_keeps_its_own_location(n):
    with pytest.raises(SchedError) as info:
        run_jobs(jobs.bad_input_on_two, range(4), jobs=n)
    assert not isinstance(info.value, JobError)
    assert str(info.value).startswith("input.sched:7:3: error: item two is bad input")


SCRIPT = """
import signal, sys
# Ctrl-C raises KeyboardInterrupt here even when the suite was started in the background of a
# script, whose children inherit SIGINT ignored (POSIX), as Python then leaves it
signal.signal(signal.SIGINT, signal.default_int_handler)
from schedlang.parallel import run_jobs
from tests import parallel_jobs
print("ready", flush=True)
try:
    run_jobs(parallel_jobs.sleep_and_note, [1, 2], args=(sys.argv[1],), jobs=2)
except KeyboardInterrupt:
    sys.exit(130)
sys.exit(0)
"""


def test_a_worker_that_dies_is_a_clear_error():
    with pytest.raises(JobError, match="worker process died"):
        run_jobs(jobs.dies, range(3), jobs=2)


@pytest.mark.parametrize("broken", [True, False])
def test_a_worker_dying_while_the_next_one_starts_is_the_same_clear_error(monkeypatch, broken):
    """The race the test above can meet on a loaded machine, made to happen: the first
    worker dies while the pool starts the second, whose start then finds the pool's queue
    closed (an OSError, "handle is closed"). An OSError of a pool not broken is not this."""
    from concurrent.futures import ProcessPoolExecutor

    submit = ProcessPoolExecutor.submit

    def dies_during_the_second_start(self, fn, *a, **kw):
        if getattr(self, "_submitted", 0):
            if broken:
                self._broken = "A child process terminated abruptly"
            raise OSError("handle is closed")
        self._submitted = 1
        return submit(self, fn, *a, **kw)

    monkeypatch.setattr(ProcessPoolExecutor, "submit", dies_during_the_second_start)
    with pytest.raises(JobError if broken else OSError,
                       match="worker process died" if broken else "handle is closed"):
        run_jobs(jobs.square_late, range(3), jobs=2)


def test_a_script_without_a_main_guard_is_not_run_again_by_the_workers(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("from schedlang.parallel import run_jobs\n"
                      "from tests import parallel_jobs\n"
                      "print('top level ran', flush=True)\n"
                      "out = run_jobs(parallel_jobs.square_late, [1, 2, 3], jobs=2)\n"
                      "print([r for r, _ in out], flush=True)\n")
    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["top level ran", "[1, 4, 9]"]


@pytest.mark.skipif(not hasattr(signal, "SIGINT") or os.name != "posix", reason="POSIX signals")
def test_ctrl_c_stops_the_workers(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(tmp_path)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("*.pid"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        pids = [int(p.stem) for p in tmp_path.glob("*.pid")]
        assert len(pids) == 2, "the workers did not start"
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C at a terminal does
        # it stops (a hang is what this bound catches: 30 s was too short on a loaded machine)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    deadline = time.monotonic() + 60  # the workers were told to stop: wait until they have
    while time.monotonic() < deadline and any(_running(pid) for pid in pids):
        time.sleep(0.05)
    for pid in pids:  # no worker left running
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        with open(f"/proc/{pid}/stat") as f:  # only a zombie awaiting its parent may remain
            assert f.read().split()[2] == "Z", f"worker {pid} still runs"


def _running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie awaiting its parent."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow  # a local Ray instance takes 10-30 s to start
def test_on_ray_the_same_results_and_errors():
    pytest.importorskip("ray")
    items = list(range(6))
    got = [r for r, _ in run_jobs(jobs.square_late, items, kwargs={"scale": 2}, ray="")]
    assert got == [2 * i * i for i in items]
    with pytest.raises(JobError) as info:
        run_jobs(jobs.fails_on_three, items, ray="")
    assert "item 3" in info.value.message and info.value.loc.path.endswith("parallel_jobs.py")
