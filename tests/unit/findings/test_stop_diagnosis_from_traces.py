"""The stop diagnosis from Kineto traces alone (analysis.findings.stop_diagnosis) on hand-built gloo
traces
whose answers are known."""

from __future__ import annotations

import gzip
import json
import shutil

import pandas as pd

from analysis import open_run
from analysis.findings import stop_diagnosis
from analysis.report import text_report
from analysis.run.loading import load_run_path
from helpers.launch import DATA
from helpers.synthetic import TraceBuilder, trace_name
from tracer import schema

STEP_US = 10_000
NELEMS = 262_144  # 1 MB of float32


def _all_reduce(b: TraceBuilder, at_us: int, nelems: int = NELEMS, pg: str = "0") -> None:
    """One c10d all_reduce as a CPU gloo run records it: the call on the main thread and the
    op on gloo's thread."""
    b.op("record_param_comms", at_us, at_us + 50, args={
        "Collective name": "allreduce", "In msg nelems": nelems, "Out msg nelems": nelems,
        "dtype": "Float", "Group size": 2, "Process Group Name": pg})
    b.annotation("gloo:all_reduce", at_us + 10, at_us + 900, tid=2,
                 args={"Input Dims": [[nelems]], "Input type": ["float"]})


def _run(folder, per_rank: dict[int, dict[int, list[int]]]):
    """per_rank: rank -> {step: [element count of each all_reduce]}; steps are what the trace
    covers. Each rank's run was traced with --no-comms: a manifest, and no comms record."""
    for rank, steps in per_rank.items():
        start = schema.RunStart(schema_version=schema.SCHEMA_VERSION, run_name=folder.name,
                                rank=rank, local_rank=rank, world_size=2, host="h", pid=1,
                                start_ns=0, argv=[], script="s.py", script_args=[],
                                torch_version="x", config={"no_comms": True})
        folder.mkdir(parents=True, exist_ok=True)
        (folder / schema.MANIFEST_FILE.format(rank=rank)).write_bytes(
            schema.ENCODER.encode(start) + b"\n")
        b = TraceBuilder(rank=rank, world_size=2, backend="gloo")
        for step, sizes in steps.items():
            t = step * STEP_US
            b.step(step, t, t + STEP_US)
            for k, nelems in enumerate(sizes):
                _all_reduce(b, t + 1_000 + k * 2_000, nelems)
        b.write(folder / trace_name(rank))
    loaded = load_run_path(folder, None, use_cache=False)
    return stop_diagnosis.trace_ops(loaded.ranks)


def test_a_trace_holding_fewer_collectives_in_a_step_both_cover_is_named(tmp_path):
    # rank 1 hung before its second all_reduce of step 3; both traces were exported at the stop
    ops, coverage = _run(tmp_path, {0: {1: [NELEMS] * 2, 2: [NELEMS] * 2, 3: [NELEMS] * 2},
                                    1: {1: [NELEMS] * 2, 2: [NELEMS] * 2, 3: [NELEMS]}})
    assert sorted(coverage.itertuples(index=False)) == [(r, s) for r in (0, 1)
                                                        for s in (1, 2, 3)]
    found = stop_diagnosis.diagnose_traces(ops, coverage, 2)
    [row] = found.groups.to_dict("records")
    assert (row["kind"], row["step"], row["position"], row["op"]) == ("missing", 3, 1,
                                                                      "all_reduce")
    assert (row["bytes"], row["dtype"]) == (NELEMS * 4, "float32")
    assert row["missing_ranks"] == [1] and row["issued_ranks"] == [0]
    assert row["last_alike"] == (3, 0)
    assert row["text"] == ("the trace of rank 1 holds no all_reduce #1 of step 3 on group 0 "
                           "(1.0 MB float32), which the trace of rank 0 holds; last position "
                           "every trace holds alike: step 3 #0")
    assert found.lines[-1] == stop_diagnosis.CAVEAT


def test_collectives_of_different_sizes_at_one_position_are_a_mismatch(tmp_path):
    ops, coverage = _run(tmp_path, {0: {1: [NELEMS], 2: [1]}, 1: {1: [NELEMS], 2: [1024]}})
    [row] = stop_diagnosis.diagnose_traces(ops, coverage, 2).groups.to_dict("records")
    assert (row["kind"], row["step"], row["position"], row["last_alike"]) == (
        "mismatch", 2, 0, (1, 0))
    assert row["odd_ranks"] == [] and row["missing_ranks"] == []
    assert row["signatures"] == ("all_reduce 4 B float32 on rank 0; all_reduce 4.1 kB float32 "
                                 "on rank 1")


def test_traces_that_agree_give_no_diagnosis(tmp_path):
    ops, coverage = _run(tmp_path, {r: {1: [NELEMS] * 2, 2: [NELEMS] * 2} for r in (0, 1)})
    assert len(ops) == 8
    assert stop_diagnosis.diagnose_traces(ops, coverage, 2) is None


def test_a_rank_whose_window_ended_earlier_is_not_blamed_for_steps_it_does_not_cover(tmp_path):
    # rank 1's trace covers steps 1-2 only: step 3 is outside its window, not missing from it
    ops, coverage = _run(tmp_path, {0: {1: [NELEMS], 2: [NELEMS], 3: [NELEMS]},
                                    1: {1: [NELEMS], 2: [NELEMS]}})
    assert stop_diagnosis.diagnose_traces(ops, coverage, 2) is None


def _frame_op(rank, step, nbytes=4, pg="0", pg_size=4, at=0):
    return {"rank": rank, "step": step, "pg": pg, "pg_size": pg_size, "op": "all_reduce",
            "bytes": nbytes, "dtype": "float32", "issue_ns": at}


def test_on_four_ranks_the_odd_one_is_named_and_a_lone_covering_member_is_not_compared():
    ops = pd.DataFrame([_frame_op(r, 1, at=r) for r in range(4)]
                       + [_frame_op(r, 2, nbytes=4096 if r == 2 else 4, at=10 + r)
                          for r in range(4)]
                       + [_frame_op(0, 3, at=20)])  # only rank 0's trace covers step 3
    coverage = pd.DataFrame([(r, s) for r in range(4) for s in (1, 2)] + [(0, 3)],
                            columns=stop_diagnosis.COVERAGE_COLUMNS)
    [row] = stop_diagnosis.diagnose_traces(ops, coverage, 4).groups.to_dict("records")
    assert (row["kind"], row["step"], row["odd_ranks"], row["covering_ranks"]) == (
        "mismatch", 2, [2], [0, 1, 2, 3])
    assert row["text"].startswith("rank 2 issued collective #0 of step 2 on group 0 unlike the "
                                  "others: all_reduce 4 B float32 on ranks 0-1, 3; all_reduce "
                                  "4.1 kB float32 on rank 2")


def test_a_crashed_run_traced_without_comms_records_is_diagnosed_from_its_traces(tmp_path):
    """The traced CPU DDP run of tests/data with its comms records gone (--no-comms), rank 1's
    run_end gone (it died) and its last gloo all_reduce cut from its trace: the report opens
    with the op rank 1's trace lacks."""
    run_dir = tmp_path / "run"
    shutil.copytree(DATA / "ddp_cpu", run_dir)
    for path in run_dir.glob("rank*.comms.jsonl"):
        path.unlink()
    manifest = run_dir / "rank1.manifest.jsonl"
    manifest.write_text("".join(f"{line}\n" for line in manifest.read_text().splitlines()
                                if '"run_end"' not in line))
    (trace,) = run_dir.glob("rank1.*.pt.trace.json.gz")
    document = json.loads(gzip.decompress(trace.read_bytes()))
    last = max((e for e in document["traceEvents"] if e.get("name") == "gloo:all_reduce"),
               key=lambda e: e["ts"])
    document["traceEvents"].remove(last)
    trace.write_bytes(gzip.compress(json.dumps(document).encode()))

    run = open_run(str(run_dir), use_cache=False)
    (group,) = run.document()["stop_diagnosis"]["groups"]
    assert (group["kind"], group["step"], group["position"], group["op"]) == (
        "missing", 3, 1, "all_reduce")
    assert (group["missing_ranks"], group["issued_ranks"]) == ([1], [0])
    text = text_report.text_report(run.report)
    assert ("the trace of rank 1 holds no all_reduce #1 of step 3 on group unknown, which the "
            "trace of rank 0 holds; last position every trace holds alike: step 3 #0") in text
    assert "rank 1 (crashed)" in text
