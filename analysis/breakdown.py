"""`python -m analysis.breakdown PATH`: the command line (analysis.cli, docs/analysis.md).

The breakdown's functions live in analysis.step_breakdown; the names it exports (and re-exports
from analysis.hta, .idle and .layers) are still reachable here, as `analysis.breakdown.NAME`, for
the tests, benchmarks and notebooks that use them.
"""

from __future__ import annotations


def __getattr__(name: str):
    if name.startswith("__"):
        # The import system asks for __path__ and the like (`from analysis.breakdown import
        # main`): those are not the breakdown's, and must not import it.
        raise AttributeError(f"module 'analysis.breakdown' has no attribute {name!r}")
    # Imported on first use: this entry must start without pandas, which the command line
    # imports only once its trace is being decoded (analysis.parse_ahead).
    from analysis import step_breakdown

    try:
        return getattr(step_breakdown, name)
    except AttributeError:
        raise AttributeError(f"module 'analysis.breakdown' has no attribute {name!r}") from None


def main(argv: list[str] | None = None) -> int:
    from analysis.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
