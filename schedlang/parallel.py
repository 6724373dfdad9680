"""Independent jobs in parallel: the one place that maps a job over items on local worker
processes or on Ray.

    from schedlang.parallel import run_jobs
    results = run_jobs(solve_one, budgets, args=(program,), jobs=None)   # as many as cores allow

`run_jobs(fn, items, args=(), kwargs=None, jobs=None, ray=None, on_result=None)` calls
``fn(item, *args, **kwargs)`` for every item and returns the results in the order of `items`
(whatever order they finish in). `fn` must be a module-level function and `items`, `args`,
`kwargs` and the results picklable. Where the jobs run:

* ``jobs=1`` (or a single item): in this process, one after the other — no pickling, the
  reference the parallel paths are tested against;
* ``jobs=N`` / ``jobs=None``: N worker processes (None or 0: as many as this process may use
  cores, `default_jobs`), never more than there are items. `args` and `kwargs` are sent once
  to each worker, not once per item. Workers come from a `forkserver` (a clean process, not a
  fork of this one, whose solver and torch threads a fork would copy in an unknown state);
* ``ray=ADDRESS``: one Ray task per item (``num_cpus=1``), on the cluster at ADDRESS, or on a
  local Ray instance for ``ray=""`` (started here and shut down at the end). `args` and
  `kwargs` go to Ray's object store once. Ray is an optional extra
  (``pip install "schedlang[ray]"``), imported only here and only when asked for.

`on_result(index, item, result)` is called in this process as each job finishes (to stream or
record results); it may return the indices of jobs no longer needed (e.g. the rest of a series
that has ended), which are then not started — their results are None, or what they gave if
they were already running. A job that raises stops the map: the other jobs are cancelled and
the error is raised here — a `SchedError` as it is (it is located already), anything else as
a `JobError` naming the item and the file and line in the worker where it was raised (a worker
that dies: a `JobError` too). Ctrl-C (or any exception in `on_result`) stops the workers and
is raised; nothing is left running. Workers do not run the caller's script again
(`_main_not_imported`), so a script needs no ``if __name__ == "__main__"`` guard.
"""
from __future__ import annotations

import contextlib
import importlib.machinery
import multiprocessing
import os
import signal
import sys
import traceback
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool

from .language.errors import Loc, SchedError

__all__ = ["run_jobs", "default_jobs", "JobError", "import_ray", "RAY_LOC", "JOBS_LOC"]

RAY_LOC = Loc("--ray")
JOBS_LOC = Loc("--jobs")


class JobError(SchedError):
    """A job failed in a worker with an error that is not a `SchedError` (a bug, not bad
    input): which item, what, and where in the worker. Exit code 5, like a solver error."""

    exit_code = 5


def default_jobs() -> int:
    """The cores this process may use (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def import_ray():
    """The `ray` module, or a `SchedError` (exit 2) that says how to install it."""
    try:
        import ray
    except ImportError:
        raise SchedError("--ray needs Ray, which is not installed: pip install "
                         "\"schedlang[ray]\" (or pip install ray)", RAY_LOC) from None
    return ray


def run_jobs(fn, items, *, args: tuple = (), kwargs: dict | None = None, jobs: int | None = None,
             ray: str | None = None, on_result=None, preload=()) -> list:
    """``[fn(item, *args, **kwargs) for item in items]``, run as the module docstring says.
    `preload`: modules the worker processes need besides `fn`'s, imported once in the fork
    server (which starts with the first pool of this process) rather than in every worker."""
    items = list(items)
    kwargs = dict(kwargs or {})
    if jobs is not None and jobs < 0:
        raise SchedError(f"the number of jobs must be 0 (as many as cores allow) or more, "
                         f"not {jobs}", JOBS_LOC)
    if ray is not None:
        return _on_ray(fn, items, args, kwargs, ray, on_result)
    n = min(jobs or default_jobs(), len(items))
    if n <= 1:
        return _serial(fn, items, args, kwargs, on_result)
    return _on_processes(fn, items, args, kwargs, n, on_result, [fn.__module__, *preload])


# ---------------------------------------------------------------------------- in this process

def _serial(fn, items, args, kwargs, on_result) -> list:
    out: list = []
    dropped: set = set()
    for k, item in enumerate(items):
        if k in dropped:
            out.append(None)
            continue
        try:
            result = fn(item, *args, **kwargs)
        except (SchedError, KeyboardInterrupt):
            raise
        except Exception as exc:
            raise _job_error(item, exc, traceback.extract_tb(exc.__traceback__)) from exc
        out.append(result)
        if on_result is not None:
            dropped.update(on_result(k, item, result) or ())
    return out


# ---------------------------------------------------------------------------- worker processes

_WORKER: dict = {}  # in a worker: the job's fn, args and kwargs (sent once, by the initializer)


def _init_worker(fn, args, kwargs) -> None:
    # Ctrl-C at a terminal reaches the whole process group: the parent alone handles it (it
    # stops the workers), so that a worker does not die with a traceback of its own
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _WORKER.update(fn=fn, args=args, kwargs=kwargs)


def _call(item):
    return _located(_WORKER["fn"], item, _WORKER["args"], _WORKER["kwargs"])


def _located(fn, item, args, kwargs):
    """`fn(item, ...)` in a worker; an error other than a `SchedError` comes back as a
    `JobError` located where it was raised (the class may not pickle, the frames never do)."""
    try:
        return fn(item, *args, **kwargs)
    except SchedError:
        raise
    except Exception as exc:
        raise _job_error(item, exc, traceback.extract_tb(exc.__traceback__)) from None


def _job_error(item, exc: BaseException, frames) -> JobError:
    """`exc` raised by the job of `item` as a located `JobError` (the innermost frame of the
    job's own code: the file and line that raised)."""
    where = frames[-1] if frames else None
    loc = Loc(where.filename, where.lineno or 0, 1) if where else Loc("<job>")
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return JobError(f"a job failed (item {_short(item)}): {text}", loc,
                    [f"in {f.name}, {f.filename}:{f.lineno}" for f in frames[-4:-1]])


def _short(item) -> str:
    text = repr(item)
    return text if len(text) <= 80 else text[:77] + "..."


def _context(preload):
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([m for m in preload if m and m != "__main__"])  # until it starts
    return ctx


@contextlib.contextmanager
def _main_not_imported():
    """Workers started in this block do not import the caller's main script again. A
    `forkserver` or `spawn` worker runs the `__main__` of a script (``python train.py``) once
    more, as ``__mp_main__``, so that functions defined there unpickle; jobs here are
    functions of importable modules, and a script without an ``if __name__ == "__main__"``
    guard would run its whole top level (its own `fit`, ...) in every worker. A main module
    whose spec is named ``__main__`` is not imported again by the worker
    (`multiprocessing.spawn`), which is what this gives the script for the launch."""
    main = sys.modules.get("__main__")
    bare = main is not None and getattr(main, "__spec__", None) is None
    if bare:
        main.__spec__ = importlib.machinery.ModuleSpec("__main__", None)
    try:
        yield
    finally:
        if bare:
            main.__spec__ = None


def _on_processes(fn, items, args, kwargs, n, on_result, preload) -> list:
    pool = ProcessPoolExecutor(max_workers=n, mp_context=_context(preload),
                               initializer=_init_worker, initargs=(fn, args, kwargs))
    results: list = [None] * len(items)
    clean = False
    try:
        pending: dict[Future, int] = {}
        with _main_not_imported():  # the workers start as the jobs are submitted
            for k, item in enumerate(items):
                try:
                    pending[pool.submit(_call, item)] = k
                except (BrokenProcessPool, OSError) as exc:
                    # a worker died before all were submitted; when it died while the pool was
                    # starting the next worker, the pool's queue is closed under that start:
                    # an OSError ("handle is closed") from a pool marked broken
                    if isinstance(exc, OSError) and not getattr(pool, "_broken", False):
                        raise
                    raise JobError(f"a worker process died while the jobs were submitted, at item "
                                   f"{_short(item)} (killed, or out of memory?): {exc}",
                                   Loc("<worker>")) from None
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in sorted(finished, key=pending.__getitem__):  # finished ones are pending
                k = pending.pop(fut)
                if fut.cancelled():
                    continue
                try:
                    results[k] = fut.result()  # raises the job's error here
                except BrokenProcessPool as exc:
                    raise JobError(f"a worker process died while running the job of item "
                                   f"{_short(items[k])} (killed, or out of memory?): {exc}",
                                   Loc("<worker>")) from None
                if on_result is not None:
                    drop = set(on_result(k, items[k], results[k]) or ())
                    for other in [f for f, j in pending.items() if j in drop]:
                        if other.cancel():  # not started yet
                            pending.pop(other)
        clean = True
    finally:
        if clean:
            pool.shutdown(wait=True)
        else:  # an error, Ctrl-C: the jobs still running are stopped, not awaited
            _stop(pool)
    return results


def _stop(pool: ProcessPoolExecutor) -> None:
    procs = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join(timeout=5)


# ---------------------------------------------------------------------------- Ray

def _ray_call(item, fn, args, kwargs):
    return _located(fn, item, args, kwargs)


def _on_ray(fn, items, args, kwargs, address: str, on_result) -> list:
    ray = import_ray()
    if not items:
        return []
    started = not ray.is_initialized()
    if started:
        try:
            ray.init(address=address or None, include_dashboard=False, log_to_driver=False,
                     logging_level="WARNING")
        except Exception as exc:  # a bad address, a cluster that does not answer
            raise SchedError(f"cannot start or join Ray{' at ' + address if address else ''}: "
                             f"{exc}", RAY_LOC) from None
    results: list = [None] * len(items)
    try:
        task = ray.remote(num_cpus=1)(_ray_call)
        shared = [ray.put(x) for x in (fn, args, kwargs)]
        pending = {task.remote(item, *shared): k for k, item in enumerate(items)}
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                k = pending.pop(ready[0])
                try:
                    results[k] = ray.get(ready[0])
                except ray.exceptions.RayTaskError as exc:
                    cause = getattr(exc, "cause", None)
                    if isinstance(cause, SchedError):
                        raise cause from None
                    frames = traceback.extract_tb(cause.__traceback__) if cause else []
                    raise _job_error(items[k], cause or exc, frames) from None
                if on_result is not None:
                    drop = set(on_result(k, items[k], results[k]) or ())
                    for ref in [r for r, j in pending.items() if j in drop]:
                        ray.cancel(ref, force=True)
                        pending.pop(ref)
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)
    finally:
        if started:
            ray.shutdown()
    return results


