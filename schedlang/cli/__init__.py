"""The `schedlang` command line (`main`) and what its `--json` prints (`output`)."""
