"""What the tests and the benchmarks share (never used by the library itself): tiny instances
of each graph view and the brute-force oracles the ILP optima are compared with; the PyTorch
model zoo (`torch_models`, `hf_models`), eager reference steps (`steps`) and the leak check
(`leaks`), which need torch (and `hf_models`' factories transformers)."""
