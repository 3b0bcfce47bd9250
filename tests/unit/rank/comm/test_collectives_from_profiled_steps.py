"""DDP's gradient all-reduce on gloo at the tracer's default options (tests/data/ddp_gloo): its
comm records come from the Flight Recorder, timed at issue only, and the profiled steps'
`gloo:all_reduce` ops give the same ops a time, so that the collectives table has a time per
step for the row and says where it comes from (docs/report.md, "Ops timed from the profiled
steps")."""

import gzip
import json

import pandas as pd
import pytest

from analysis.rank.comm.comm_ops import collectives_table, comm_ops
from analysis.run.analysed_run import analyse_run
from analysis.run.loading import load_run_path
from helpers.launch import DATA

RUN = DATA / "ddp_gloo"
PROFILED = [7, 8, 9]


def _gloo_durations_us(rank: int) -> list[float]:
    """The rank's gloo:all_reduce durations (us), read from its trace file by hand."""
    (path,) = RUN.glob(f"rank{rank}.*.pt.trace.json.gz")
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    return sorted(e["dur"] for e in events if e.get("name") == "gloo:all_reduce")


@pytest.fixture(scope="module")
def loaded():
    return load_run_path(RUN, use_cache=False)


def test_the_records_of_the_profiled_steps_take_their_gloo_ops_times(loaded):
    for trace in loaded.ranks:
        ops = comm_ops(trace)
        buckets = ops[(ops["op"] == "all_reduce") & (ops["step"] >= 1)]
        timed = buckets[buckets["duration_us"].notna()]
        assert timed["step"].tolist() == [7, 7, 8, 8, 9, 9]
        assert (timed["time_from"] == "profiled steps").all()
        assert (timed["origin"] == "records").all()  # still the records' ops, every step
        assert sorted(timed["duration_us"]) == pytest.approx(_gloo_durations_us(trace.rank))
        assert buckets.loc[~buckets["step"].isin(PROFILED), "time_from"].isna().all()
        assert len(buckets) == 38  # 2 buckets x 19 steps


def _expected_ms_per_step() -> float:
    """The mean over the two ranks of each one's gloo all-reduce time over its 3 profiled
    steps."""
    return sum(sum(_gloo_durations_us(r)) / 1e3 / len(PROFILED) for r in (0, 1)) / 2


def test_the_all_reduce_row_costs_its_profiled_time_per_profiled_step(loaded):
    # every op of the records, step 0's set-up ones too (their all-reduce is 2-4 MiB)
    table = collectives_table(pd.concat([comm_ops(t) for t in loaded.ranks], ignore_index=True))
    row = table.iloc[0]
    assert (row["op"], row["size_bucket"], row["count"]) == ("all_reduce", "1-2 MiB", 76)
    assert row["time_from"] == "profiled steps"
    assert row["ms_per_step"] == pytest.approx(_expected_ms_per_step())
    assert row["total_us"] == pytest.approx(sum(sum(_gloo_durations_us(r)) for r in (0, 1)))


def test_the_run_ranks_the_ddp_all_reduce_first_by_its_time_per_step():
    # Through the whole analysis, each rank reduced where its trace is parsed (as the command
    # does): step 0's set-up ops apart, ms/step over the profiled steps.
    loaded = load_run_path(RUN, use_cache=False)
    report = analyse_run(loaded, name="ddp_gloo", path=str(RUN))
    row = report.collectives.iloc[0]
    assert (row["op"], row["count"], row["time_from"]) == ("all_reduce", 76, "profiled steps")
    assert row["ms_per_step"] == pytest.approx(_expected_ms_per_step())
    # the transfer-based bandwidth of the cross-rank pass, from the same ends
    assert row["transfer_busbw_gbps"] > 0
