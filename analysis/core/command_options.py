"""The options every analysis command shares, under one name and one meaning: how the trace
files are parsed (--no-cache, --jobs, --comm-kernel). Without pandas, as step_spec."""

from __future__ import annotations

import argparse

from analysis.core.step_spec import at_least_one, regex_argument


def add_parse_options(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The "how to parse" group: --no-cache, --jobs N, --comm-kernel REGEX (repeatable)."""
    group = parser.add_argument_group("how to parse")
    group.add_argument("--no-cache", action="store_true",
                       help="neither read nor write the .ranktrace-cache Parquet files")
    group.add_argument("--jobs", type=at_least_one, metavar="N",
                       help="processes for parsing trace files (default: one per core)")
    group.add_argument("--comm-kernel", action="append", default=[], metavar="REGEX",
                       type=regex_argument,
                       help="device kernels whose name matches REGEX (searched, case-"
                            "sensitive) also count as communication; repeatable")
    return group
