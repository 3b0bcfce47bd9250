"""ranktrace's commands that use both the tracer and the analysis: the `ranktrace` command with
its subcommands (`cli`), the scaling sweep and the live view. Nothing in tracer/ or analysis/
imports this package, except the `python -m tracer.sweep` entry."""
