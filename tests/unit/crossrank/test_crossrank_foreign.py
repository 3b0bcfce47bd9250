"""The cross-rank pass on foreign GPU traces: HTA's two NCCL ranks of a 128-rank world
(tests/data/hta/trace_filter), whose kernels are named by the host op that launched them
(docs/cross-rank.md, "Ops")."""

import gzip
import json
import shutil

import pytest

from analysis.crossrank import cross_rank
from analysis.crossrank.run_frames import run_frames
from analysis.report.json_document import cross_rank_json
from analysis.run.loading import load_run_path
from helpers.launch import DATA

TRACES = DATA / "hta" / "trace_filter"
SHIFT_US = 80_000
MS = 1_000_000


def _analysed(folder):
    return cross_rank(load_run_path(folder, use_cache=False))


@pytest.fixture(scope="module")
def original():
    return _analysed(TRACES)


def test_kernels_are_named_by_the_host_op_that_launched_them():
    ops = run_frames(load_run_path(TRACES, use_cache=False))["ops"]
    rank0 = ops[(ops["rank"] == 0) & (ops["step"] == 551)]
    # Every kernel is ncclKernel_SendRecv_*; the nccl:* op around its launch names it.
    assert rank0["op"].tolist() == ["all_to_all", "all_to_all", "all_reduce", "all_reduce",
                                    "all_gather"]
    assert rank0["bytes"].tolist()[2:] == [19618307 * 4, 26955536 * 4, 16777216 * 128]
    assert len(ops) == 20 and set(ops["pg_size"]) == {128}


def test_the_two_present_ranks_of_the_world_are_matched(original):
    # The traces are sampled: each rank lost different ops, so some positions disagree; the
    # instances that agree are the same collective on both (their kernels end within 0.4 ms).
    matched = original.ops
    assert sorted(matched.groupby("instance")["op"].first().tolist()) == \
        ["all_gather", "all_gather", "all_reduce", "all_reduce"]
    assert (matched.groupby("instance")["rank"].nunique() == 2).all()
    ends = matched.pivot(index="instance", columns="rank", values="end_ns")
    assert ((ends[1] - ends[0]).abs() < 400_000).all()
    assert len(original.mismatches) == 6
    clock = original.clock.set_index("rank")
    assert clock.loc[1, "source"] == "collectives"
    assert abs(clock.loc[1, "offset_ns"]) < 0.5 * MS


def test_a_rank_shifted_by_80_ms_is_put_back_and_names_the_same_culprit(original, tmp_path):
    folder = tmp_path / "trace_filter"
    shutil.copytree(TRACES, folder)
    path = folder / "sampled_rank-1.json.gz"
    trace = json.loads(gzip.decompress(path.read_bytes()))
    for event in trace["traceEvents"]:
        if "ts" in event:
            event["ts"] += SHIFT_US
    path.write_bytes(gzip.compress(json.dumps(trace).encode()))

    shifted = _analysed(folder)
    clock = shifted.clock.set_index("rank")
    before = original.clock.set_index("rank").loc[1, "offset_ns"]
    assert clock.loc[1, "source"] == "collectives"
    assert abs(clock.loc[1, "offset_ns"] - SHIFT_US * 1000) < MS
    assert clock.loc[1, "offset_ns"] - before == SHIFT_US * 1000
    assert cross_rank_json(shifted)["stragglers"] == cross_rank_json(original)["stragglers"]
    columns = ["rank", "caused_wait_ms_per_step", "fires", "too_few_steps"]
    assert shifted.stragglers[columns].equals(original.stragglers[columns])
    assert shifted.waits.equals(original.waits)
