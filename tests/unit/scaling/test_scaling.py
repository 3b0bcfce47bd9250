"""The scaling study on synthetic sweeps with known step times and parts: exact speedups,
efficiencies and attribution (docs/scaling.md), the command line on run folders written by hand,
and the plot."""

import json
import xml.etree.ElementTree as ET

import pandas as pd
import pytest

from analysis import scaling
from analysis.scaling import table as st
from analysis.scaling.efficiency_plot import scaling_svg
from helpers.flops_run import write_flops_run

MS = 1_000_000


def _runs(rows):
    """Runs with step_ms and parts (compute, copies, transfer, waiting, idle, hidden) in ms."""
    frame = []
    for world, step, parts, samples in rows:
        compute, copies, transfer, waiting, idle, hidden = parts
        assert compute + copies + transfer + waiting + idle == pytest.approx(step)
        frame.append({"run": f"ws{world}", "world_size": world, "nnodes": 1, "step_ms": step,
                      "samples_per_step": samples, "compute_ms": compute, "copies_ms": copies,
                      "transfer_ms": transfer, "waiting_ms": waiting, "idle_ms": idle,
                      "hidden_comm_ms": hidden, "peak_memory_bytes": 1.0,
                      "host_cpu_pct": float("nan")})
    return pd.DataFrame(frame)


STRONG = _runs([(1, 100.0, (90, 0, 0, 0, 10, 0), None),
                (2, 60.0, (45, 0, 6, 4, 5, 2), None),
                (4, 40.0, (25, 0, 8, 5, 2, 3), None)])


def test_strong_scaling_gives_exact_speedup_and_efficiency():
    table, mode = st.scaling_table(STRONG, "strong")
    assert mode == {"mode": "strong", "by_samples": False, "note": None}
    assert table["speedup"].tolist() == pytest.approx([1.0, 100 / 60, 2.5])
    assert table["efficiency_pct"].tolist() == pytest.approx([100.0, 100 * 100 / 120, 62.5])
    assert table["ideal_step_ms"].tolist() == pytest.approx([100.0, 50.0, 25.0])
    assert table["steps_per_s"].tolist() == pytest.approx([10.0, 1000 / 60, 25.0])
    # communication share: exposed transfer + waiting over the step
    assert table["comm_share_pct"].tolist() == pytest.approx([0.0, 100 * 10 / 60, 100 * 13 / 40])


def test_attribution_is_exact_and_adds_up_to_the_lost_efficiency():
    table, _ = st.scaling_table(STRONG, "strong")
    lost = st.attribution(table)
    at4 = lost[lost["world_size"] == 4].set_index("cause")["lost_ms"]
    # ideal at 4 ranks = a quarter of every 1-rank part
    assert at4["compute"] == pytest.approx(25 - 90 / 4)
    assert at4["more communication"] == pytest.approx(8 + 3)
    assert at4["less overlap"] == pytest.approx(-3)
    assert at4["waiting for peers"] == pytest.approx(5)
    assert at4["idle"] == pytest.approx(2 - 10 / 4)
    assert at4["copies"] == pytest.approx(0)
    assert at4.sum() == pytest.approx(40 - 25)
    points = lost[lost["world_size"] == 4]["lost_pct_points"].sum()
    assert points == pytest.approx(100 - 62.5)
    assert lost[lost["world_size"] == 2]["lost_pct_points"].sum() == pytest.approx(
        100 - 100 * 100 / 120)
    assert st.main_causes(lost)["cause"].tolist() == [
        "more communication", "waiting for peers", "more communication", "waiting for peers",
        "compute"]


@pytest.mark.parametrize("kinds, device_words", [(("cpu", "cpu", "cpu"), False),
                                                  (("gpu", "gpu", "gpu"), True),
                                                  ((None, None, None), True)])
def test_idle_advice_speaks_of_a_device_only_where_the_traces_have_one(kinds, device_words):
    table, _ = st.scaling_table(STRONG.assign(trace_kind=list(kinds)), "strong")
    advice = st.attribution(table).set_index(["world_size", "cause"])["suggestion"]
    for world in (2, 4):
        assert ("device" in advice[(world, "idle")]) == device_words
        assert ("device" in advice[(world, "copies")]) == device_words
    assert advice[(4, "idle")] == (st.SUGGESTIONS["idle"] if device_words
                                   else st.CPU_SUGGESTIONS["idle"])


def test_weak_scaling_from_the_recorded_global_batch():
    runs = _runs([(1, 100.0, (90, 0, 0, 0, 10, 0), 32),
                  (2, 110.0, (90, 0, 10, 0, 10, 0), 64),
                  (4, 125.0, (90, 0, 15, 10, 10, 0), 128)])
    table, mode = st.scaling_table(runs)
    assert mode["mode"] == "weak" and mode["by_samples"]
    assert table["samples_per_s"].tolist() == pytest.approx([320.0, 64 / 0.110, 128 / 0.125])
    assert table["speedup"].tolist() == pytest.approx([1.0, 2 * 100 / 110, 4 * 100 / 125])
    assert table["efficiency_pct"].tolist() == pytest.approx([100.0, 100 * 100 / 110, 80.0])
    lost = st.attribution(table).set_index(["world_size", "cause"])["lost_ms"]
    assert lost[(4, "waiting for peers")] == pytest.approx(10)
    assert lost[(4, "more communication")] == pytest.approx(15)
    assert lost[(4, "compute")] == pytest.approx(0)
    # the recorded batch wins over a contradicting --mode, and says so
    _, given = st.scaling_table(runs, "strong")
    assert given["mode"] == "weak" and "--mode strong" in given["note"]


def test_mode_without_a_recorded_batch():
    table, mode = st.scaling_table(STRONG)
    assert mode["mode"] == "strong" and "--mode weak" in mode["note"]
    weak, _ = st.scaling_table(STRONG, "weak")
    assert weak["efficiency_pct"].tolist() == pytest.approx([100.0, 100 * 100 / 60, 250.0])
    assert weak["speedup"].tolist() == pytest.approx([1.0, 2 * 100 / 60, 4 * 100 / 40])


def test_repeats_average_and_keep_their_spread():
    runs = pd.concat([STRONG, STRONG.assign(step_ms=STRONG["step_ms"] * 1.5,
                                            **{p: STRONG[p] * 1.5 for p in st.PARTS})])
    table, _ = st.scaling_table(runs, "strong")
    assert table["runs"].tolist() == [2, 2, 2]
    assert table["step_ms"].tolist() == pytest.approx([125.0, 75.0, 50.0])
    assert table["step_ms_min"].tolist() == pytest.approx([100.0, 60.0, 40.0])
    assert table["step_ms_max"].tolist() == pytest.approx([150.0, 90.0, 60.0])


def _steps(durations_ms, profiled=(), samples=None):
    start, rows = 0, []
    for step, ms in enumerate(durations_ms):
        row = {"step": step, "start_ns": start, "end_ns": start + int(ms * MS),
               "in_profiler_window": step in profiled, "rss_bytes": 1000 + step}
        if samples is not None:
            row["samples"] = samples
        rows.append(row)
        start += int(ms * MS)
    return rows


def test_run_row_times_unprofiled_steps_after_the_warm_up():
    steps = pd.DataFrame(_steps([500, 90, 10, 12, 40, 40, 14], profiled={4, 5}, samples=64))
    shares = {"compute_ms": 0.5, "copies_ms": 0.0, "transfer_ms": 0.25, "waiting_ms": 0.125,
              "idle_ms": 0.125, "hidden_comm_ms": 0.1}
    row = st.run_row(steps, shares, samples_per_step=7, warmup_steps=2)
    assert row["steps_timed"] == 3 and row["steps_which"] == "unprofiled"
    assert row["step_ms"] == pytest.approx(12.0)
    assert row["samples_per_step"] == 64  # the records win over the fallback
    assert row["compute_ms"] == pytest.approx(6.0) and row["waiting_ms"] == pytest.approx(1.5)
    assert row["peak_memory_bytes"] == 1006 and row["memory_kind"] == "rss"


def test_part_shares_split_exposed_communication_into_waiting_and_transfer():
    bars = pd.DataFrame({"rank": [0, 1], "compute": [4.0, 6.0], "overlap": [1.0, 1.0],
                         "transfer": [2.0, 2.0], "waiting": [3.0, 1.0], "memcpy": [0.0, 0.0],
                         "idle": [0.0, 0.0]})
    shares = st.part_shares(bars)
    assert shares == pytest.approx({"compute_ms": 6 / 10, "copies_ms": 0.0,
                                    "transfer_ms": 2 / 10, "waiting_ms": 2 / 10,
                                    "idle_ms": 0.0, "hidden_comm_ms": 1 / 10})


def _write_run(folder, world, durations_ms, config=None, host="h"):
    folder.mkdir(parents=True)
    for rank in range(world):
        start = {"kind": "run_start", "schema_version": 1, "run_name": folder.name,
                 "rank": rank, "local_rank": rank, "world_size": world, "host": host, "pid": 1,
                 "start_ns": 0, "argv": [], "script": "train.py", "script_args": [],
                 "torch_version": "2", "config": config or {}}
        end = {"kind": "run_end", "rank": rank, "end_ns": 1, "status": "ok", "exit_code": 0,
               "steps": len(durations_ms), "windows": 0, "samples": 0, "comm_ops": 0,
               "bytes_written": 0, "errors": 0}
        (folder / f"rank{rank}.manifest.jsonl").write_text(
            json.dumps(start) + "\n" + json.dumps(end) + "\n")
        (folder / f"rank{rank}.steps.jsonl").write_text(
            "".join(json.dumps(s) + "\n" for s in _steps(durations_ms)))


def test_command_line_on_a_sweep_folder(tmp_path, capsys):
    _write_run(tmp_path / "ws1-n1-r0", 1, [300, 50, 20, 20, 20], {"samples_per_step": 32})
    _write_run(tmp_path / "ws2-n1-r0", 2, [300, 50, 25, 25, 25], {"samples_per_step": 32})
    _write_run(tmp_path / "ws4-n1-r0", 4, [300, 50, 40, 40, 40], {"samples_per_step": 32})
    assert scaling.main([str(tmp_path), "--format", "json", "--no-cache"]) == 0
    out, err = capsys.readouterr()
    document = json.loads(out)
    sizes = document["world_sizes"]
    assert [s["world_size"] for s in sizes] == [1, 2, 4]
    assert [s["step_ms"] for s in sizes] == pytest.approx([20.0, 25.0, 40.0])
    assert [s["samples_per_s"] for s in sizes] == pytest.approx([1600.0, 1280.0, 800.0])
    assert [s["speedup"] for s in sizes] == pytest.approx([1.0, 0.8, 0.5])
    assert [s["efficiency_pct"] for s in sizes] == pytest.approx([100.0, 40.0, 12.5])
    assert document["mode"] == "strong" and document["mode_from_samples"]
    assert document["attribution"] == []  # no Kineto trace: no parts
    assert "no profiled step" in err
    capsys.readouterr()
    assert scaling.main([str(tmp_path / "ws1-n1-r0"), str(tmp_path / "ws4-n1-r0"),
                         "--format", "csv", "--no-cache"]) == 0
    csv = pd.read_csv(pd.io.common.StringIO(capsys.readouterr().out))
    assert csv["efficiency_pct"].tolist() == pytest.approx([100.0, 12.5])


def test_the_json_document_saved_into_the_sweep_folder_leaves_the_next_study_alike(tmp_path,
                                                                                  capsys):
    _write_run(tmp_path / "ws1-n1-r0", 1, [300, 50, 20, 20, 20], {"samples_per_step": 32})
    _write_run(tmp_path / "ws2-n1-r0", 2, [300, 50, 25, 25, 25], {"samples_per_step": 32})
    saved = tmp_path / "scaling.json"
    saved.write_text("")  # `> SWEEP/scaling.json` creates the file before the command runs
    assert scaling.main([str(tmp_path), "--format", "json", "--no-cache"]) == 0
    saved.write_text(capsys.readouterr().out)
    assert scaling.main([str(tmp_path), "--format", "json", "--no-cache"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == json.loads(saved.read_text())
    assert [s["step_ms"] for s in json.loads(out)["world_sizes"]] == pytest.approx([20.0, 25.0])
    assert f"ranktrace: note: {saved}: ignored: a file beside run folders, not a run" in err


def test_command_line_names_a_run_without_step_records(tmp_path, capsys):
    _write_run(tmp_path / "ws1-n1-r0", 1, [300, 50, 20, 20])
    _write_run(tmp_path / "ws2-n1-r0", 2, [300, 50, 20, 20])
    for path in (tmp_path / "ws2-n1-r0").glob("rank*.steps.jsonl"):
        path.unlink()
    assert scaling.main([str(tmp_path), "--no-cache", "--mode", "weak"]) == 0
    out, err = capsys.readouterr()
    assert f"{tmp_path / 'ws2-n1-r0'}: no step records" in err
    assert "1 rank(s)" in out
    assert scaling.main([str(tmp_path / "nothing")]) == 1
    assert "no such folder" in capsys.readouterr().err


def test_the_html_page_holds_the_plot_and_the_report_with_names_escaped(tmp_path, capsys):
    folder = tmp_path / "<script>sweep"
    _write_run(folder / "ws1-n1-r0", 1, [300, 50, 20, 20, 20], {"samples_per_step": 32})
    _write_run(folder / "ws2-n1-r0", 2, [300, 50, 25, 25, 25], {"samples_per_step": 32})
    page_path = tmp_path / "scaling.html"
    assert scaling.main([str(folder), "--no-cache", "--html", str(page_path)]) == 0
    page = page_path.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page
    assert "&lt;script&gt;sweep" in page and "<script>sweep" not in page
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    report = capsys.readouterr().out
    assert "Scaling study: 2 runs" in report
    assert "Scaling study: 2 runs" in page


def test_the_plot_is_one_svg_with_a_bar_per_world_size():
    table, _ = st.scaling_table(STRONG, "strong")
    root = ET.fromstring(scaling_svg(table))
    assert root.tag.endswith("svg")
    titles = [t.text for t in root.iter("{http://www.w3.org/2000/svg}title")]
    assert "4 ranks: compute 25 ms per step" in titles
    assert "2 ranks: waiting 4 ms per step" in titles
    assert any(p.get("points") for p in root.iter("{http://www.w3.org/2000/svg}polyline"))


def test_mfu_against_world_size_is_the_mean_over_each_runs_profiled_steps(tmp_path, capsys):
    write_flops_run(tmp_path / "ws1-n1-r0", 1, peak=(10.0, "measured"), steps_ms=(300, 1, 20))
    write_flops_run(tmp_path / "ws2-n1-r0", 2, peak=(4.0, "option"), steps_ms=(300, 1, 20))
    result = scaling.study([tmp_path], use_cache=False)
    assert result.runs["mfu_pct"].tolist() == pytest.approx([20.0, 50.0])
    assert result.table["mfu_pct"].tolist() == pytest.approx([20.0, 50.0])
    text = scaling.text_report(result)
    header = next(line for line in text.splitlines() if line.lstrip().startswith("ranks"))
    assert "MFU %" in header
    assert scaling.document(result)["world_sizes"][1]["mfu_pct"] == pytest.approx(50.0)


def test_peak_tflops_overrides_every_runs_peak_in_the_mfu_column(tmp_path, capsys):
    write_flops_run(tmp_path / "ws1-n1-r0", 1, peak=(10.0, "measured"), steps_ms=(300, 1, 20))
    write_flops_run(tmp_path / "ws2-n1-r0", 2, peak=(4.0, "option"), steps_ms=(300, 1, 20))
    # 20% of 10 TFLOP/s and 50% of 4 are 2 TFLOP/s achieved: 40% of a 5 TFLOP/s peak in both
    assert scaling.main([str(tmp_path), "--peak-tflops", "5", "--format", "json",
                         "--no-cache"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [s["mfu_pct"] for s in document["world_sizes"]] == pytest.approx([40.0, 40.0])
    with pytest.raises(SystemExit):
        scaling.parse_args([str(tmp_path), "--peak-tflops", "0"])
