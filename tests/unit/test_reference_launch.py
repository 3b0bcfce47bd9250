"""The tests' launcher of reference runs (tests/helpers/launch.py): an untraced run that hangs
at exit is killed, every process it started, and started once more; a traced one never is."""

import subprocess
import time

import pytest

from helpers import launch as launcher

pytestmark = pytest.mark.slow

# The first start leaves a child that would outlive the run and hangs; the second ends at once.
HANGS_ONCE = """
import pathlib, subprocess, sys, time
marker = pathlib.Path(sys.argv[1])
if not marker.exists():
    marker.write_text("started")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    pathlib.Path(sys.argv[2]).write_text(str(child.pid))
    time.sleep(600)
print("done")
"""


def _alive(pid: int) -> bool:
    # a killed child not yet reaped shows as a zombie: gone for this purpose
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[-1][0] != "Z"
    except FileNotFoundError:
        return False


def test_an_untraced_reference_that_hangs_is_killed_with_its_children_and_started_again(
        tmp_path, monkeypatch):
    script = tmp_path / "hangs_once.py"
    script.write_text(HANGS_ONCE)
    marker, child = tmp_path / "marker", tmp_path / "child.pid"
    monkeypatch.setattr(launcher, "REFERENCE_HANG_S", 2.0)
    began = time.monotonic()
    done = launcher.launch_reference(script, marker, child, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "done"
    assert time.monotonic() - began < 30
    pid = int(child.read_text())
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid), "the hung run's child outlived it"


def test_a_traced_run_that_hangs_is_not_started_again(tmp_path, monkeypatch):
    """A traced run has the whole timeout, once: its hang is the tracer's to answer for."""
    script = tmp_path / "hangs_once.py"
    script.write_text(HANGS_ONCE)
    marker, child = tmp_path / "marker", tmp_path / "child.pid"
    monkeypatch.setattr(launcher, "REFERENCE_HANG_S", 1.0)
    began = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        launcher.launch_reference(script, marker, child, tracer=("--out", tmp_path / "traces"),
                                  timeout=8)
    assert time.monotonic() - began >= 8
    assert marker.read_text() == "started"  # it ran (a second start would have ended well)
    pid = int(child.read_text())
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)
