"""A run folder is recognised by its records (analysis.ingest.runs.folder_contents): what a
command writes beside the runs or into them (a JSON document, a report, a timeline, tables)
gets a note and is otherwise ignored, and never changes which run is read."""

import json
import os
from pathlib import Path

from analysis import breakdown
from analysis.ingest.load import load_path
from analysis.ingest.runs import folder_contents, resolve, resolve_runs
from helpers.run_folders import gpu_trace, write_records, write_run
from helpers.synthetic import TraceBuilder, trace_name

# What the commands write into a run folder: breakdown --format json > ..., --html, timeline,
# --out tables.
COMMAND_OUTPUTS = ("breakdown.json", "report.html", "timeline.trace.gz", "steps.csv")


def traced_run(folder: Path) -> Path:
    """Two ranks' traces and records, as the tracer leaves them."""
    write_run(folder, [gpu_trace(rank=0), gpu_trace(rank=1)])
    for rank in (0, 1):
        write_records(folder, rank)
    return folder


def write_command_outputs(folder: Path) -> None:
    (folder / "breakdown.json").write_text(json.dumps({"schema_version": 1, "runs": []}))
    for name in COMMAND_OUTPUTS[1:]:
        (folder / name).write_bytes(b"written by a command")


def test_a_json_document_saved_in_a_run_folder_is_a_stray_not_a_trace(tmp_path):
    run = traced_run(tmp_path / "run")
    write_command_outputs(run)
    contents = folder_contents(run)
    assert [p.name for p in contents.traces] == [trace_name(0), trace_name(1)]
    assert [p.name for p in contents.strays] == ["breakdown.json"]
    resolved = resolve([run])
    assert resolved.runs == [(run, [run / trace_name(0), run / trace_name(1)])]
    assert resolved.notes == [f"{run / 'breakdown.json'}: ignored: not one of the run's traces "
                              f"(*.pt.trace.json[.gz] beside the tracer's records)"]
    loaded = load_path(run, use_cache=False)
    assert [t.rank for t in loaded.ranks] == [0, 1]
    assert not [p for p in loaded.problems if "breakdown.json" in p]


def test_a_json_document_saved_beside_runs_leaves_the_folder_a_folder_of_runs(tmp_path):
    sweep = tmp_path / "sweep"
    old, new = traced_run(sweep / "ws1"), traced_run(sweep / "ws2")
    _age(old, 100)
    (sweep / "scaling.json").write_text(json.dumps({"schema_version": 1, "runs": []}))
    assert not folder_contents(sweep).is_run
    resolved = resolve([sweep], all_runs=True)
    assert [run for run, _ in resolved.runs] == [old, new]
    assert resolved.notes == [f"{sweep / 'scaling.json'}: ignored: a file beside run folders, "
                              f"not a run"]
    assert [run for run, _ in resolve_runs([sweep])] == [new]


def test_the_newest_run_is_told_by_its_records_not_by_what_a_command_wrote_since(tmp_path):
    runs = tmp_path / "traces"
    old, new = traced_run(runs / "a"), traced_run(runs / "b")
    _age(old, 200)
    _age(new, 100)
    write_command_outputs(old)  # the older run's report, timeline and tables, written now
    assert [run for run, _ in resolve_runs([runs])] == [new]


def test_other_tools_traces_are_read_whatever_their_names(tmp_path):
    folder = tmp_path / "hta"
    for rank in (0, 1):
        gpu_trace(rank=rank).write(folder / f"sampled_rank-{rank}.json.gz")
    (run,) = resolve_runs([folder])
    assert run == (folder, [folder / "sampled_rank-0.json.gz", folder / "sampled_rank-1.json.gz"])
    # a folder of such folders, with a JSON document of the command saved beside them
    (tmp_path / "breakdown.json").write_text("{}")
    resolved = resolve([tmp_path], all_runs=True)
    assert [run for run, _ in resolved.runs] == [folder]
    assert resolved.notes == [f"{tmp_path / 'breakdown.json'}: ignored: a file beside run "
                              f"folders, not a run"]


def test_an_unrenamed_trace_still_counts_and_a_foreign_name_beside_records_does_not(tmp_path):
    run = tmp_path / "run"
    write_run(run, [gpu_trace(rank=0)])
    write_records(run, 0)
    write_records(run, 1)
    TraceBuilder(rank=1, world_size=2).step(1, 0, 100).write(run / "copy-of-rank1.json")
    (run / trace_name(0)).rename(run / (trace_name(0) + ".tmp"))
    contents = folder_contents(run)
    assert [p.name for p in contents.traces] == [trace_name(0) + ".tmp"]
    assert [p.name for p in contents.strays] == ["copy-of-rank1.json"]


def test_the_breakdown_command_notes_the_stray_and_analyses_the_run(tmp_path, capsys):
    run = traced_run(tmp_path / "run")
    write_command_outputs(run)
    assert breakdown.main([str(run), "--format", "json", "--no-cache", "--jobs", "1"]) == 0
    out, err = capsys.readouterr()
    assert [r["rank"] for r in json.loads(out)["ranks"]] == [0, 1]
    assert f"ranktrace: note: {run / 'breakdown.json'}: ignored" in err
    assert "breakdown.json" not in "".join(line for line in err.splitlines()
                                           if line.startswith("ranktrace: warning"))


def _age(folder: Path, seconds: float) -> None:
    """Every file in `folder` written `seconds` ago."""
    for path in folder.iterdir():
        stat = path.stat()
        os.utime(path, (stat.st_atime - seconds, stat.st_mtime - seconds))
