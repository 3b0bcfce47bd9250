"""The one load of a run (analysis.run.loading): every rank gets its tables from the per-rank
reduction, however it was loaded, so that no table is computed twice or two ways."""

import pytest

from analysis.run.loading import load_run_path
from helpers.run_folders import gpu_trace, write_killed_rank
from helpers.synthetic import trace_name


@pytest.mark.parametrize("keep_events", [True, False])
def test_every_rank_has_its_tables_however_it_was_loaded(tmp_path, keep_events):
    run = tmp_path / "run"
    gpu_trace(0, world_size=3, steps=(1, 2)).write(run / trace_name(0, span=111))
    gpu_trace(0, world_size=3, steps=(3,)).write(run / trace_name(0, span=222))
    gpu_trace(1, world_size=3).write(run / trace_name(1))
    write_killed_rank(run, 2, world_size=3)  # its records, and no trace
    loaded = load_run_path(run, use_cache=False, jobs=2, keep_events=keep_events)
    windows, one_file, records_only = loaded.ranks
    # two windows, merged and then reduced; one file, reduced where it was parsed
    assert windows.table("per_step")["step"].tolist() == [1, 2, 3]
    assert one_file.table("per_step")["step"].tolist() == [1, 2, 3]
    # a rank known from its records alone: the tables of no event
    assert not records_only.has_trace and records_only.table("per_step").empty
    assert records_only.table("comm_events").empty and records_only.tables.event_count == 0
    assert all(t.tables.failed == {} for t in loaded.ranks)
    assert [t.events is None for t in loaded.ranks[:2]] == [not keep_events] * 2
