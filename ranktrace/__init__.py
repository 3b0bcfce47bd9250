"""ranktrace's commands that use both the tracer and the analysis (the scaling sweep). Nothing in
tracer/ or analysis/ imports this package, except the `python -m tracer.sweep` entry."""
