"""Training steps: where a step ends (the step clock) and the step-end worker that writes what
can wait (docs/tracer.md, Steps)."""
