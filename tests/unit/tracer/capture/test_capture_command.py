"""python -m tracer.capture's checks before it asks, on run folders with known answers: not a
folder, not a run folder, a run that has ended, a run whose ranks have no live process; and the
ask it writes for a live one."""

from __future__ import annotations

import os
import socket

import pytest

from tracer import schema
from tracer.capture.capture_command import CaptureError, ask, check_run, main


def write_manifest(run, rank: int, pid: int, ended: bool, host: str | None = None,
                   **config) -> None:
    start = schema.RunStart(schema_version=1, run_name=run.name, rank=rank, local_rank=rank,
                            world_size=2, host=host or socket.gethostname(), pid=pid,
                            start_ns=1, argv=[], script="t.py", script_args=[],
                            torch_version="x", config={"active": 3, **config})
    records = [start]
    if ended:
        records.append(schema.RunEnd(rank=rank, end_ns=2, status="ok", exit_code=0, steps=5,
                                     windows=1, samples=0, comm_ops=0, bytes_written=0,
                                     errors=0))
    final = run / schema.MANIFEST_FILE.format(rank=rank)
    for old in (final, final.with_name(final.name + schema.TEMP_SUFFIX)):
        old.unlink(missing_ok=True)
    path = final if ended else final.with_name(final.name + schema.TEMP_SUFFIX)  # still open
    path.write_bytes(b"".join(schema.ENCODER.encode(r) + b"\n" for r in records))


def dead_pid() -> int:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def test_a_missing_folder_and_a_folder_without_manifests_cannot_be_asked(tmp_path):
    with pytest.raises(CaptureError, match="no run folder"):
        check_run(tmp_path / "nothing")
    with pytest.raises(CaptureError, match="holds no rank manifest: not a run folder"):
        check_run(tmp_path)


def test_a_run_that_has_ended_or_has_no_live_rank_cannot_be_asked(tmp_path, capsys):
    write_manifest(tmp_path, 0, os.getpid(), ended=True)
    write_manifest(tmp_path, 1, os.getpid(), ended=True)
    assert main([str(tmp_path)]) == 1
    assert capsys.readouterr().err == (f"ranktrace: capture: the run in '{tmp_path}' has ended "
                                       f"(every rank wrote run_end)\n")
    write_manifest(tmp_path, 1, dead_pid(), ended=False)
    with pytest.raises(CaptureError, match="no live rank"):
        check_run(tmp_path)
    # A rank of another host counts as live: it cannot be told from here.
    write_manifest(tmp_path, 1, dead_pid(), ended=False, host="elsewhere")
    check_run(tmp_path)
    write_manifest(tmp_path, 1, os.getpid(), ended=False, no_profiler=True)
    with pytest.raises(CaptureError, match="--no-profiler"):
        check_run(tmp_path)


def test_an_ask_is_written_and_an_unanswered_one_is_said_so(tmp_path):
    write_manifest(tmp_path, 0, os.getpid(), ended=False)
    with pytest.raises(CaptureError, match="no rank of the run .* answered within 0.2 s"):
        ask(tmp_path, 4, timeout_s=0.2)
    written = (tmp_path / schema.CAPTURE_ASK_FILE.format(index=0)).read_bytes()
    assert schema.decoder(schema.CaptureAsk).decode(written).steps == 4


def test_steps_above_the_runs_bound_are_refused_before_anything_is_asked(tmp_path, capsys):
    write_manifest(tmp_path, 0, os.getpid(), ended=False, max_window_steps=20)
    assert main([str(tmp_path), "--active", "1000000000"]) == 2
    assert capsys.readouterr().err == (
        "ranktrace: capture: --active 1000000000 is above the run's --max-window-steps 20: a "
        "window keeps every event of its steps in memory until it ends\n")
    assert not (tmp_path / schema.CAPTURE_ASK_FILE.format(index=0)).exists()
    # A run recorded before the bound existed has the default one; --steps, the old name of
    # --active, is still taken (with a warning).
    write_manifest(tmp_path, 0, os.getpid(), ended=False)
    assert main([str(tmp_path), "--steps", "21"]) == 2
    assert "--steps is deprecated; use --active" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_code:
        main([str(tmp_path), "--active", "0"])
    assert exit_code.value.code == 2


def test_a_run_with_no_capture_cannot_be_asked(tmp_path):
    write_manifest(tmp_path, 0, os.getpid(), ended=False, no_capture=True)
    with pytest.raises(CaptureError, match="runs with --no-capture"):
        check_run(tmp_path)


def test_the_ask_names_the_run_it_is_for(tmp_path):
    write_manifest(tmp_path, 0, os.getpid(), ended=False)
    with pytest.raises(CaptureError):
        ask(tmp_path, 20, timeout_s=0.1)
    written = (tmp_path / schema.CAPTURE_ASK_FILE.format(index=0)).read_bytes()
    assert schema.decoder(schema.CaptureAsk).decode(written).run == tmp_path.name
