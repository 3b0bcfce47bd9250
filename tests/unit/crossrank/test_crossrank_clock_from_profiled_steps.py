"""The clock of a real DDP run traced with the default options on gloo (tests/data/ddp_gloo:
every bucket all-reduce in the comm records, timed at issue only; steps 7-9 profiled), and the
same run with rank 1's clock moved 80 ms and its clock_sync removed. The profiled steps'
`gloo:all_reduce` ops time the records' ops, whose completions place rank 1's clock
(docs/cross-rank.md, "One clock")."""

import gzip
import json

import numpy as np
import pandas as pd
import pytest

from analysis.crossrank import analyse, cross_rank
from analysis.crossrank.run_frames import run_frames
from analysis.report.json_document import cross_rank_json
from analysis.run.loading import load_run_path
from helpers.launch import DATA
from helpers.run_copies import shifted_copy

RUN = DATA / "ddp_gloo"
MS = 1_000_000
SHIFT_NS = 80 * MS
PROFILED = [7, 8, 9]


@pytest.fixture(scope="module")
def shifted(tmp_path_factory):
    return shifted_copy(RUN, tmp_path_factory.mktemp("clock") / "shifted", 1, SHIFT_NS)


@pytest.fixture(scope="module")
def original():
    return cross_rank(load_run_path(RUN, use_cache=False))


@pytest.fixture(scope="module")
def moved(shifted):
    return cross_rank(load_run_path(shifted, use_cache=False))


def _gloo_ends_on_records_clock(rank: int) -> list[int]:
    """The ends of the rank's gloo:all_reduce ops, read from its trace file by hand, put on its
    records' clock by the median difference of the ProfilerStep and step-record starts."""
    (path,) = RUN.glob(f"rank{rank}.*.pt.trace.json.gz")
    document = json.loads(gzip.decompress(path.read_bytes()))
    base = int(document["baseTimeNanoseconds"])
    events = document["traceEvents"]
    starts = {int(e["name"].split("#")[1]): base + round(e["ts"] * 1000) for e in events
              if e.get("name", "").startswith("ProfilerStep#")}
    records = pd.read_json(RUN / f"rank{rank}.steps.jsonl", lines=True).set_index("step")
    moved = int(np.median([starts[s] - records.loc[s, "start_ns"] for s in starts]))
    # in the order the training thread issued them: the c10d::allreduce_ calls
    gloo = sorted((e for e in events if e.get("name") == "gloo:all_reduce"),
                  key=lambda e: e["ts"])
    calls = sorted(e["ts"] for e in events if e.get("name") == "c10d::allreduce_")
    assert len(gloo) == len(calls) == 2 * len(PROFILED)
    return sorted(base + round((e["ts"] + e["dur"]) * 1000) - moved for e in gloo)


def test_the_records_ops_of_the_profiled_steps_end_where_their_gloo_ops_end():
    ops = run_frames(load_run_path(RUN, use_cache=False))["ops"]
    for rank in (0, 1):
        mine = ops[ops["rank"] == rank]
        timed = mine[mine["time_from"] == "profiled steps"]
        # DDP's two buckets in each profiled step, nothing else of them
        assert timed["step"].tolist() == [7, 7, 8, 8, 9, 9]
        assert (timed["op"] == "all_reduce").all() and timed["timed"].all()
        assert sorted(timed["end_ns"]) == pytest.approx(_gloo_ends_on_records_clock(rank),
                                                        abs=1_000)
        # the other steps' records keep no end: timed at issue only
        others = mine[~mine["step"].isin(PROFILED)]
        assert not others["timed"].any() and others["time_from"].isna().all()


def test_on_one_host_the_estimate_agrees_with_clock_sync(original):
    clock = original.clock.set_index("rank")
    assert clock.loc[1, "source"] == "clock_sync" and clock.loc[1, "offset_ns"] == -440
    assert clock.loc[1, "estimate_from"] == "profiled steps"
    assert clock.loc[1, "instances"] == 6  # 2 buckets x 3 profiled steps
    # Both ranks read one host clock: the estimate is within 0.25 ms of the same clock.
    assert abs(clock.loc[1, "estimate_offset_ns"]) < 0.25 * MS
    assert original.notes == ()


def test_an_80_ms_shift_without_clock_sync_is_recovered_within_1_ms(moved):
    clock = moved.clock.set_index("rank")
    row = clock.loc[1]
    assert (row["source"], row["estimate_from"], row["instances"]) == (
        "collectives", "profiled steps", 6)
    assert abs(row["offset_ns"] - SHIFT_NS) < MS
    assert 0 < row["uncertainty_ns"] < MS
    # 6 instances within 40 ms: too few to fit a drift, so none is (NaN, applied as 0).
    assert np.isnan(row["drift_ns_per_s"])
    assert cross_rank_json(moved)["clock"][1]["estimate_from"] == "profiled steps"


def test_the_shift_names_no_straggler_and_leaves_the_waits_as_they_were(original, moved):
    assert cross_rank_json(moved)["stragglers"] == []
    assert not moved.stragglers["fires"].any()
    # The same waits per rank as on the unshifted run, up to the estimate's error per op.
    before = original.waits.groupby("rank")["wait_for_peers_ms"].mean()
    after = moved.waits.groupby("rank")["wait_for_peers_ms"].mean()
    assert (after - before).abs().max() < 1.0


def test_without_the_profiled_steps_times_the_shift_would_name_rank_1(shifted):
    # The same ops with the profiled steps' ends taken away: nothing places rank 1's clock.
    frames = run_frames(load_run_path(shifted, use_cache=False))
    ops = frames["ops"]
    untimed = ops.assign(timed=False, time_from=None, end_ns=ops["issue_ns"])
    read_as_one_clock = pd.DataFrame({"rank": [1], "offset_ns": [0], "uncertainty_ns": [0]})
    # Read on one clock (what the analysis did before), rank 1 looks 80 ms late in every step.
    named = analyse(untimed, frames["steps"], read_as_one_clock, 2)
    assert cross_rank_json(named)["stragglers"][0]["rank"] == 1
    # Without clock_sync its clock is unknown: no straggler, waits unknown, and a note.
    result = analyse(untimed, frames["steps"], frames["clock_sync"], 2)
    assert result.clock.set_index("rank").loc[1, "source"] == "none"
    assert result.stragglers.empty
    assert result.waits["wait_for_peers_ms"].isna().all()
    assert [n.name for n in result.notes] == ["clock of rank(s) 1 unknown"]
