"""Several run folders (one per node, no shared file system) analysed as one run."""

import json
from pathlib import Path

import pytest

from analysis.breakdown import main
from analysis.ingest.load import load_path
from analysis.ingest.runs import NothingToAnalyse, resolve_runs
from helpers.run_folders import write_killed_rank
from helpers.synthetic import TraceBuilder, trace_name
from tracer import schema


def write_node_rank(folder: Path, rank: int, world_size: int = 4) -> None:
    """One rank's trace and records, as the tracer leaves them in a node's run folder."""
    folder.mkdir(parents=True, exist_ok=True)
    b = TraceBuilder(rank=rank, world_size=world_size, backend="gloo")
    for n in (1, 2, 3):
        start = (n - 1) * 100
        b.step(n, start, start + 100).op("aten::mm", start + 10, start + 40)
    b.write(folder / trace_name(rank))
    start = schema.RunStart(schema_version=schema.SCHEMA_VERSION, run_name=folder.name,
                            rank=rank, local_rank=rank % 2, world_size=world_size,
                            host=folder.parent.name,
                            pid=1, start_ns=0, argv=[], script="s.py", script_args=[],
                            torch_version="x", config={})
    end = schema.RunEnd(rank=rank, end_ns=2, status="ok", exit_code=0, steps=3, windows=1,
                        samples=0, comm_ops=0, bytes_written=0, errors=0)
    (folder / schema.MANIFEST_FILE.format(rank=rank)).write_bytes(
        b"".join(schema.ENCODER.encode(r) + b"\n" for r in (start, end)))
    steps = [schema.StepRecord(step=n, start_ns=0, end_ns=5, rss_bytes=1000 + rank)
             for n in (1, 2, 3)]
    (folder / schema.STEPS_FILE.format(rank=rank)).write_bytes(
        b"".join(schema.ENCODER.encode(s) + b"\n" for s in steps))


def two_nodes(tmp_path: Path, node0_ranks=(2, 3), node1_ranks=(0, 1)) -> tuple[Path, Path]:
    node0, node1 = tmp_path / "node0" / "run", tmp_path / "node1" / "run"
    for rank in node0_ranks:
        write_node_rank(node0, rank)
    for rank in node1_ranks:
        write_node_rank(node1, rank)
    return node0, node1


def test_two_node_folders_are_one_run_with_each_ranks_records(tmp_path):
    node0, node1 = two_nodes(tmp_path)
    (run_dir, files), = resolve_runs([node0, node1])
    assert run_dir == node0 and len(files) == 4
    result = load_path([node0, node1], use_cache=False)
    assert [t.rank for t in result.ranks] == [0, 1, 2, 3] and result.world_size == 4
    assert [t.records.steps["rss_bytes"].tolist() for t in result.ranks] == [
        [1000] * 3, [1001] * 3, [1002] * 3, [1003] * 3]
    assert [t.status for t in result.ranks] == ["ok"] * 4
    assert not [p for p in result.problems if "no trace here" in p]


def test_a_killed_rank_in_the_second_folder_is_recovered_from_its_records(tmp_path):
    node0, node1 = two_nodes(tmp_path, node1_ranks=(0,))
    write_killed_rank(node1, 1, steps=3, world_size=4)
    result = load_path([node0, node1], use_cache=False)
    assert [(t.rank, t.has_trace) for t in result.ranks] == [
        (0, True), (1, False), (2, True), (3, True)]
    assert result.ranks[1].records.steps["step"].tolist() == [0, 1, 2]


def test_the_breakdown_command_takes_several_folders(tmp_path, capsys):
    node0, node1 = two_nodes(tmp_path)
    assert main([str(node0), str(node1), "--format", "json", "--no-cache"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [r["rank"] for r in document["ranks"]] == [0, 1, 2, 3]


def test_folders_holding_the_same_rank_are_refused_naming_both(tmp_path):
    node0, node1 = two_nodes(tmp_path, node0_ranks=(1, 2, 3), node1_ranks=(0, 1))
    with pytest.raises(NothingToAnalyse, match=rf"{node0}.*{node1} both hold rank 1"):
        resolve_runs([node0, node1])


def test_folders_of_different_world_sizes_are_refused(tmp_path):
    node0, node1 = two_nodes(tmp_path, node1_ranks=())
    write_node_rank(node1, 0, world_size=2)
    with pytest.raises(NothingToAnalyse, match=r"disagree on the world size.*4.*2"):
        resolve_runs([node0, node1])


def test_a_folder_that_is_not_a_run_is_named(tmp_path):
    node0, _ = two_nodes(tmp_path, node1_ranks=())
    (tmp_path / "empty").mkdir()
    with pytest.raises(NothingToAnalyse, match="empty: not a run folder"):
        resolve_runs([node0, tmp_path / "empty"])
