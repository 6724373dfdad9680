"""`schedlang run` called as a function by the tests, on model factories they write to a file."""
from __future__ import annotations

import argparse

from schedlang.cli.pytorch_args import add_run_arguments

#: the fewest steps a report needs: no plain run to compare with
QUICK = ("--steps", "2", "--repeats", "1", "--no-plain")


class RunCommand:
    """`source` written to `tmp_path/name`; calling runs `schedlang run ARGV` (its exit code)."""

    def __init__(self, tmp_path, source: str, name: str = "factories.py"):
        self.factory = tmp_path / name
        self.factory.write_text(source)
        self.parser = argparse.ArgumentParser()
        add_run_arguments(self.parser)

    def __call__(self, *argv: str) -> int:
        from schedlang.pytorch.run import run_main  # torch: imported where a test runs it

        return run_main(self.parser.parse_args(list(argv)))

    def quick(self, factory: str, *argv: str) -> int:
        """`schedlang run FILE:factory` with the QUICK arguments, then `argv`."""
        return self(f"{self.factory}:{factory}", *QUICK, *argv)
