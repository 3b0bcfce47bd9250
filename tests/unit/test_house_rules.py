"""The house's rules that a review would otherwise have to count by hand (tests/README.md): no
function over 100 lines, no re-export kept alive with `noqa: F401` outside an `__init__.py`, at
most 2 file names repeated in analysis/, at most 12 entries at the top of tracer/."""

from __future__ import annotations

import ast
import collections
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("analysis", "tracer", "ranktrace", "workloads", "benchmarks", "scripts")
MAX_FUNCTION_LINES = 100


def _sources():
    for package in PACKAGES:
        yield from sorted((REPO / package).rglob("*.py"))


def test_no_function_is_over_100_lines():
    long = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({lines})")
    assert long == []


def test_re_exports_are_kept_only_by_packages():
    kept = [str(path.relative_to(REPO)) for path in _sources()
            if path.name != "__init__.py" and "noqa: F401" in path.read_text()]
    assert kept == []


def test_analysis_repeats_at_most_two_file_names_and_tracer_has_at_most_12_entries():
    names = collections.Counter(path.name for path in (REPO / "analysis").rglob("*.py")
                                if path.name not in ("__init__.py", "__main__.py"))
    assert len([name for name, count in names.items() if count > 1]) <= 2, names
    entries = [p.name for p in (REPO / "tracer").iterdir() if p.name != "__pycache__"]
    assert len(entries) <= 12, sorted(entries)
