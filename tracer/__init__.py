"""ranktrace's tracer: `python -m tracer.record [options] script.py [args]` (see docs/tracer.md).

Scripts need no changes: a step ends at each torch.optim optimizer step. A training loop without
a torch.optim optimizer calls `tracer.step()` at the end of each step instead; it does nothing
when the script runs without the tracer.
"""

from __future__ import annotations

from typing import Callable, Optional

# Set by tracer.record while a traced script runs.
_step_callback: Optional[Callable[[], None]] = None


def step() -> None:
    """End the current training step now (see docs/tracer.md, Steps).

    From the first call on, only tracer.step() ends steps; if a torch.optim optimizer step has
    already ended one by then, that first call marks the same step instead of a new one.
    """
    callback = _step_callback
    if callback is not None:
        callback()
