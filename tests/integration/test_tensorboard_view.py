"""A run recorded by the tracer, viewed through a real TensorBoard on loopback.

The shared run `ddp-bucket-hook` (tests/helpers/runs.py: `torchrun --nproc-per-node 2 -m
tracer.record --ddp-bucket-hook --record-shapes workloads/ddp.py --steps 20`, gloo, CPU) writes
`<logdir>/ddp-bucket-hook/`; TensorBoard then must show torch-tb-profiler's run with workers
rank0 and rank1, answer its distributed view with data for both (checked against our own trace,
step and comm files), and list our per-rank scalars under the same run name.
"""

import gzip
import importlib.util
import json
import os
from pathlib import Path

import pytest

from helpers.launch import REPO
from helpers.runs import DDP_STEPS, RUNS
from tracer import schema
from tracer.parts.tensorboard_scalars import ScalarsWriter
from tracer.schema import StepRecord

_spec = importlib.util.spec_from_file_location("tb_profiler_view",
                                               REPO / "benchmarks" / "tb_profiler_view.py")
tb_view = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tb_view)

RUN = "ddp-bucket-hook"
STEPS = DDP_STEPS
# The tracer's default profiler window: steps 0-4 skipped, 5 waits, 6 warms up, 7-9 are in the
# trace, one window.
PROFILED_STEPS = ["7", "8", "9"]
HIDDEN, LAYERS = 256, 4  # ddp.py's defaults: the run sets neither


def gradient_bytes() -> int:
    """What DDP all-reduces per step: every parameter's float32 gradient, once."""
    blocks = LAYERS * 2 * (HIDDEN * HIDDEN + HIDDEN)
    head = HIDDEN * 10 + 10
    return 4 * (blocks + head)


@pytest.fixture(scope="module")
def recorded_run(shared_runs):
    # --record-shapes: the plugin's comm ops table takes message sizes from operator shapes.
    assert "--record-shapes" in RUNS[RUN].tracer
    assert not {"--hidden", "--layers", "--skip-first", "--active"} & set(RUNS[RUN].args
                                                                          + RUNS[RUN].tracer)
    return shared_runs[RUN].run_dir


@pytest.fixture(scope="module")
def tensorboard(recorded_run):
    # The logdir is the run's own --out, which holds this run only.
    with tb_view.TensorBoard(str(recorded_run.parent)) as tb:
        tb_view.wait_for_profiler_run(tb, RUN, timeout_s=60)
        yield tb


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def trace_steps_us(run_dir: Path, rank: int) -> dict:
    """ProfilerStep#N -> its duration (us), read from our own Kineto trace."""
    (name,) = [n for n in os.listdir(run_dir) if n.startswith(f"rank{rank}.")
               and schema.KINETO_TRACE_RE.match(n)]
    with gzip.open(run_dir / name) as f:
        events = json.load(f)["traceEvents"]
    return {e["name"].split("#")[1]: e["dur"] for e in events
            if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#")}


def test_run_folder_holds_one_trace_and_one_event_file_per_rank(recorded_run):
    names = sorted(os.listdir(recorded_run))
    traces = [n for n in names if schema.KINETO_TRACE_RE.match(n)]
    events = [n for n in names if "tfevents" in n]
    assert [schema.KINETO_TRACE_RE.match(n)["worker"] for n in traces] == ["rank0", "rank1"]
    assert sorted(n.rsplit(".", 1)[1] for n in events) == ["rank0", "rank1"]
    assert not [n for n in names if n.endswith((".json", ".gz")) and n not in traces]


def test_both_plugins_are_active(tensorboard):
    plugins = tensorboard.get("/data/plugins_listing")
    assert plugins["pytorch_profiler"]["enabled"] is True
    assert plugins["scalars"]["enabled"] is True


def test_profiler_lists_run_with_both_workers(tensorboard):
    assert RUN in tensorboard.get(tb_view.PROFILER_API + "/runs")["runs"]
    views = tensorboard.get(tb_view.PROFILER_API + "/views", run=RUN)
    assert views[:2] == ["Overview", "Operator"] and "Distributed" in views
    assert tensorboard.get(tb_view.PROFILER_API + "/workers", run=RUN,
                           view="Overview") == ["rank0", "rank1"]
    assert tensorboard.get(tb_view.PROFILER_API + "/workers", run=RUN,
                           view="Distributed") == ["All"]
    for worker in ("rank0", "rank1"):
        assert tensorboard.get(tb_view.PROFILER_API + "/spans", run=RUN, worker=worker) == ["1"]
        overview = tensorboard.get(tb_view.PROFILER_API + "/overview", run=RUN, worker=worker,
                                   span="1")
        assert [row[0] for row in overview["steps"]["rows"]] == PROFILED_STEPS
        assert {"title": "Number of Worker(s)", "value": "2"} in overview["environments"]


def test_distributed_overlap_has_both_workers_and_adds_up_to_our_steps(tensorboard,
                                                                        recorded_run):
    view = tb_view.distributed_view(tensorboard, RUN)
    assert list(view) == ["1"]
    overlap = view["1"]["overlap"]
    assert overlap["metadata"]["legends"] == list(tb_view.OVERLAP_LEGENDS)
    assert overlap["metadata"]["units"] == "us"
    assert list(overlap["data"]) == ["all"] + PROFILED_STEPS
    for rank in (0, 1):
        worker = f"rank{rank}"
        steps_us = trace_steps_us(recorded_run, rank)
        for step in PROFILED_STEPS:
            computation, overlapping, communication, other = overlap["data"][step][worker]
            assert min(computation, overlapping, communication, other) >= 0
            assert computation + overlapping > 0  # forward, backward and SGD ran
            assert overlapping + communication > 0  # and DDP all-reduced the gradients
            # The four parts tile the step, which is our ProfilerStep#N span on a CPU run.
            assert computation + overlapping + communication + other == pytest.approx(
                steps_us[step], rel=1e-6, abs=1.0)
        mean = overlap["data"]["all"][worker]
        for i in range(4):
            assert mean[i] == int(sum(overlap["data"][s][worker][i] for s in PROFILED_STEPS)
                                  / len(PROFILED_STEPS))
    print("\n" + tb_view.format_view(RUN, view))


def test_distributed_wait_time_and_comm_ops(tensorboard, recorded_run):
    view = tb_view.distributed_view(tensorboard, RUN)["1"]
    ops = view["commops"]["data"]
    assert list(ops) == ["rank0", "rank1"]
    rows = {}
    for rank in (0, 1):
        worker = f"rank{rank}"
        columns = [c["name"] for c in ops[worker]["columns"]]
        (rows[worker],) = [dict(zip(columns, r)) for r in ops[worker]["rows"]]
        assert rows[worker]["Name"] == "gloo:all_reduce"
        # However DDP buckets them, every gradient is all-reduced once per step.
        assert rows[worker]["Calls"] >= len(PROFILED_STEPS)
        assert rows[worker]["Total Size (bytes)"] == len(PROFILED_STEPS) * gradient_bytes()
        assert rows[worker]["Total Latency (us)"] >= rows[worker]["Data Transfer Time (us)"] > 0
        # The same ops as our collective hooks recorded in those steps (once the tracer has them).
        ours = [r for r in read_jsonl(recorded_run / schema.COMMS_FILE.format(rank=rank))
                if r["op"] == "all_reduce" and str(r["step"]) in PROFILED_STEPS]
        if ours:
            assert rows[worker]["Calls"] == len(ours)
            assert rows[worker]["Total Size (bytes)"] == sum(r["bytes"] for r in ours)
    assert rows["rank0"]["Calls"] == rows["rank1"]["Calls"]
    # (The plugin takes the faster rank's time of each op as both ranks' transfer time, but only
    # for ops it files under the same step on both ranks; on a loaded machine gloo's thread can
    # end an op after its ProfilerStep on one rank only, so the two totals need not agree.)

    wait = view["waittime"]["data"]
    assert wait["all"].keys() == {"rank0", "rank1"}
    for worker in ("rank0", "rank1"):
        # Per step; an op whose recorded end (on gloo's thread) falls after its ProfilerStep's
        # end, which a busy machine makes happen, is filed under step "null".
        per_step = [wait[step][worker] for step in wait if step != "all" and worker in wait[step]]
        assert set(wait) - {"all", "null"} <= set(PROFILED_STEPS)
        # The plugin merges the ops' time ranges step by step for these, and over all steps for
        # the op table: ranges of two steps that overlap (gloo's thread still in an op when the
        # next began, on a busy machine) count once there, so the steps can only sum to more.
        transfer_total = sum(transfer for transfer, _ in per_step)
        latency_total = sum(transfer + sync for transfer, sync in per_step)
        assert transfer_total >= rows[worker]["Data Transfer Time (us)"] * (1 - 1e-6)
        assert latency_total >= rows[worker]["Total Latency (us)"] * (1 - 1e-6)
        assert latency_total >= transfer_total > 0
        assert min(sync for _, sync in per_step) >= 0
    # A CPU run has no device properties, and the plugin answers null.
    assert view["gpuinfo"] is None


def test_scalars_listed_under_the_profiler_run(tensorboard, recorded_run):
    def tags():
        listed = tensorboard.get("/data/plugin/scalars/tags").get(RUN, {})
        return listed if {"rank0/step/time_ms", "rank1/step/time_ms"} <= set(listed) else None
    listed = tensorboard.wait_for("both ranks' scalars", tags, timeout_s=30)
    for rank in (0, 1):
        assert {f"rank{rank}/step/time_ms", f"rank{rank}/comm/ops",
                f"rank{rank}/comm/volume_mb"} <= set(listed)
        steps = read_jsonl(recorded_run / schema.STEPS_FILE.format(rank=rank))
        assert [s["step"] for s in steps] == list(range(STEPS))
        points = tensorboard.get("/data/plugin/scalars/scalars", run=RUN,
                                 tag=f"rank{rank}/step/time_ms")
        # [wall time, step, value]: our steps file, as TensorBoard shows it.
        assert [p[1] for p in points] == list(range(STEPS))
        assert [p[2] for p in points] == [
            pytest.approx((s["end_ns"] - s["start_ns"]) / 1e6, rel=1e-6) for s in steps]
        assert [p[0] for p in points] == [pytest.approx(s["end_ns"] / 1e9, abs=1e-3)
                                          for s in steps]
        if all("rss_bytes" in s for s in steps):
            points = tensorboard.get("/data/plugin/scalars/scalars", run=RUN,
                                     tag=f"rank{rank}/memory/rss_mib")
            assert [p[2] for p in points] == [
                pytest.approx(s["rss_bytes"] / 2**20, rel=1e-6) for s in steps]


def test_scalars_of_ranks_writing_at_once_show_while_running(tensorboard, recorded_run):
    """Both ranks' event files grow side by side in one folder; TensorBoard follows both."""
    live = recorded_run.parent / "live"
    writers = [ScalarsWriter(str(live), rank, flush_s=0.0) for rank in (0, 1)]

    def points(rank):
        try:
            return len(tensorboard.get("/data/plugin/scalars/scalars", run="live",
                                       tag=f"rank{rank}/step/time_ms"))
        except tb_view.TensorBoardError:  # run or tag not loaded yet
            return 0

    try:
        written = 0
        for upto in (1, 3):  # a first step, then two more, as a run goes on
            for step in range(written, upto):
                for rank, writer in enumerate(writers):
                    writer.add_step(StepRecord(step=step, start_ns=0, end_ns=(rank + 1) * 10**6),
                                    comm_algbw_gbps=None)
            written = upto
            tensorboard.wait_for(
                f"{upto} steps of both ranks",
                lambda upto=upto: points(0) == upto and points(1) == upto,
                timeout_s=30,
            )
    finally:
        for writer in writers:
            writer.close()
    assert [w.error for w in writers] == [None, None]


def test_our_cpu_breakdown_against_the_plugins_distributed_view(tensorboard, recorded_run):
    """The differences docs/viewing.md explains, per rank and step, on the same trace:
    - idle is the plugin's Other: both are step time that no op and no communication fills;
    - the plugin's computation is every cpu_op on any thread, including the c10d dispatcher op
      and an autograd op blocked inside it, so its Computation + Overlapping is at least our
      compute + overlap (ours leaves out the time the training thread sits in a comm op);
    - its communication is the gloo:* ranges alone, so ours (which adds the host-side c10d ops
      and record_param_comms) covers at least as much.
    """
    from analysis.ingest.load import load_path
    from analysis.rank.step_breakdown import breakdown_per_step

    overlap = tb_view.distributed_view(tensorboard, RUN)["1"]["overlap"]["data"]
    traces = load_path(recorded_run, use_cache=False).ranks
    assert sorted(t.rank for t in traces) == [0, 1]
    for trace in traces:
        ours = breakdown_per_step(trace).set_index("step")
        worker = f"rank{trace.rank}"
        for step in PROFILED_STEPS:
            computation, overlapping, communication, other = overlap[step][worker]
            row = ours.loc[int(step)]
            us = 1000.0
            assert row["idle_ns"] / us == pytest.approx(other, abs=1.5)
            computing_us = (row["compute_only_ns"] + row["overlap_ns"]) / us
            communicating_us = (row["comm_only_ns"] + row["overlap_ns"]) / us
            assert computing_us <= computation + overlapping + 1.5
            assert communicating_us >= communication + overlapping - 1.5
