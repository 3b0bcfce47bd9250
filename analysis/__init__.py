"""ranktrace's analysis: `python -m analysis.breakdown PATH` on the command line, and
`analysis.open_run(PATH)` in a notebook (analysis.run; docs/analysis.md)."""

__all__ = ["Run", "open_run"]


def __getattr__(name: str):
    # The front is imported on first use: `python -m analysis.breakdown` imports this package
    # before it runs the module, which must not be imported already by then.
    if name in __all__:
        from analysis import run

        return getattr(run, name)
    raise AttributeError(f"module 'analysis' has no attribute {name!r}")
