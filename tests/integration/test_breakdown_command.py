"""`python -m analysis.breakdown`: formats, options, exit codes, and a real 2-rank traced run
(the shared run `ddp-late-window`, tests/helpers/runs.py)."""

import csv
import json
from pathlib import Path

import pandas as pd
import pytest

from analysis import breakdown as cli
from analysis.rank.layers import PARTS
from helpers.launch import DATA, run_module
from helpers.run_copies import copy_run
from helpers.synthetic import TraceBuilder, trace_name

REFERENCE = DATA / "hta-0.5.0-reference.csv"
PARTS = PARTS


def run_cli(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def small_run(folder: Path, ranks=(0, 1), world_size=2, steps=(1, 2, 3)) -> Path:
    for rank in ranks:
        b = TraceBuilder(rank=rank, world_size=world_size)
        for n in steps:
            t = (n - 1) * 100
            b.step(n, t, t + 100).compute(t + 10, t + 40, launch_at=t + 5)
            b.nccl(t + 30, t + 60 + rank, launch_at=t + 6)
        b.write(folder / trace_name(rank))
    return folder


# ---- JSON --------------------------------------------------------------------------------------
def test_json_document_on_a_real_multi_rank_trace(capsys):
    code, out, err = run_cli(capsys, DATA / "hta/trace_filter", "--format", "json",
                             "--no-cache")
    assert code == 0
    doc = json.loads(out)
    assert doc["schema_version"] == 1 and doc["run"]["world_size"] == 128
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    with REFERENCE.open() as handle:
        reference = {int(float(r["rank"])): r for r in csv.DictReader(handle)
                     if r["trace_dir"] == "trace_filter"}
    for rank in doc["ranks"]:
        hta, expected = rank["hta_compatible"], reference[rank["rank"]]
        kernel_time = float(expected["kernel_time_us"])
        for key in ("idle_us", "compute_us", "non_compute_us", "kernel_time_us"):
            assert abs(hta[key] - float(expected[key])) <= 0.01 * kernel_time
        totals = rank["breakdown"]
        assert sum(totals[p] for p in PARTS) == totals["step_ns"]
        assert rank["steps_analysed"] == [551, 552]
    assert "ranks 2-127 of world size 128" in " ".join(doc["problems"])
    assert "ranks 2-127" in err  # problems are also warned about on stderr
    assert {s["step"] for s in doc["steps"]} == {551, 552}


def test_json_on_cpu_only_trace_has_null_hta_columns_with_a_note(capsys):
    code, out, _ = run_cli(capsys, DATA / "hta/cpu_only", "--format", "json", "--no-cache")
    assert code == 0
    rank, = json.loads(out)["ranks"]
    assert rank["rank"] == 34 and rank["breakdown"]["kind"] == "cpu"
    assert rank["hta_compatible"]["kernel_time_us"] is None and rank["hta_compatible"]["note"]


# ---- selections ----------------------------------------------------------------------------------
def test_steps_and_hta_compatible_selection(capsys, tmp_path):
    run = small_run(tmp_path / "run")
    code, out, _ = run_cli(capsys, run, "--format", "json", "--steps", "2-3")
    assert code == 0
    assert [r["steps_analysed"] for r in json.loads(out)["ranks"]] == [[2, 3], [2, 3]]
    code, out, _ = run_cli(capsys, run, "--format", "json", "--hta-compatible")
    doc = json.loads(out)
    assert doc["selection"]["hta_compatible"] is True
    assert [r["steps_analysed"] for r in doc["ranks"]] == [[1, 2], [1, 2]]


def test_bad_step_spec_is_a_usage_error(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([str(small_run(tmp_path / "run")), "--steps", "7-3"])
    assert exit_info.value.code == 2
    assert "--steps" in capsys.readouterr().err


def test_all_runs_and_named_run(capsys, tmp_path):
    small_run(tmp_path / "runs" / "a", ranks=(0,), world_size=1)
    small_run(tmp_path / "runs" / "b", ranks=(0,), world_size=1, steps=(1, 2))
    code, out, _ = run_cli(capsys, tmp_path / "runs", "--all", "--format", "json")
    assert code == 0
    assert sorted(r["run"]["name"] for r in json.loads(out)["runs"]) == ["a", "b"]
    code, out, _ = run_cli(capsys, tmp_path / "runs", "--run", "b", "--format", "json")
    assert json.loads(out)["ranks"][0]["steps_analysed"] == [1, 2]


# ---- CSV and text -----------------------------------------------------------------------------
def test_out_dir_gets_every_table_as_csv(capsys, tmp_path):
    run = small_run(tmp_path / "run")
    code, out, _ = run_cli(capsys, run, "--out", tmp_path / "csv")
    assert code == 0 and out.startswith("ranktrace: run: 2 of 2 ranks")
    written = {p.name for p in (tmp_path / "csv").iterdir()}
    assert {"per_step.csv", "rank_totals.csv", "hta_compatible.csv", "idle.csv",
            "idle_gaps.csv"} <= written
    per_step = pd.read_csv(tmp_path / "csv" / "per_step.csv")
    assert len(per_step) == 6
    assert (per_step[PARTS].sum(axis=1) == per_step["step_ns"]).all()
    # step 1 of rank 1: compute 10-40, nccl 30-61 -> 20 us alone, 10 overlap, 21 comm alone
    row = per_step[(per_step["rank"] == 1) & (per_step["step"] == 1)].iloc[0]
    assert (row["compute_only_ns"], row["overlap_ns"], row["comm_only_ns"]) == (20000, 10000, 21000)


def test_out_dir_gets_the_cross_rank_tables(capsys, tmp_path):
    code, _, _ = run_cli(capsys, small_run(tmp_path / "run"), "--out", tmp_path / "csv")
    assert code == 0
    waits = pd.read_csv(tmp_path / "csv" / "cross_rank_waits.csv")
    # The NCCL kernels start 30 us into each step and end at 60 (rank 0) and 61 us (rank 1):
    # completions put rank 1's clock 1 us ahead, so its kernel began 1 us before rank 0's and
    # waited that 1 us; both then transfer 30 us.
    clock = pd.read_csv(tmp_path / "csv" / "cross_rank_clock.csv")
    assert clock[["rank", "offset_ns", "source"]].values.tolist() == [
        [0, 0, "reference"], [1, 1000, "collectives"]]
    assert waits[["rank", "step"]].values.tolist() == [[0, 1], [0, 2], [0, 3],
                                                        [1, 1], [1, 2], [1, 3]]
    assert waits["wait_for_peers_ms"].tolist() == [0.0] * 3 + [0.001] * 3
    assert waits["transfer_ms"].tolist() == [0.03] * 6


def test_html_report_per_run_with_its_path_on_stderr(capsys, tmp_path):
    small_run(tmp_path / "runs" / "a", ranks=(0,), world_size=1)
    small_run(tmp_path / "runs" / "b", ranks=(0,), world_size=1, steps=(1, 2))
    code, _, err = run_cli(capsys, tmp_path / "runs", "--all", "--html", tmp_path / "r.html")
    assert code == 0
    for name in ("a", "b"):
        page = (tmp_path / f"{name}-r.html").read_text()
        assert page.startswith("<!DOCTYPE html>") and f"ranktrace report: {name}<" in page
        assert f"ranktrace: HTML report written to {tmp_path / f'{name}-r.html'}" in err
    assert not (tmp_path / "r.html").exists()
    code, _, err = run_cli(capsys, small_run(tmp_path / "one"), "--html", tmp_path / "one.html")
    assert code == 0 and (tmp_path / "one.html").is_file()


def test_an_unwritable_html_target_is_an_error_line_and_a_problem(capsys, tmp_path):
    (tmp_path / "file").write_text("")
    target = tmp_path / "file" / "r.html"
    run = small_run(tmp_path / "run")
    code, _, err = run_cli(capsys, run, "--html", target)
    assert code == 0
    assert f"ranktrace: error: --html {target}: cannot write (Not a directory)" in err
    code, _, _ = run_cli(capsys, run, "--html", target, "--strict")
    assert code == 1


def test_progress_is_told_the_files_and_the_per_rank_phases(capsys, tmp_path, monkeypatch):
    told = []

    class Recording(cli.Progress):
        def __call__(self, done, total):
            told.append(("files", done, total))

        def over(self, items, phase, unit="rank"):
            items = list(items)
            told.append((phase, len(items)))
            return items

    monkeypatch.setattr(cli, "Progress", Recording)
    code, _, _ = run_cli(capsys, small_run(tmp_path / "run"), "--jobs", "1")
    assert code == 0
    assert told == [("files", 1, 2), ("files", 2, 2), ("time breakdown", 2), ("idle gaps", 2),
                    ("collectives", 2)]


def test_csv_format_prints_the_per_step_table(capsys, tmp_path):
    code, out, _ = run_cli(capsys, small_run(tmp_path / "run"), "--format", "csv")
    assert code == 0
    lines = out.strip().splitlines()
    assert lines[0].startswith("rank,step,step_ns,compute_only_ns") and len(lines) == 7


def test_the_default_text_report_is_one_screen_opening_on_the_verdict(capsys, tmp_path):
    code, out, _ = run_cli(capsys, small_run(tmp_path / "run"))
    lines = out.splitlines()
    assert code == 0 and len(lines) <= 40 and max(map(len, lines)) <= 100
    assert lines[2].startswith("  Limits the step: ")
    assert any(line.startswith("  Waiting: ") for line in lines[3:6])
    assert "Per step (ms)" not in out and lines[-1].startswith("More: --full")


def test_the_full_text_report_has_every_section(capsys, tmp_path):
    code, out, _ = run_cli(capsys, small_run(tmp_path / "run"), "--full")
    assert code == 0
    for heading in ("Time breakdown per rank", "Per step (ms)", "HTA-compatible",
                    "Idle time by what the host was doing"):
        assert heading in out
    lines = out.splitlines()  # the first screen: the title, the run, then the verdict
    assert lines[3] == "Verdict"
    assert lines[4].startswith("  Limits the step: ") and lines[5].startswith("  Waiting: ")
    assert lines.index("Verdict") < lines.index("Time breakdown per rank (share of step time)")


def test_a_rank_missing_from_the_run_is_a_note_not_a_finding(capsys, tmp_path):
    code, out, _ = run_cli(capsys, small_run(tmp_path / "partial", ranks=(0,), world_size=2),
                           "--full")
    assert code == 0
    notes = out[out.index("Notes (what could not be told; not ranked)"):]
    assert notes.splitlines()[1] == "  - 1 of 2 ranks analysed (ranks 0)"
    assert "1 of 2 ranks analysed" not in out[out.index("Bottlenecks"):out.index("Notes")]


# ---- exit codes --------------------------------------------------------------------------------
def test_empty_folder_exits_non_zero_naming_it(capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    code, out, err = run_cli(capsys, tmp_path / "empty")
    assert code == 1 and out == ""
    assert "nothing analysed" in err and str(tmp_path / "empty") in err


def test_only_broken_traces_exit_non_zero_with_the_reason(capsys, tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "rank0.1.pt.trace.json").write_text("{not json")
    code, _, err = run_cli(capsys, tmp_path / "run")
    assert code == 1 and "invalid JSON" in err and "rank0.1.pt.trace.json" in err


def test_strict_fails_on_any_problem_and_passes_without(capsys, tmp_path):
    missing_rank = small_run(tmp_path / "partial", ranks=(0,), world_size=2)
    assert run_cli(capsys, missing_rank)[0] == 0
    code, _, err = run_cli(capsys, missing_rank, "--strict")
    assert code == 1 and "--strict" in err
    complete = small_run(tmp_path / "complete")
    assert run_cli(capsys, complete, "--strict")[0] == 0


def test_module_entry_point(tmp_path, capsys):
    run = small_run(tmp_path / "run")
    done = run_module("analysis.breakdown", run, "--format", "json", "--no-cache", timeout=120)
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)["ranks"]) == 2
    assert done.stderr == ""  # runpy's warning about a module imported before it ran, say
    # The command ends at once once its output is out (breakdown.exit_now): its exit status and
    # every line, the warnings on stderr included, as main() gives them.
    missing_rank = small_run(tmp_path / "missing", ranks=(0,))
    done = run_module("analysis.breakdown", missing_rank, "--strict", "--no-cache",
                      timeout=120)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == ("ranktrace: --strict: 1 problem(s), see the "
                                            "warnings above")
    assert "rank 1 of world size 2 has no trace here" in done.stderr
    assert (done.returncode, done.stdout, done.stderr) == run_cli(capsys, missing_rank,
                                                                  "--strict", "--no-cache")


# ---- a real run of the tracer ------------------------------------------------------------------
@pytest.fixture(scope="module")
def traced_ddp_run(shared_runs, tmp_path_factory):
    """A --out folder holding a copy of a traced 2-rank DDP run (DDP's buckets in the profiler
    window only): the command writes its cache beside the traces."""
    run = shared_runs["ddp-late-window"].run_dir
    out = tmp_path_factory.mktemp("traces")
    copy_run(run, out / run.name)
    return out


def test_two_rank_cpu_run_of_the_tracer(capsys, traced_ddp_run):
    code, out, err = run_cli(capsys, traced_ddp_run, "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert [r["rank"] for r in doc["ranks"]] == [0, 1] and doc["run"]["world_size"] == 2
    for rank in doc["ranks"]:
        totals = rank["breakdown"]
        assert totals["kind"] == "cpu" and totals["steps"] >= 1
        assert sum(totals[p] for p in PARTS) == totals["step_ns"]
        assert totals["comm_only_ns"] + totals["overlap_ns"] > 0  # DDP's gloo all-reduce
        assert totals["compute_only_ns"] + totals["overlap_ns"] > 0
        assert rank["hta_compatible"]["kernel_time_us"] is None
    for step in doc["steps"]:  # a profiled step's parts add up; the others have none
        parts = [step[p] for p in PARTS]
        if step["compute_only_ns"] is None:
            assert parts == [None] * len(PARTS) and step["step_ns"] > 0
        else:
            assert sum(parts) == step["step_ns"]
    for rank in doc["ranks"]:  # every recorded step analysed, the profiled ones among them
        assert set(rank["steps_profiled"]) < set(rank["steps_analysed"])
        assert rank["summary"]["steps"] == len(rank["steps_analysed"])


def test_ddp_buckets_seen_only_in_the_windows_are_in_the_collectives_table(capsys,
                                                                          traced_ddp_run):
    # By default the tracer registers no DDP comm hook, so the records hold DDP's buffer
    # broadcast but not its gradient all-reduces: the table takes those from the traces. The
    # broadcast DDP issues when it wraps the model (before the first step) is set-up, apart.
    code, out, err = run_cli(capsys, traced_ddp_run, "--format", "json")
    assert code == 0, err
    document = json.loads(out)
    rows = document["collectives"]
    all_reduce = [r for r in rows if r["op"] == "all_reduce" and r["issuer"] == "ddp"]
    assert all_reduce and sum(r["count"] for r in all_reduce) >= 2
    setup = document["setup_collectives"]
    assert any(r["op"] == "broadcast" and r["issuer"] == "ddp" for r in setup)
    assert not any(r["op"] == "broadcast" for r in rows)


# ---- what the report says -----------------------------------------------------------------------
def write_comm_records(run: Path, rank: int, ops: int, steps: int = 0, run_end: bool = True):
    from tracer import schema

    run.mkdir(parents=True, exist_ok=True)
    manifest = [schema.RunStart(schema_version=schema.SCHEMA_VERSION, run_name=run.name,
                                rank=rank, local_rank=rank, world_size=2, host="h", pid=1,
                                start_ns=0, argv=[], script="s.py", script_args=[],
                                torch_version="x", config={})]
    if run_end:
        manifest.append(schema.RunEnd(rank=rank, end_ns=1, status="ok", exit_code=0, steps=steps,
                                      windows=0, samples=0, comm_ops=ops, bytes_written=0,
                                      errors=0))
    (run / schema.MANIFEST_FILE.format(rank=rank)).write_bytes(
        b"".join(schema.ENCODER.encode(r) + b"\n" for r in manifest))
    comm = schema.CommRecord(step=0, op="all_reduce", source="c10d", pg="0", pg_size=2,
                             dtype="float32", bytes=4 << 20, start_ns=0, end_ns=2_000_000,
                             duration_us=2000.0, timing="host", algbw_gbps=2.097152,
                             busbw_gbps=2.097152)
    (run / schema.COMMS_FILE.format(rank=rank)).write_bytes(
        b"".join(schema.ENCODER.encode(comm) + b"\n" for _ in range(ops)))
    (run / schema.STEPS_FILE.format(rank=rank)).write_bytes(b"".join(
        schema.ENCODER.encode(schema.StepRecord(step=n, start_ns=n, end_ns=n + 1)) + b"\n"
        for n in range(steps)))


def test_a_run_without_steps_still_gets_its_collectives_and_how_to_mark_steps(capsys, tmp_path):
    run = tmp_path / "manual-sgd"
    for rank in (0, 1):
        write_comm_records(run, rank, ops=42)
    code, out, err = run_cli(capsys, run)
    assert code == 0, err
    assert "No step was analysed: there is no verdict" in out.splitlines()[2]
    code, out, err = run_cli(capsys, run, "--full")
    assert code == 0, err
    assert "call tracer.step() at the end of each step, see docs/tracer.md" in err
    assert "No step was analysed" in out and "Bottlenecks" not in out
    collectives = out[out.index("Collectives"):out.index("Ranks")]
    assert "all_reduce" in collectives and "4-8 MiB" in collectives and " 84 " in collectives
    code, out, _ = run_cli(capsys, run, "--format", "json")
    doc = json.loads(out)
    assert doc["collectives"][0]["count"] == 84 and doc["collectives"][0]["ranks"] == 2
    assert [r["window"] for r in doc["ranks"]] == ["none", "none"]


def test_a_killed_rank_has_its_row_and_is_reported_crashed(capsys, tmp_path):
    run = small_run(tmp_path / "run", ranks=(0,))
    write_comm_records(run, 0, ops=1, steps=4)
    write_comm_records(run, 1, ops=1, steps=2, run_end=False)
    code, out, err = run_cli(capsys, run, "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    by_rank = {r["rank"]: r for r in doc["ranks"]}
    assert by_rank[1]["status"] == "crashed" and by_rank[1]["has_trace"] is False
    # its one step recorded past set-up is analysed, from the record alone
    assert by_rank[1]["summary"]["status"] == "crashed" and by_rank[1]["summary"]["steps"] == 1
    assert by_rank[1]["steps_analysed"] == [1] and by_rank[1]["steps_profiled"] == []
    assert by_rank[0]["status"] == "ok" and by_rank[0]["steps_analysed"] == [1, 2, 3]
    code, out, _ = run_cli(capsys, run)
    assert out.splitlines()[1] == "run ended badly: rank(s) 1 crashed (see the warnings)"
    code, out, _ = run_cli(capsys, run, "--full")
    assert "run ended badly: rank(s) 1 crashed" in out
    ranks_table = out[out.index("Ranks"):]
    assert "crashed" in ranks_table and "NaN" not in out and "<NA>" not in out


def test_breakdown_shows_the_mean_step_and_labels_totals(capsys, tmp_path):
    run = small_run(tmp_path / "run", ranks=(0,), world_size=1, steps=(1, 2, 3, 4))
    code, out, _ = run_cli(capsys, run, "--full")
    table = out[out.index("Time breakdown per rank"):out.index("Per step")]
    lines = table.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("rank "))  # after the notes
    header, row = lines[at:at + 2]
    assert "mean step ms" in header and "total ms" in header
    # one rank waits for no one: its communication is all transfer, none unsplit
    assert "waiting" in header and "comm, not split" not in header
    assert row.split()[3:5] == ["0.10", "0.40"]  # 100 us steps: mean 0.10, four of them 0.40


def test_nothing_analysed_is_one_line(capsys, tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "rank0.1.pt.trace.json").write_text("{not json")
    code, out, err = run_cli(capsys, tmp_path / "run")
    assert code == 1
    assert out.splitlines()[1].startswith("nothing could be analysed")
    assert len(out.splitlines()) == 2 and "none found" not in out and "(none)" not in out


def test_a_trace_without_profiler_steps_is_headed_and_documented_as_one_window(capsys, tmp_path):
    TraceBuilder(rank=0, world_size=1).compute(10, 20).nccl(15, 40).write(
        tmp_path / "run" / trace_name(0))
    code, out, _ = run_cli(capsys, tmp_path / "run")
    assert code == 0
    assert out.splitlines()[0] == ("ranktrace: run: 1 of 1 rank, gpu trace, the whole trace as "
                                   "one window (no ProfilerStep)")
    code, out, _ = run_cli(capsys, tmp_path / "run", "--full")
    assert "window: the whole trace as one window (no ProfilerStep)" in out
    assert "every complete" not in out
    code, out, _ = run_cli(capsys, tmp_path / "run", "--format", "json")
    rank, = json.loads(out)["ranks"]
    assert rank["steps_analysed"] == [-1] and rank["window"] == "whole trace"


def deep_ep_trace(folder: Path) -> Path:
    b = TraceBuilder(rank=0, world_size=1).step(1, 0, 100).step(2, 100, 200)
    for t in (0, 100):
        b.compute(t + 10, t + 40)
        b.kernel("void deep_ep::internode::dispatch<8>(void*)", t + 30, t + 60, stream=21)
        b.kernel("my_custom_exchange_kernel", t + 60, t + 80, stream=22)
    return b.write(folder / trace_name(0)).parent


def test_expert_parallel_kernels_count_as_communication_but_not_in_hta_columns(capsys, tmp_path):
    run = deep_ep_trace(tmp_path / "run")
    code, out, _ = run_cli(capsys, run, "--format", "json")
    rank, = json.loads(out)["ranks"]
    # per step: compute 10-40, DeepEP 30-60 -> 20 compute only, 10 overlap, 20 comm only; the
    # unknown kernel 60-80 is compute until named
    assert rank["breakdown"]["comm_only_ns"] == 2 * 20_000
    assert rank["breakdown"]["overlap_ns"] == 2 * 10_000
    assert rank["breakdown"]["compute_only_ns"] == 2 * 40_000
    hta_before = rank["hta_compatible"]
    code, out, _ = run_cli(capsys, run, "--format", "json", "--comm-kernel", "custom_exchange",
                           "--comm-kernel", "nothing_matches")
    rank, = json.loads(out)["ranks"]
    assert rank["breakdown"]["comm_only_ns"] == 2 * 40_000
    assert rank["breakdown"]["compute_only_ns"] == 2 * 20_000
    assert rank["hta_compatible"] == hta_before  # HTA's definition does not move


def test_a_bad_comm_kernel_regex_is_a_usage_error(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([str(small_run(tmp_path / "run")), "--comm-kernel", "(unclosed"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "--comm-kernel" in err
    assert "not a regular expression" in err
