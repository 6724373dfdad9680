"""What the tests and the benchmarks share: the PyTorch model zoo (`torch_models`,
`hf_models`), eager reference steps (`steps`) and the leak check (`leaks`). Importing these
modules needs torch (and `hf_models`' factories transformers)."""
