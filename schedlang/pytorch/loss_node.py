"""The loss node of a layered graph (torch-free: the CLI's trace command reads it before
torch loads)."""
from __future__ import annotations

__all__ = ["LOSS_TIME", "LOSS_VALUE_BYTES"]

#: seconds: the loss node's time (the loss itself is the user's)
LOSS_TIME = 1e-6
#: the loss scalar and its seed gradient (float32 each)
LOSS_VALUE_BYTES = 8
