"""The scaling study's warnings (docs/scaling.md, "Warnings"): a noisy baseline and efficiency
above 100%, in the text report, the JSON document and the plot."""

import pandas as pd
import pytest

from analysis import scaling
from analysis.scaling import table as st
from analysis.scaling.efficiency_plot import scaling_page, scaling_svg

MS = 1_000_000


def step_records(ms_per_step, rank=0):
    starts, rows = 0, []
    for step, ms in enumerate(ms_per_step):
        rows.append({"rank": rank, "step": step, "start_ns": starts, "end_ns": starts + ms * MS,
                     "in_profiler_window": False})
        starts += ms * MS
    return pd.DataFrame(rows)


def test_step_spread_is_the_cv_and_the_iqr_over_the_median():
    spread = st.step_spread(pd.Series([10.0, 10.0, 10.0, 30.0]))
    assert spread["step_cv_pct"] == pytest.approx(100 * 8.660254037844387 / 15)
    # percentiles 25/50/75 of [10, 10, 10, 30]: 10, 10, 15
    assert spread["step_iqr_pct"] == pytest.approx(50.0)
    assert all(v != v for v in st.step_spread(pd.Series([5.0])).values())


def test_run_row_measures_the_spread_of_its_timed_steps():
    # steps 0-1 are the warm-up; the timed steps are 10, 10, 10, 30 ms
    row = st.run_row(step_records([50, 50, 10, 10, 10, 30]), None)
    assert row["step_ms"] == pytest.approx(15.0)
    assert row["step_cv_pct"] == pytest.approx(100 * 8.660254037844387 / 15)


def runs(base_ms, base_cv, wide_ms):
    parts = {"compute_ms": 1.0, "copies_ms": 0.0, "transfer_ms": 0.0, "waiting_ms": 0.0,
             "idle_ms": 0.0, "hidden_comm_ms": 0.0}
    return pd.DataFrame([
        {"run": "ws1", "world_size": 1, "nnodes": 1, "step_ms": base_ms, "step_cv_pct": base_cv,
         "step_iqr_pct": 2.0, "samples_per_step": None, "peak_memory_bytes": 1.0,
         "host_cpu_pct": float("nan"), "stragglers": "", **parts},
        {"run": "ws2", "world_size": 2, "nnodes": 1, "step_ms": wide_ms, "step_cv_pct": 1.0,
         "step_iqr_pct": 1.0, "samples_per_step": None, "peak_memory_bytes": 1.0,
         "host_cpu_pct": float("nan"), "stragglers": "", **parts}])


def test_a_disturbed_baseline_warns_of_noise_and_of_efficiency_above_100():
    table, _ = st.scaling_table(runs(base_ms=62.0, base_cv=45.0, wide_ms=10.0), "strong")
    assert table["efficiency_pct"].tolist() == pytest.approx([100.0, 310.0])
    warnings = st.warnings(table)
    assert len(warnings) == 2
    assert warnings[0].startswith("the baseline (1 rank(s)) is noisy: its timed steps vary by "
                                  "CV 45.0%, IQR/median 2.0%")
    assert warnings[1].startswith("2 ranks: efficiency 310.0% exceeds 100%")


def test_a_quiet_baseline_and_honest_efficiency_warn_of_nothing():
    table, _ = st.scaling_table(runs(base_ms=20.0, base_cv=3.0, wide_ms=12.5), "strong")
    assert table["efficiency_pct"].tolist() == pytest.approx([100.0, 80.0])
    assert st.warnings(table) == []
    # runs without a measured spread (old runs) are not called noisy
    old = runs(20.0, 3.0, 12.5).drop(columns=["step_cv_pct", "step_iqr_pct"])
    assert st.warnings(st.scaling_table(old, "strong")[0]) == []


def test_the_warnings_reach_the_text_the_document_and_the_plot():
    frame = runs(base_ms=62.0, base_cv=45.0, wide_ms=10.0)
    table, mode = st.scaling_table(frame, "strong")
    study = scaling.Study(runs=frame, table=table, attribution=st.attribution(table),
                          bandwidth=pd.DataFrame(), mode=mode, warnings=st.warnings(table))
    text = scaling.text_report(study)
    lines = text.splitlines()
    assert lines[2] == "Warnings:"
    assert lines[3].startswith("  ! the baseline (1 rank(s)) is noisy")
    assert lines[4].startswith("  ! 2 ranks: efficiency 310.0% exceeds 100%")
    assert scaling.document(study)["warnings"] == study.warnings
    chart = scaling_svg(table, study.warnings)
    assert chart.count('class="warning"') == 2
    page = scaling_page("t", table, text, study.warnings)
    assert page.count("<li>") == 2 and "exceeds 100%" in page
