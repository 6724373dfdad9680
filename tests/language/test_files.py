"""Atomic writes (issue 11): a write that fails part-way leaves the old file intact, whole,
and no temporary file behind; a finished write replaces it."""
from __future__ import annotations

import os

import pytest

from schedlang.cli.main import main
from schedlang.language import files
from schedlang.language.errors import DataError
from schedlang.plans.plan import Plan

from ..paths import GRAPHS, ROOT

CHAIN = str(ROOT / "examples" / "chain.sched")


def _leftovers(folder):
    return [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_exception_mid_write_keeps_the_old_file(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old content\n")
    with pytest.raises(KeyboardInterrupt), files.atomic_open(target) as f:
        f.write("half of the new")
        raise KeyboardInterrupt  # Ctrl-C between two writes
    assert target.read_text() == "old content\n"
    assert _leftovers(tmp_path) == []
    files.write_file(target, "new\n")
    assert target.read_text() == "new\n"
    assert _leftovers(tmp_path) == []


def test_disk_error_mid_write_is_located_and_keeps_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "plan.json"
    target.write_text("{}\n")

    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(DataError) as exc:
        files.write_file(target, "x" * 100_000)
    assert str(exc.value) == f"{target}: error: cannot write {target}: No space left on device"
    assert target.read_text() == "{}\n"
    assert _leftovers(tmp_path) == []


def test_keeps_the_permissions_of_the_file_it_replaces(tmp_path):
    target = tmp_path / "f.sched"
    target.write_text("a")
    os.chmod(target, 0o640)
    files.write_file(target, "b")
    assert target.read_text() == "b" and (target.stat().st_mode & 0o777) == 0o640


def test_plan_out_failure_keeps_the_old_plan(tmp_path, monkeypatch, capsys):
    """`solve --plan-out` over an existing plan, failing as it writes: the old plan still loads."""
    plan_path = tmp_path / "plan.json"
    assert main(["solve", CHAIN, "--plan-out", str(plan_path), "--json"]) == 0
    before = plan_path.read_text()
    Plan.load(plan_path)
    real = os.replace

    def crash(src, dst):  # the process dies after writing the temporary file, before the rename
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", crash)
    assert main(["solve", CHAIN, "--budget", "80%", "--plan-out", str(plan_path), "--json"]) == 130
    monkeypatch.setattr(os, "replace", real)
    assert plan_path.read_text() == before
    assert _leftovers(tmp_path) == []
    capsys.readouterr()


def test_bad_output_folder_is_a_located_error(tmp_path, capsys):
    out = tmp_path / "no" / "such" / "plan.json"
    assert main(["solve", CHAIN, "--plan-out", str(out), "--json"]) == 2
    err = capsys.readouterr().err  # before the solve: the folder is checked first
    assert err.startswith(f"--plan-out: error: cannot write the plan to {out}: folder does not "
                          "exist"), err


@pytest.mark.skipif(not (GRAPHS / "vgg16_train.json").exists(), reason="shared graphs absent")
def test_import_writes_atomically(tmp_path, monkeypatch, capsys):
    out = tmp_path / "g.sched"
    out.write_text("# the old file\n")

    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    assert main(["import", str(GRAPHS / "vgg16_train.json"), "--format", "checkmate-nx",
                 "-o", str(out)]) == 2
    assert out.read_text() == "# the old file\n" and _leftovers(tmp_path) == []
    monkeypatch.undo()
    assert main(["import", str(GRAPHS / "vgg16_train.json"), "--format", "checkmate-nx",
                 "-o", str(out)]) == 0
    assert main(["check", str(out)]) == 0  # the new file is whole
    capsys.readouterr()


def test_a_fifo_is_never_replaced_nor_opened(tmp_path):
    from schedlang.language.errors import DataError
    from schedlang.language.files import write_file
    from schedlang.language.paths import read_text

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(DataError, match="it is a FIFO"):
        write_file(fifo, "text")
    with pytest.raises(DataError, match="it is a FIFO"):  # reading one would block
        read_text(fifo)
    assert fifo.is_fifo()


@pytest.mark.parametrize("kind,message", [
    ("file", "it is a file, not a folder"),
    ("long", "the name is too long"),
    ("under_file", "a part of the path is a file"),
])
def test_the_cache_folder_is_checked_once_and_located(tmp_path, monkeypatch, kind, message):
    """SCHEDLANG_CACHE_DIR that cannot hold the cache of the hierarchy's sub-solves: a
    located error naming the variable (it used to be skipped silently, or a traceback)."""
    from schedlang.language.errors import DataError
    from schedlang.layer_solves import CACHE_ENV, cache_path

    (tmp_path / "f").write_text("x")
    folder = {"file": tmp_path / "f", "long": tmp_path / ("c" * 300),
              "under_file": tmp_path / "f" / "cache"}[kind]
    monkeypatch.setenv(CACHE_ENV, str(folder))
    with pytest.raises(DataError, match=message) as info:
        cache_path(("key",), "layer_options", (), "highs")
    assert str(info.value).startswith(f"{CACHE_ENV}: error: cannot use ")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "new" / "cache"))  # made when missing
    path = cache_path(("key",), "layer_options", (), "highs")
    assert path.parent.is_dir() and path.parent == tmp_path / "new" / "cache"
