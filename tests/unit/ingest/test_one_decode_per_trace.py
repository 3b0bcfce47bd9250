"""`python -m analysis.breakdown` decodes each trace file once: from its JSON (in the command, a
worker process or the decoder forked ahead) or from its Parquet cache entry, never both and
never twice, whatever the output and whatever the run (analysis.ingest.load,
analysis.rank.reduction, analysis.rank.reduced).

Every decode is counted where it happens, in whichever process: the JSON decoder
(analysis.ingest.kineto._decode) and each cache entry read (analysis.ingest.cache.read_cache),
both wrapped to append the file's name to a log that forked processes share.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from analysis import breakdown
from analysis.ingest import cache, kineto
from analysis.ingest.runs import trace_files
from analysis.rank import one_rank_path as rank_critical_path
from analysis.rank import reduction as summary
from analysis.rank import step_breakdown
from analysis.rank.comm import comm_ops as communication
from helpers.launch import DATA
from helpers.synthetic import TraceBuilder, trace_name


@pytest.fixture
def decodes(tmp_path, monkeypatch):
    """decodes(): {trace file name: times decoded} since the last call."""
    log = tmp_path / "decodes.log"
    log.touch()
    real_decode, real_read = kineto._decode, cache.read_cache

    def note(path) -> None:
        with log.open("a") as handle:  # one short write: lines of several processes stay whole
            handle.write(f"{Path(path).name}\n")

    def decode(path, *args, **kwargs):
        note(path)
        return real_decode(path, *args, **kwargs)

    def read_cache(path):
        entry = real_read(path)
        if entry is not None:
            note(path)
        return entry

    monkeypatch.setattr(kineto, "_decode", decode)
    monkeypatch.setattr(cache, "read_cache", read_cache)

    def taken() -> Counter:
        found = Counter(log.read_text().splitlines())
        log.write_text("")
        return found

    return taken


def _command(capsys, *argv) -> str:
    code = breakdown.main([str(a) for a in argv])
    out = capsys.readouterr().out
    assert code == 0
    return out


def _windows_run(folder: Path) -> Path:
    """Rank 0 in two profiler windows (two files of one process), rank 1 in one."""
    for rank, windows in ((0, ((1, 2), (5, 6))), (1, ((1, 2, 5, 6),))):
        for span, steps in enumerate(windows, start=1):
            b = TraceBuilder(rank=rank, world_size=2)
            for n in steps:
                t = n * 100
                b.step(n, t, t + 100).compute(t + 10, t + 40, launch_at=t + 5)
                b.nccl(t + 50, t + 60, launch_at=t + 6)
            b.write(folder / trace_name(rank, span=span))
    return folder


def _no_comms_crashed_run(folder: Path) -> Path:
    """The 2-rank DDP run as if traced with --no-comms and rank 1 had crashed (no run_end):
    its stop diagnosis compares the ranks' traces."""
    shutil.copytree(DATA / "ddp_cpu", folder)
    for comms in folder.glob("rank*.comms.jsonl"):
        comms.unlink()
    manifest = folder / "rank1.manifest.jsonl"
    lines = [line for line in manifest.read_text().splitlines()
             if json.loads(line)["kind"] != "run_end"]
    manifest.write_text("".join(f"{line}\n" for line in lines))
    return folder


def _steps_of(document: dict) -> dict:
    return {r["rank"]: r["steps_analysed"] for r in document["ranks"]}


# name: (the run, in a folder of the test's; --jobs; what the run's document shows, which is
# what could need a trace a second time). The single file names rank 0 of world size 2, as
# HTA's df_index_resolver names rank 1 of 2: the run holds one traced rank, whose own critical
# path the report gives. --jobs 1 where a worker process would only add its start-up.
RUNS = {
    "one file of a larger world": (
        lambda tmp: shutil.copytree(DATA / "hta/nccl_parser_config", tmp / "nccl"), None,
        lambda doc: len(doc["critical_path"]) == 3 and doc["run"]["world_size"] == 2),
    "two ranks with records": (
        lambda tmp: shutil.copytree(DATA / "ddp_cpu", tmp / "ddp"), None,
        lambda doc: doc["cross_rank"] is not None and _steps_of(doc) == {0: [1, 2, 3, 4],
                                                                          1: [1, 2, 3, 4]}),
    "two ranks, no records": (
        lambda tmp: shutil.copytree(DATA / "hta/trace_filter", tmp / "tf"), 1,
        lambda doc: _steps_of(doc) == {0: [551, 552], 1: [551, 552]}),
    "a rank of two windows": (
        lambda tmp: _windows_run(tmp / "windows"), 1,
        lambda doc: _steps_of(doc) == {0: [1, 2, 5, 6], 1: [1, 2, 5, 6]}),
    "a crashed run without comm records": (
        lambda tmp: _no_comms_crashed_run(tmp / "crashed"), 1,
        lambda doc: [(r["rank"], r["status"]) for r in doc["stop_diagnosis"]["ranks"]]
        == [(0, "ok"), (1, "crashed")]
        and doc["stop_diagnosis"]["lines"][0].startswith("no rank has comms records")),
}


@pytest.mark.parametrize("run", list(RUNS))
def test_each_trace_is_decoded_once_without_and_with_the_cache(run, tmp_path, decodes, capsys):
    build, jobs, shows = RUNS[run]
    folder = build(tmp_path)
    options = ["--jobs", jobs] if jobs else []
    names = [f.name for f in trace_files(folder)]
    once = Counter(names)
    document = json.loads(_command(capsys, folder, "--no-cache", "--format", "json", *options))
    assert decodes() == once
    assert shows(document)
    cold = _command(capsys, folder, *options)  # decoded from JSON, its cache entries written
    assert decodes() == once
    assert all((folder / ".ranktrace-cache" / f"{name}.parquet").is_file() for name in names)
    assert _command(capsys, folder, *options) == cold  # from the cache entries
    assert decodes() == once


def test_the_other_outputs_need_no_second_decode_of_the_one_trace(tmp_path, decodes, capsys):
    trace, = trace_files(RUNS["one file of a larger world"][0](tmp_path))
    # The HTML report keeps the events; the text, --out's CSV files and --format csv do not.
    text = _command(capsys, trace, "--no-cache", "--full", "--out", tmp_path / "csv",
                    "--html", tmp_path / "report.html")
    assert decodes() == Counter([trace.name])
    assert "Critical path per step" in text  # the rank's own path, from its one decode
    assert (tmp_path / "csv" / "critical_path_steps.csv").is_file()
    assert '<section id="critical">' in (tmp_path / "report.html").read_text()
    _command(capsys, trace, "--no-cache", "--format", "csv")
    assert decodes() == Counter([trace.name])


@pytest.mark.parametrize("module, name, problem", [
    (communication, "comm_ops", "comm_ops table failed: ValueError: no ops here"),
    (rank_critical_path, "analyse",
     "critical path analysis failed (ValueError: no ops here); no what-if answer"),
])
def test_a_table_that_fails_where_the_trace_is_parsed_is_a_problem_without_a_second_decode(
        module, name, problem, tmp_path, decodes, capsys, monkeypatch):
    def broken(*args, **kwargs):
        raise ValueError("no ops here")

    monkeypatch.setattr(module, name, broken)
    trace, = trace_files(RUNS["one file of a larger world"][0](tmp_path))
    document = json.loads(_command(capsys, trace, "--no-cache", "--format", "json"))
    assert decodes() == Counter([trace.name])
    assert problem in document["problems"]


def test_a_ranks_failed_breakdown_is_a_problem_naming_it_and_the_other_rank_stands(
        tmp_path, decodes, capsys, monkeypatch):
    real = step_breakdown.breakdown_per_step

    def broken_on_rank_1(trace, *args, **kwargs):
        if trace.rank == 1:
            raise ValueError("no layers")
        return real(trace, *args, **kwargs)

    monkeypatch.setattr(summary, "breakdown_per_step", broken_on_rank_1)
    folder = RUNS["two ranks, no records"][0](tmp_path)
    document = json.loads(_command(capsys, folder, "--no-cache", "--format", "json",
                                   "--jobs", "1"))
    assert decodes() == Counter(f.name for f in trace_files(folder))
    assert (f"{folder / 'sampled_rank-1.json.gz'}: rank 1: per_step table failed (ValueError: "
            f"no layers); the rank has no rows in it") in document["problems"]
    assert {s["rank"] for s in document["steps"]} == {0}
