"""The PyTorch wing's tests (`schedlang.pytorch`), mirroring the package."""
