"""The JSON document of `python -m analysis.breakdown` on every real trace in tests/data, and its
text report (the one screen, and --full) on a few, compared with those written in
tests/data/golden/ (tests/data/golden/README.md).

A refactor of the analysis must leave these documents as they are. A change that means to alter
the numbers or the wording rewrites them, on purpose and in the same commit:
`python tests/golden/test_golden.py` (then read the diff).

The only run-dependent values are the paths of the trace files, which depend on where the
repository lies: the test data folder is written as `<data>` in the stored documents.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))  # the helpers' DATA, when this file runs as a script

from analysis.breakdown import main  # noqa: E402
from helpers.launch import DATA  # noqa: E402

GOLDEN = DATA / "golden"
DATA_MARK = "<data>"
# Float values are compared to this relative precision, in case a library sums in another order
# on another machine; everything else must be equal.
FLOAT_REL = 1e-12

# (trace folder under tests/data, extra command-line options)
CASES = [
    ("hta/amd_trace", ()),
    ("hta/cpu_only", ()),
    ("hta/nccl_parser_config", ()),
    ("hta/ns_resolution_trace", ()),
    ("hta/ns_resolution_trace", ("--hta-compatible",)),
    ("hta/rank_unavailable", ()),
    ("hta/trace_filter", ()),
    ("hta/trace_filter", ("--hta-compatible",)),
    ("kineto/resnet50_num_workers_0", ()),
    ("ddp_cpu", ()),
    ("ddp_cpu", ("--steps", "3")),
    ("hta/trace_filter", ("--comm-kernel", "permute_pooled_embs")),
]

# (trace folder, extra options) of the stored text reports: the default one screen of a CPU run
# and of a GPU one, and every table of the CPU run
TEXT_CASES = [
    ("ddp_cpu", ()),
    ("hta/trace_filter", ()),
    ("ddp_cpu", ("--full",)),
]


def golden_path(folder: str, options: tuple) -> Path:
    suffix = "".join("_" + o.strip("-").replace("-", "_") for o in options[:1])
    return GOLDEN / f"{folder.replace('/', '__')}{suffix}.json"


def text_golden_path(folder: str, options: tuple) -> Path:
    return golden_path(folder, options).with_suffix(".txt")


def text(folder: str, options: tuple) -> str:
    """The text report the command line prints for `folder`, paths made portable."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main([str(DATA / folder), "--no-cache", "--jobs", "1", *options])
    assert code == 0, f"{folder} {options}: exit code {code}"
    return printed.getvalue().replace(str(DATA), DATA_MARK)


def _portable(value):
    """`value` with the absolute test data folder written as DATA_MARK."""
    if isinstance(value, str):
        return value.replace(str(DATA), DATA_MARK)
    if isinstance(value, list):
        return [_portable(v) for v in value]
    if isinstance(value, dict):
        return {k: _portable(v) for k, v in value.items()}
    return value


def document(folder: str, options: tuple) -> dict:
    """The JSON document the command line prints for `folder`, paths made portable."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main([str(DATA / folder), "--format", "json", "--no-cache", "--jobs", "1",
                     *options])
    assert code == 0, f"{folder} {options}: exit code {code}"
    return _portable(json.loads(printed.getvalue()))


def differences(expected, actual, where: str = "") -> list[str]:
    """Where `actual` differs from `expected`, as JSON paths with both values."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        found = [f"{where}.{k}: missing" for k in expected if k not in actual]
        found += [f"{where}.{k}: unexpected" for k in actual if k not in expected]
        for key in expected:
            if key in actual:
                found += differences(expected[key], actual[key], f"{where}.{key}")
        return found
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            return [f"{where}: {len(expected)} items expected, {len(actual)} found"]
        return [d for i, (e, a) in enumerate(zip(expected, actual))
                for d in differences(e, a, f"{where}[{i}]")]
    both_float = isinstance(expected, float) and isinstance(actual, float)
    if both_float and math.isclose(expected, actual, rel_tol=FLOAT_REL, abs_tol=0.0):
        return []
    if type(expected) is type(actual) and expected == actual:
        return []
    return [f"{where}: expected {expected!r}, found {actual!r}"]


@pytest.mark.parametrize("folder, options", CASES,
                         ids=[golden_path(f, o).stem for f, o in CASES])
def test_the_json_document_is_the_stored_one(folder, options):
    expected = json.loads(golden_path(folder, options).read_text())
    found = differences(expected, document(folder, options))
    assert not found, "\n".join(found[:20])


@pytest.mark.parametrize("folder, options", TEXT_CASES,
                         ids=[text_golden_path(f, o).stem for f, o in TEXT_CASES])
def test_the_text_report_is_the_stored_one(folder, options):
    assert text(folder, options) == text_golden_path(folder, options).read_text()


def test_differences_name_the_changed_value():
    expected = {"ranks": [{"breakdown": {"idle_ns": 5, "overlap_pct": 12.5}}], "run": "a"}
    changed = {"ranks": [{"breakdown": {"idle_ns": 6, "overlap_pct": 12.5 * (1 + 1e-9)}}],
               "run": "a", "more": 1}
    assert differences(expected, expected) == []
    assert differences(expected, changed) == [
        ".more: unexpected",
        ".ranks[0].breakdown.idle_ns: expected 5, found 6",
        f".ranks[0].breakdown.overlap_pct: expected 12.5, found {12.5 * (1 + 1e-9)!r}",
    ]
    assert differences({"n": 1}, {"n": 1.0}) == [".n: expected 1, found 1.0"]


def _write_all() -> None:
    GOLDEN.mkdir(exist_ok=True)
    for folder, options in CASES:
        path = golden_path(folder, options)
        path.write_text(json.dumps(document(folder, options), indent=2) + "\n")
        print(f"wrote {path.relative_to(TESTS.parent)}")
    for folder, options in TEXT_CASES:
        path = text_golden_path(folder, options)
        path.write_text(text(folder, options))
        print(f"wrote {path.relative_to(TESTS.parent)}")


if __name__ == "__main__":
    _write_all()
