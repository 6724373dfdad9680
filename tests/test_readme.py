"""Every command of the README and of the tutorial (`docs/tutorial.md`) runs verbatim from a
clone (issue 26), whatever they hold.

The commands are read from the README's ``bash`` code blocks (a trailing ``\\`` joins lines;
``pip install ... &&`` in front of a command is set-up, done already; the test suite's own
command is not run again) and run in order with `bash`, in a scratch folder that sees the
repository's ``examples/`` as a clone does, so the files one command writes (``vgg16.sched``)
are there for the next. Each must exit 0 and print no traceback. Python blocks that begin with
an import are programs and run too (the ones that begin otherwise continue an earlier block).
The slow commands (PyTorch runs, offloading solves, sweeps of several files) are marked slow:
the default run keeps the quick ones.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .paths import ROOT

README = ROOT / "README.md"
#: the documents whose commands a new user runs as written, in the order they read them
DOCUMENTS = (README, ROOT / "docs" / "tutorial.md")
BLOCK = re.compile(r"```(\w*)\n(.*?)```", re.S)

#: commands that take minutes on a loaded 2-core machine: run with -m slow
SLOW_WORDS = ("schedlang run ", "schedlang trace ", "--compare", "offload", "transformer12")


def readme_blocks() -> list[tuple[str, str]]:
    return [(lang or "text", body) for doc in DOCUMENTS
            for lang, body in BLOCK.findall(doc.read_text())]


def readme_commands() -> list[str]:
    """The shell commands of the README's bash blocks, in order."""
    out = []
    for lang, body in readme_blocks():
        if lang not in ("bash", "sh", "console"):
            continue
        for line in body.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()  # a trailing comment
            if not line or line.startswith("#"):
                continue
            line = re.sub(r"^pip install [^&]*&&\s*", "", line)  # set-up, done already
            if line.startswith("pip install") or "pytest" in line:
                continue  # set-up alone; the test suite itself
            out.append(re.sub(r"\s+", " ", line))
    return out


def readme_programs() -> list[str]:
    """The README's Python blocks that are whole programs (they begin with an import)."""
    return [body for lang, body in readme_blocks()
            if lang == "python" and re.match(r"\s*(import|from)\s", body)]


def _marked(items, slow):
    return [pytest.param(k, item, marks=[pytest.mark.slow] if slow(item) else [],
                         id=f"{k}-{item.split()[1] if item.startswith('schedlang') else k}")
            for k, item in enumerate(items)]


COMMANDS = readme_commands()
PROGRAMS = readme_programs()


@pytest.fixture(scope="module")
def clone_dir(tmp_path_factory):
    """A scratch folder laid out as a clone's root: examples/ and models/ beside the
    commands' outputs."""
    where = tmp_path_factory.mktemp("readme")
    for name in ("examples", "models"):
        (where / name).symlink_to(ROOT / name, target_is_directory=True)
    return where


def _env() -> dict:
    env = dict(os.environ, MPLBACKEND="Agg")
    bin_dir = str(Path(sys.executable).parent)  # `schedlang` of this environment
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    return env


def test_the_readme_names_only_files_a_clone_has():
    assert len(COMMANDS) >= 8 and any(c.startswith("schedlang solve") for c in COMMANDS)
    for command in COMMANDS:
        for word in command.split():
            path = word.split(":")[0] if ".py:" in word else word
            assert not path.startswith("../"), (command, "a clone has nothing beside it")
            if path.startswith(("examples/", "models/")):
                assert (ROOT / path).exists(), (command, path)


#: the options (and the shell's redirection) after which a command names a file it writes
WRITES = ("-o", "--out", "--plan-out", ">")


def written_files(command: str) -> list[str]:
    """The files `command` writes (`-o F`, `--plan-out F`, `> F`, ...)."""
    words = command.split()
    return [after for flag, after in zip(words, words[1:]) if flag in WRITES]


@pytest.mark.parametrize("k,command", _marked(COMMANDS, lambda c: any(w in c for w in SLOW_WORDS)))
def test_readme_command_runs(k, command, clone_dir):
    # the commands before this one ran already in a full run on one worker; alone (or on
    # another pytest-xdist worker, with its own folder), run first those whose files it reads
    for before in COMMANDS[:k]:
        if any(f in command.split() and not (clone_dir / f).exists()
               for f in written_files(before)):
            subprocess.run(["bash", "-c", before], cwd=clone_dir, env=_env(), timeout=1800,
                           capture_output=True)
    proc = subprocess.run(["bash", "-c", command], cwd=clone_dir, env=_env(), timeout=1800,
                          capture_output=True, text=True)
    assert proc.returncode == 0, f"{command}\nstdout: {proc.stdout[-2000:]}\n" \
                                 f"stderr: {proc.stderr[-2000:]}"
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("k,program", _marked(PROGRAMS, lambda p: "torch" in p))
def test_readme_program_runs(k, program, clone_dir):
    proc = subprocess.run([sys.executable, "-c", program], cwd=clone_dir, env=_env(),
                          timeout=1800, capture_output=True, text=True)
    assert proc.returncode == 0, f"{program}\nstderr: {proc.stderr[-3000:]}"
