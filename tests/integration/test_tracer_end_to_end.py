"""The tracer end to end: run folders, what traced runs write, and how steps are counted. One
traced 2-rank DDP run (the shared run `ddp-bucket-hook`, which the TensorBoard tests read too)
is shared by the end-to-end checks. Options: tests/unit/tracer/options/test_config.py; the parts
on their own: tests/unit/tracer/ (one folder per folder of tracer/)."""

from __future__ import annotations

import importlib.util
import os
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from helpers import tracer_files as h
from helpers.launch import DDP, REPO, TINY, launch, torchrun_env
from helpers.runs import DDP_STEPS, RUNS
from tracer import schema
from tracer.options.config import TracerConfig
from tracer.session.run_folder import LaunchInfo, RunDirError, create_unique, resolve_run_dir
from tracer.session.script_end import NO_STEPS_HINT, summary_lines


# ---- run folders ----------------------------------------------------------------------------
def test_run_folders_get_a_suffix_instead_of_reusing_a_name(tmp_path):
    assert create_unique(str(tmp_path), "run") == str(tmp_path / "run")
    assert create_unique(str(tmp_path), "run") == str(tmp_path / "run-1")
    assert create_unique(str(tmp_path), "run") == str(tmp_path / "run-2")


def _launch(rank, attempt=0):
    return LaunchInfo(rank=rank, local_rank=rank, world_size=2, attempt=attempt, run_id="job",
                      agent_store=True, master_addr="x", master_port=1)


def test_ranks_agree_on_the_folder_rank_0_creates_through_the_store(tmp_path):
    store = dist.HashStore()
    (tmp_path / "run").mkdir()  # an earlier run: rank 0 must not reuse it, rank 1 must follow
    found = {}
    follower = threading.Thread(target=lambda: found.setdefault(
        1, resolve_run_dir(str(tmp_path), "run", "s.py", _launch(1), 10, store=store)))
    follower.start()
    found[0] = resolve_run_dir(str(tmp_path), "run", "s.py", _launch(0), 10, store=store)
    follower.join(10)
    assert found == {0: str(tmp_path / "run-1"), 1: str(tmp_path / "run-1")}
    # An elastic restart of the same job: a new folder named after the first attempt's.
    restarted = resolve_run_dir(str(tmp_path), "", "s.py", _launch(0, attempt=1), 10, store=store)
    assert restarted == str(tmp_path / "run-1-attempt1")
    assert resolve_run_dir(str(tmp_path), "", "s.py", _launch(1, attempt=1), 10,
                           store=store) == restarted


def test_other_ranks_learn_rank_0s_error_or_give_up_after_the_timeout(tmp_path):
    store = dist.HashStore()
    (tmp_path / "a-file").write_text("")
    with pytest.raises(RunDirError, match="is not a folder"):
        resolve_run_dir(str(tmp_path / "a-file"), "", "s.py", _launch(0), 10, store=store)
    with pytest.raises(RunDirError, match="rank 0 could not create the run folder: --out"):
        resolve_run_dir(str(tmp_path / "a-file"), "", "s.py", _launch(1), 10, store=store)
    with pytest.raises(RunDirError, match="waited 0.2 s for rank 0"):
        resolve_run_dir(str(tmp_path), "", "s.py", _launch(1, attempt=5), 0.2, store=store)


def test_default_run_name_is_a_timestamp_and_the_script_stem():
    stamp = time.mktime((2026, 3, 4, 5, 6, 7, 0, 0, -1))
    from tracer.session.run_folder import default_run_name

    assert default_run_name("workloads/ddp.py", stamp) == "20260304-050607-ddp"


# ---- single-process runs --------------------------------------------------------------------
def test_script_sees_the_same_argv_file_path_and_gets_identical_losses(tmp_path):
    args = ["--steps", "12", "--print-argv"]
    bare = launch(TINY, *args, "--losses", tmp_path / "bare")
    traced = launch(TINY, *args, "--losses", tmp_path / "traced",
                    tracer=["--out", tmp_path, "--skip-first", "2"])
    assert bare.returncode == 0 and traced.returncode == 0, traced.stderr
    # argv, __file__ and sys.path[0] are printed first; the losses are compared bit for bit.
    traced_stdout = traced.stdout.replace(str(tmp_path / "traced"), str(tmp_path / "bare"))
    assert traced_stdout == bare.stdout
    assert bare.stdout.startswith("argv ['tests/scripts/tiny_train.py', '--steps', '12', "
                                  f"'--print-argv', '--losses', '{tmp_path / 'bare'}'] file "
                                  f"{REPO / TINY} path0 {REPO / 'tests' / 'scripts'}\n")
    assert h.losses(tmp_path / "traced") == h.losses(tmp_path / "bare")
    assert len(h.losses(tmp_path / "bare")) == 12
    assert h.script_stderr(traced.stderr) == bare.stderr == ""


def test_tracer_step_drives_steps_without_an_optimizer(tmp_path):
    result = launch(TINY, "--steps", "5", "--manual-steps",
                    tracer=["--out", tmp_path, "--skip-first", "0", "--wait", "0", "--warmup", "0",
                            "--active", "2", "--record-shapes", "--no-sampler"])
    assert result.returncode == 0, result.stderr
    run_dir = h.only_run_dir(tmp_path)
    recorded = h.steps(run_dir, 0)
    assert [s.step for s in recorded] == [0, 1, 2, 3, 4]
    assert [s.in_profiler_window for s in recorded] == [True, True, False, False, False]
    (trace,) = h.traces(run_dir, 0)
    events = h.load_trace(trace)["traceEvents"]
    assert {e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")} == {
        "ProfilerStep#0", "ProfilerStep#1"}
    assert any("Input Dims" in e.get("args", {}) for e in events)  # --record-shapes reached it


def test_several_optimizers_count_one_step_each_time_round(tmp_path):
    result = launch(TINY, "--steps", "4", "--two-optimizers",
                    tracer=["--out", tmp_path, "--no-profiler", "--no-sampler"])
    assert result.returncode == 0, result.stderr
    run_dir = h.only_run_dir(tmp_path)
    assert [s.step for s in h.steps(run_dir, 0)] == [0, 1, 2, 3]
    assert h.run_end(run_dir, 0).steps == 4
    assert h.summaries(result.stderr)[0]["steps"] == "4"


def test_tracer_step_after_an_optimizer_step_is_the_same_step(tmp_path):
    result = launch(TINY, "--steps", "4", "--also-tracer-step",
                    tracer=["--out", tmp_path, "--no-profiler", "--no-sampler"])
    assert result.returncode == 0, result.stderr
    run_dir = h.only_run_dir(tmp_path)
    assert [s.step for s in h.steps(run_dir, 0)] == [0, 1, 2, 3]
    assert h.run_end(run_dir, 0).steps == 4


def test_a_run_without_marked_steps_keeps_its_comm_ops_and_says_how_to_mark_steps(tmp_path):
    result = launch(TINY, "--steps", "3", "--manual-steps", "--unmarked-steps", "--all-reduce-loss",
                    tracer=["--out", tmp_path, "--no-profiler", "--no-sampler"])
    assert result.returncode == 0, result.stderr
    summary = h.summaries(result.stderr)[0]
    assert (summary["steps"], summary["comm_ops"]) == ("0", "3")
    assert f"ranktrace: rank0 {NO_STEPS_HINT}\n" in result.stderr
    run_dir = h.only_run_dir(tmp_path)
    comms = h.read_jsonl(run_dir / schema.COMMS_FILE.format(rank=0), schema.CommRecord)
    assert [(c.op, c.step) for c in comms] == [("all_reduce", 0)] * 3


def test_a_spawned_process_that_is_no_rank_stays_quiet_and_the_launcher_trains_as_rank_0(
        tmp_path):
    # tiny_train.py --spawn 1: mp.spawn of a function that only prints, then training in the
    # launching process, which joins a process group: traced as rank 0 from there on.
    result = launch(TINY, "--steps", "2", "--spawn", "1",
                    tracer=["--out", tmp_path, "--no-profiler", "--no-sampler"], timeout=240)
    assert result.returncode == 0, result.stderr
    assert "spawned process 0" in result.stdout
    run_dir = h.only_run_dir(tmp_path)
    lines = [line for line in result.stderr.splitlines() if line.startswith("ranktrace:")]
    assert lines[1:] == [f"ranktrace: launcher ok started 1 process(es) (torch.multiprocessing, "
                         f"start method spawn) -> {run_dir}"]
    assert (h.summaries(lines[0])[0]["steps"], h.summaries(lines[0])[0]["run_dir"]) == (
        "2", str(run_dir))
    end = h.run_end(run_dir, 0)
    assert (end.untraced_processes, end.steps, end.world_size) == (0, 2, 1)
    (start,) = h.of_kind(h.manifest(run_dir, 0), schema.RunStart)
    launched, _ = h.read_jsonl(run_dir / schema.LAUNCHER_FILE, schema.LauncherRecord)
    assert start.launched_by is None and start.pid == launched.pid
    assert [p.name for p in run_dir.iterdir()
            if not p.name.startswith("rank0.") and not p.name.endswith(".rank0")] == [
        schema.LAUNCHER_FILE]


def test_ddp_bucket_hook_option_reaches_the_comms_recorder(tmp_path):
    counts, buckets = [], []
    for i, (option, env) in enumerate((([], {}), (["--ddp-bucket-hook"], {}),
                                       ([], {"RANKTRACE_DDP_BUCKET_HOOK": "1"}))):
        result = launch(TINY, "--steps", "2", "--ddp",
                        tracer=["--out", tmp_path, "--run-name", f"r{i}", "--no-profiler",
                                "--no-sampler", *option], env=torchrun_env(**env))
        assert result.returncode == 0, result.stderr
        counts.append(h.summaries(result.stderr)[0]["comm_ops"])
        (start,) = h.of_kind(h.manifest(tmp_path / f"r{i}", 0), schema.RunStart)
        buckets.append(start.ddp_buckets)
    # Every op, with the hook or without: DDP's parameter-shape check at construction (an
    # all_gather and a broadcast, torch's C++), its first parameter broadcast, one bucket
    # all-reduce per step (native records without the hook, the hook's with it: never both),
    # and the two broadcasts of its bucket rebuild after the first step.
    assert counts == ["7", "7", "7"]
    assert buckets == ["profiler windows", "comm hook", "comm hook"]


def _run_end(**fields) -> schema.RunEnd:
    base = dict(rank=1, end_ns=0, status="ok", exit_code=0, steps=5, windows=1, samples=40,
                comm_ops=7, bytes_written=2500, errors=0)
    return schema.RunEnd(**{**base, **fields})


def test_summary_line_reports_sustained_sampler_lag_and_no_step_hint():
    (line,) = summary_lines(_run_end(), "traces/x", kept=True)
    assert line == ("ranktrace: rank1 ok steps=5 windows=1 samples=40 comm_ops=7 "
                    "bytes_written=2.5 kB errors=0 -> traces/x")
    (line,) = summary_lines(_run_end(samples_missed_pct=37.5), "traces/x", kept=True)
    assert h.summaries(line)[1]["samples_missed"] == "37.5"
    line, hint = summary_lines(_run_end(steps=0), "traces/x", kept=True)
    assert hint == f"ranktrace: rank1 {NO_STEPS_HINT}" and "tracer.step()" in hint
    # A failed start that recorded nothing, or training in spawned processes: no step advice.
    (line,) = summary_lines(_run_end(steps=0, comm_ops=0, status="failed"), "traces/x", False)
    assert line.endswith("-> nothing recorded (no steps, comm ops or traces), run files removed")
    assert len(summary_lines(_run_end(steps=0, untraced_processes=2), "traces/x", True)) == 1


def test_no_scalars_writes_no_event_file_and_keeps_the_step_records(tmp_path):
    result = launch(TINY, "--steps", "3",
                    tracer=["--out", tmp_path, "--no-profiler", "--no-sampler", "--no-scalars"])
    assert result.returncode == 0, result.stderr
    run_dir = h.only_run_dir(tmp_path)
    assert not list(run_dir.glob("events.out.tfevents.*"))
    assert [s.step for s in h.steps(run_dir, 0)] == [0, 1, 2]
    (start,) = h.of_kind(h.manifest(run_dir, 0), schema.RunStart)
    assert start.config["no_scalars"] is True
    assert h.run_end(run_dir, 0).status == "ok"


def test_samples_per_step_from_the_option_then_from_the_script(tmp_path):
    # The option gives 48 from the start; the script says 40 at the start of step 2, so every
    # step from 2 on ends with 40.
    result = launch(TINY, "--steps", "6", "--set-samples", "2=40", "--losses", tmp_path / "l",
                    tracer=["--out", tmp_path, "--no-profiler", "--no-sampler",
                            "--samples-per-step", 48])
    assert result.returncode == 0, result.stderr
    run_dir = h.only_run_dir(tmp_path)
    assert [s.samples for s in h.steps(run_dir, 0)] == [48, 48, 40, 40, 40, 40]
    (start,) = h.of_kind(h.manifest(run_dir, 0), schema.RunStart)
    assert start.config["samples_per_step"] == 48
    untraced = launch(TINY, "--steps", "6", "--set-samples", "2=40", "--losses", tmp_path / "u")
    assert untraced.returncode == 0, untraced.stderr  # a no-op without the tracer
    assert h.losses(tmp_path / "l") == h.losses(tmp_path / "u")


def test_set_samples_per_step_checks_its_argument_traced_or_not():
    import tracer

    for bad in (-1, 2.5, True, "8"):
        with pytest.raises(ValueError, match="integer >= 0"):
            tracer.set_samples_per_step(bad)
    tracer.set_samples_per_step(8)  # not traced: nothing happens


# ---- the shared traced DDP run --------------------------------------------------------------
@pytest.fixture(scope="module")
def ddp_run(shared_runs):
    # With --ddp-bucket-hook every gradient bucket is recorded (and its reduction must leave the
    # losses bit-identical); the default, buckets in the profiler windows only, is covered by
    # the unchanged-training tests. (--record-shapes is for the TensorBoard tests.)
    run = shared_runs["ddp-bucket-hook"]
    assert RUNS[run.name].args == ("--steps", str(DDP_STEPS))
    return run.result, run.run_dir, run.saved


def test_ddp_losses_and_weights_are_identical_without_the_tracer(ddp_run, tmp_path):
    _, _, traced_file = ddp_run
    bare = launch(DDP, "--steps", DDP_STEPS, "--save", tmp_path / "bare.pt", nproc=2)
    assert bare.returncode == 0, bare.stderr[-3000:]
    traced = torch.load(traced_file, weights_only=True)
    untraced = torch.load(tmp_path / "bare.pt", weights_only=True)
    assert len(untraced["losses"]) == DDP_STEPS
    assert torch.equal(traced["losses"], untraced["losses"])
    assert untraced["params"].keys() == traced["params"].keys()
    for name, value in untraced["params"].items():
        assert torch.equal(traced["params"][name], value), name


def test_ddp_run_folder_holds_every_file_and_nothing_half_written(ddp_run):
    result, run_dir, _ = ddp_run
    assert h.temp_files(run_dir) == []
    names = {p.name for p in run_dir.iterdir()}
    for rank in (0, 1):
        assert schema.MANIFEST_FILE.format(rank=rank) in names
        assert schema.STEPS_FILE.format(rank=rank) in names
        assert any(n.startswith("events.out.tfevents.") and n.endswith(f".rank{rank}")
                   for n in names)
        if importlib.util.find_spec("tracer.comms"):
            assert schema.COMMS_FILE.format(rank=rank) in names
        if importlib.util.find_spec("tracer.probes.device_sampler"):
            assert schema.SAMPLES_FILE.format(rank=rank) in names
    # HTA and torch-tb-profiler load every .json/.gz in the folder as a trace.
    strays = [
        n for n in names if n.endswith((".json", ".gz")) and not schema.KINETO_TRACE_RE.match(n)
    ]
    assert strays == []


def test_ddp_traces_one_window_per_rank_with_gloo_all_reduce_and_distributed_info(ddp_run):
    _, run_dir, _ = ddp_run
    for rank in (0, 1):
        (trace_file,) = h.traces(run_dir, rank)
        trace = h.load_trace(trace_file)
        info = trace["distributedInfo"]
        assert (info["rank"], info["world_size"], info["backend"]) == (rank, 2, "gloo")
        names = {e.get("name") for e in trace["traceEvents"]}
        assert "gloo:all_reduce" in names
        # Defaults: skip 5 steps, wait 1, warm up 1, keep 3 -> steps 7, 8 and 9.
        assert {n for n in names if n and n.startswith("ProfilerStep#")} == {
            "ProfilerStep#7", "ProfilerStep#8", "ProfilerStep#9"}


def test_ddp_steps_carry_times_memory_and_their_comm_ops(ddp_run):
    _, run_dir, _ = ddp_run
    for rank in (0, 1):
        recorded = h.steps(run_dir, rank)
        assert [s.step for s in recorded] == list(range(DDP_STEPS))
        assert [s.step for s in recorded if s.in_profiler_window] == [6, 7, 8, 9]
        for before, after in zip(recorded, recorded[1:]):
            assert before.start_ns < before.end_ns <= after.start_ns
        assert all(s.rss_bytes > 50_000_000 for s in recorded)
        assert all(s.cuda_peak_allocated_bytes is None for s in recorded)
        # every step used CPU, and no more than the process's CPUs could give it in the step
        start, = h.of_kind(h.manifest(run_dir, rank), schema.RunStart)
        assert all(0 < s.cpu_ns <= (s.end_ns - s.start_ns) * start.cpus + 5_000_000
                   for s in recorded)
        end = h.run_end(run_dir, rank)
        if importlib.util.find_spec("tracer.comms"):
            assert all(s.comm_ops >= 1 and s.comm_bytes > 0 for s in recorded)
            assert sum(s.comm_ops for s in recorded) == end.comm_ops
            comms = h.read_jsonl(run_dir / schema.COMMS_FILE.format(rank=rank), schema.CommRecord)
            assert len(comms) == end.comm_ops
            assert {c.step for c in comms if c.op == "all_reduce"} == set(range(DDP_STEPS))


def test_ddp_scalars_get_every_step_and_every_sample(ddp_run):
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event

    _, run_dir, _ = ddp_run
    for rank in (0, 1):
        (events_file,) = run_dir.glob(f"events.out.tfevents.*.rank{rank}")
        points: dict[str, list] = {}
        for raw in RawEventFileLoader(str(events_file)).Load():
            event = Event.FromString(raw)
            for value in event.summary.value:
                points.setdefault(value.tag, []).append((event.step, value.simple_value))
        steps = h.steps(run_dir, rank)
        times = points[f"rank{rank}/step/time_ms"]
        assert [step for step, _ in times] == list(range(DDP_STEPS))
        for (_, ms), record in zip(times, steps):
            assert ms == pytest.approx((record.end_ns - record.start_ns) / 1e6, rel=1e-5)
        if importlib.util.find_spec("tracer.probes.device_sampler"):
            assert len(points[f"rank{rank}/samples/train_step"]) == h.run_end(run_dir, rank).samples


def test_ddp_manifest_describes_the_run_and_its_clock_offsets(ddp_run):
    result, run_dir, _ = ddp_run
    summary = h.summaries(result.stderr)
    for rank in (0, 1):
        records = h.manifest(run_dir, rank)
        start, = h.of_kind(records, schema.RunStart)
        assert records[0] is start
        assert (start.rank, start.local_rank, start.world_size) == (rank, rank, 2)
        assert start.run_name == run_dir.name and start.script == DDP
        assert start.script_args == [
            "--steps",
            str(DDP_STEPS),
            "--save",
            str(run_dir.parent.parent / "out.pt"),
        ]
        assert "tracer.record" in start.argv and start.torch_version == torch.__version__
        assert start.config["active"] == TracerConfig().active and start.attempt == 0
        assert start.device_type == "cpu"
        assert start.cpu_ids == sorted(os.sched_getaffinity(0)) and start.cpus == len(start.cpu_ids)
        clock, = h.of_kind(records, schema.ClockSync)
        assert (clock.rank, clock.backend, clock.world_size) == (rank, "gloo", 2)
        if rank == 0:
            assert (clock.offset_ns, clock.uncertainty_ns, clock.round_trips) == (0, 0, 0)
        else:
            # Both ranks read the same host clock: the true offset is 0, within the bound.
            assert clock.round_trips == 8 and clock.uncertainty_ns > 0
            assert abs(clock.offset_ns) <= clock.uncertainty_ns
        errors = h.of_kind(records, schema.TracerError)
        assert errors == []
        end = records[-1]
        assert isinstance(end, schema.RunEnd)
        assert (end.status, end.exit_code, end.steps, end.windows, end.errors) == (
            "ok",
            0,
            DDP_STEPS,
            1,
            0,
        )
        assert (end.backend, end.world_size) == ("gloo", 2)
        # Everything this rank wrote, except the run_end line itself, is counted.
        rank_files = [p for p in run_dir.iterdir()
                      if p.name.startswith(f"rank{rank}.") or p.name.endswith(f".rank{rank}")]
        end_line = (
            (run_dir / schema.MANIFEST_FILE.format(rank=rank)).read_bytes().splitlines(True)[-1]
        )
        assert end.bytes_written == sum(p.stat().st_size for p in rank_files) - len(end_line)
        if importlib.util.find_spec("tracer.probes.device_sampler"):
            assert start.sampler_source == "psutil" and end.samples > 0
            samples = h.read_jsonl(run_dir / schema.SAMPLES_FILE.format(rank=rank))
            assert len(samples) == end.samples
        line = summary[rank]
        assert (line["status"], line["steps"], line["windows"], line["errors"]) == (
            "ok",
            "20",
            "1",
            "0",
        )
        assert (int(line["samples"]), int(line["comm_ops"])) == (end.samples, end.comm_ops)
        assert Path(line["run_dir"]) == run_dir


def test_trace_format_doc_describes_every_field_and_file():
    doc = (REPO / "docs" / "trace-format.md").read_text()
    for record_type in (schema.CommRecord, schema.DeviceSample, schema.StepRecord,
                        schema.RunStart, schema.ClockSync, schema.TracerError, schema.RunEnd,
                        schema.Launch, schema.LaunchEnd,
                        schema.MemoryProfileRecord, schema.MemorySnapshotRecord,
                        schema.SnapshotSegment, schema.SnapshotBlock, schema.OutOfMemory):
        for field in record_type.__struct_fields__:
            assert f"| `{field}` |" in doc, f"{record_type.__name__}.{field} is not in the table"
    for pattern in (schema.MANIFEST_FILE, schema.COMMS_FILE, schema.SAMPLES_FILE,
                    schema.STEPS_FILE, schema.MEMORY_SNAPSHOT_FILE,
                    schema.MEMORY_SNAPSHOT_RECORD_FILE, schema.MEMORY_PROFILE_FILE):
        assert pattern.format(rank="{R}", step="{S}") in doc
    assert f"`{schema.LAUNCHER_FILE}`" in doc
    assert schema.kineto_trace_file(7, 0).replace("rank7.0.", "rank{R}.<span>.") in doc
    for status in schema.RUN_STATUSES:
        assert f"`{status}`" in doc
