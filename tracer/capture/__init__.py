"""Capture on slow steps: profiler windows off the fixed schedule, at the same steps on every
rank, asked by a slow step or by `python -m tracer.capture RUN` (docs/tracer.md, Capturing slow
steps)."""
