"""The merged timeline (analysis.timeline): structurally valid Chrome-trace JSON on traced DDP and
pipeline runs and on the real GPU traces in tests/data, every rank named and sorted, times on the
common clock, flows from the last arriver to the waiters, and the size limit. The traced runs are
the shared runs `ddp-late-window` (2 ranks, one late) and `pipeline-4-late` (4 stages, one late),
tests/helpers/runs.py."""

import gzip
import json
import socket
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from analysis.report import timeline_events as te
from analysis.report.timeline_events import assign_lanes
from analysis.run.loading import load_run_path
from analysis.timeline import gather, main, window_steps
from helpers.launch import DATA
from helpers.run_copies import shifted_copy

EPS_US = 0.002  # ts and dur are written to the nanosecond, each rounded once
GPU_TRACES = ["hta/trace_filter", "hta/nccl_parser_config", "hta/ns_resolution_trace",
              "hta/amd_trace", "kineto/resnet50_num_workers_0"]


@pytest.fixture(scope="module")
def runs(shared_runs):
    return {"ddp": shared_runs["ddp-late-window"].run_dir,
            "pipeline": shared_runs["pipeline-4-late"].run_dir}


def _timeline(path: Path, out: Path, *options) -> tuple[dict, str]:
    stderr = out.with_suffix(".stderr")
    with open(stderr, "w") as sink:
        real = sys.stderr
        sys.stderr = sink
        try:
            code = main([str(path), "-o", str(out), "--no-cache", *options])
        finally:
            sys.stderr = real
    assert code == 0, stderr.read_text()
    return json.loads(gzip.decompress(out.read_bytes())), stderr.read_text()


def structural_problems(document: dict) -> list[str]:
    """Everything the Trace Event Format asks of our file that a viewer relies on."""
    problems = []
    events = document["traceEvents"]
    by_track = defaultdict(list)
    flows = defaultdict(dict)
    named, sorted_ = {}, {}
    for event in events:
        missing = [k for k in ("ph", "pid", "tid", "ts") if k not in event]
        if missing:
            problems.append(f"{event}: no {missing}")
            continue
        ph = event["ph"]
        if ph == "X":
            if not event["dur"] >= 0:
                problems.append(f"{event}: negative duration")
            by_track[(event["pid"], event["tid"])].append((event["ts"], event["ts"] + event["dur"]))
        elif ph in ("B", "E"):
            by_track[(event["pid"], event["tid"], "BE")].append((ph, event["ts"]))
        elif ph == "C":
            if not event["args"] or not all(isinstance(v, (int, float)) and v == v
                                            for v in event["args"].values()):
                problems.append(f"{event}: counter values not numeric")
        elif ph in ("s", "f"):
            flows[event["id"]][ph] = event
        elif ph == "M" and event["name"] == "process_name":
            named[event["pid"]] = event["args"]["name"]
        elif ph == "M" and event["name"] == "process_sort_index":
            sorted_[event["pid"]] = event["args"]["sort_index"]
    for track, spans in by_track.items():
        if len(track) == 3:
            depth = 0
            for ph, _ in sorted(spans, key=lambda s: s[1]):
                depth += 1 if ph == "B" else -1
                if depth < 0:
                    problems.append(f"{track}: E without B")
            continue
        stack = []
        for start, end in sorted(spans, key=lambda s: (s[0], -(s[1] - s[0]))):
            while stack and stack[-1] <= start + EPS_US:
                stack.pop()
            if stack and end > stack[-1] + EPS_US:
                problems.append(f"{track}: [{start}, {end}] overlaps its parent's end "
                                f"{stack[-1]}")
            stack.append(end)
    for flow_id, ends in flows.items():
        if set(ends) != {"s", "f"}:
            problems.append(f"flow {flow_id}: only {sorted(ends)}")
    pids = {e["pid"] for e in events}
    for pid in pids:
        # the ranks in their order; the critical path's own process above them
        place = -1 if named.get(pid) == te.CRITICAL_PATH_PROCESS else pid
        if pid not in named or sorted_.get(pid) != place:
            problems.append(f"process {pid}: not named or not sorted by rank")
    return problems


def test_lanes_keep_nested_slices_and_move_partial_overlaps():
    starts = np.array([0, 10, 20, 50, 60])
    ends = np.array([100, 30, 80, 70, 120])
    # [20, 80] starts inside [10, 30] and outlives it: lane 1; [50, 70] nests in [0, 100] on
    # lane 0 again; [60, 120] outlives both [0, 100] and [20, 80]: lane 2.
    assert assign_lanes(starts, ends).tolist() == [0, 0, 1, 0, 2]


@pytest.mark.parametrize("name", ["ddp", "pipeline"])
def test_traced_runs_give_a_valid_timeline_of_every_rank(runs, name, tmp_path):
    document, _ = _timeline(runs[name], tmp_path / "t.trace.gz")
    assert structural_problems(document) == []
    world = 2 if name == "ddp" else 4
    names = {e["pid"]: e["args"]["name"] for e in document["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    host = socket.gethostname()
    # the critical path's own process, numbered after the ranks, with a slice per segment
    assert names.pop(world) == te.CRITICAL_PATH_PROCESS
    assert names == {r: f"rank {r} ({host})" for r in range(world)}
    on_path = [e for e in document["traceEvents"] if e.get("cat") == "critical path"]
    assert on_path and {e["pid"] for e in on_path} == {world}
    by_phase = defaultdict(int)
    for event in document["traceEvents"]:
        by_phase[event["ph"]] += 1
    assert by_phase["s"] == by_phase["f"] > 0
    markers = [e for e in document["traceEvents"] if e.get("cat") == "step"]
    assert {e["pid"] for e in markers} == set(range(world))
    assert {e["name"] for e in markers} >= {f"step {s}" for s in document["otherData"]["steps"]}
    counters = {e["name"] for e in document["traceEvents"] if e["ph"] == "C"}
    assert {"CPU process %", "RSS MiB", "step peak memory MiB"} <= counters


def test_flows_go_from_the_last_arriver_to_each_waiting_rank(runs, tmp_path):
    document, _ = _timeline(runs["ddp"], tmp_path / "t.trace.gz")
    gathered = gather(load_run_path(runs["ddp"], use_cache=False))
    start_ns = document["otherData"]["ranktrace_origin_ns"]
    steps = set(document["otherData"]["steps"])
    ops = gathered["ops"]
    window = ops[ops["step"].isin(steps) & (ops["instance"] >= 0)]
    waiting = window[(window["rank"] != window["last_rank"]) & (window["wait_ns"] > 0)]
    starts = [e for e in document["traceEvents"] if e["ph"] == "s"]
    ends = {e["id"]: e for e in document["traceEvents"] if e["ph"] == "f"}
    assert len(starts) == len(waiting) > 0
    for start in starts:
        end = ends[start["id"]]
        assert start["pid"] != end["pid"]
        assert start["name"].endswith(f"rank {start['pid']} arrived last")
    last_arrivals = sorted(round((t - start_ns) / 1e3, 3) for t in
                           waiting["last_arrival_ns"])
    assert sorted(s["ts"] for s in starts) == pytest.approx(last_arrivals, abs=EPS_US)


def test_a_rank_with_a_shifted_clock_is_put_back_on_the_common_clock(runs, tmp_path):
    shifted = shifted_copy(runs["ddp"], tmp_path / "shifted", rank=1, shift_ns=80_000_000)

    def marker_times(document):
        origin = document["otherData"]["ranktrace_origin_ns"]
        return {e["name"]: origin / 1e3 + e["ts"] for e in document["traceEvents"]
                if e.get("cat") == "step" and e["pid"] == 1}

    plain, _ = _timeline(runs["ddp"], tmp_path / "plain.trace.gz")
    moved, _ = _timeline(shifted, tmp_path / "moved.trace.gz")
    before, after = marker_times(plain), marker_times(moved)
    analysed = {f"step {s}" for s in plain["otherData"]["steps"]}
    assert analysed and analysed <= before.keys() & after.keys()
    # The collective-based estimate lands within a few ms of clock_sync, not 80 ms off.
    for name in analysed:
        assert abs(after[name] - before[name]) < 10_000, name


def test_a_file_over_the_size_limit_is_cut_to_fewer_steps_and_says_so(runs, tmp_path):
    full, _ = _timeline(runs["ddp"], tmp_path / "full.trace.gz", "--steps", "3-7")
    assert full["otherData"]["steps"] == [3, 4, 5, 6, 7]
    limit_mb = (tmp_path / "full.trace.gz").stat().st_size * 0.6 / 1e6
    cut, stderr = _timeline(runs["ddp"], tmp_path / "cut.trace.gz", "--steps", "3-7",
                            "--max-mb", f"{limit_mb:.6f}")
    kept = cut["otherData"]["steps"]
    assert kept and kept == [3, 4, 5, 6, 7][:len(kept)] and len(kept) < 5
    assert f"cut to steps {kept[0]}" in stderr and "--max-mb" in stderr
    assert (tmp_path / "cut.trace.gz").stat().st_size <= limit_mb * 1e6
    assert structural_problems(cut) == []


@pytest.mark.parametrize("folder", GPU_TRACES)
def test_real_gpu_traces_give_a_valid_timeline(folder, tmp_path):
    document, _ = _timeline(DATA / folder, tmp_path / "t.trace.gz")
    assert structural_problems(document) == []
    run = load_run_path(DATA / folder, use_cache=False)
    ranks = sorted(t.rank for t in run.ranks if t.rank is not None)
    names = {e["pid"]: e["args"]["name"] for e in document["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert names.pop(max(ranks) + 1, te.CRITICAL_PATH_PROCESS) == te.CRITICAL_PATH_PROCESS
    assert names == {r: f"rank {r}" for r in ranks}
    streams = [e["args"]["name"] for e in document["traceEvents"]
               if e["ph"] == "M" and e["name"] == "thread_name"]
    assert any(" stream " in s for s in streams)
    # Every kernel of the window is drawn, each once, on its rank's clock.
    gathered = gather(run)["ranks"]
    window = window_steps(gathered)
    start, end = int(window["start_ns"].min()), int(window["end_ns"].max())
    kernels = sum(int(((d["events"]["cat"] == "kernel") & (d["events"]["ts_ns"] < end)
                       & (d["events"]["end_ns"] > start)).sum()) for d in gathered.values())
    drawn = sum(e["cat"] == "kernel" for e in document["traceEvents"] if e["ph"] == "X")
    assert drawn == kernels > 0
