"""ranktrace's tracer: `python -m tracer.record [options] script.py [args]` (see docs/tracer.md).

Scripts need no changes: a step ends at each torch.optim optimizer step. A training loop without
a torch.optim optimizer calls `tracer.step()` at the end of each step instead; it does nothing
when the script runs without the tracer.
"""

from __future__ import annotations

from collections.abc import Callable

# Set by tracer.record while a traced script runs.
_step_callback: Callable[[], None] | None = None
_samples_per_step_callback: Callable[[int], None] | None = None


def step() -> None:
    """End the current training step now (see docs/tracer.md, Steps).

    From the first call on, only tracer.step() ends steps; if a torch.optim optimizer step has
    already ended one by then, that first call marks the same step instead of a new one.
    """
    callback = _step_callback
    if callback is not None:
        callback()


def set_samples_per_step(samples: int) -> None:
    """The samples the whole job trains per step (the global batch) from the next step end on,
    stored in each step record (docs/trace-format.md); 0 stops recording it. It does nothing
    when the script runs without the tracer, but checks `samples` either way."""
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
        raise ValueError(f"tracer.set_samples_per_step() needs an integer >= 0, got {samples!r}")
    callback = _samples_per_step_callback
    if callback is not None:
        callback(samples)
