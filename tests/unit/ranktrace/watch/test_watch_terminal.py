"""`python -m ranktrace.watch` on a terminal (a pseudo-terminal of 100x30): rich's live view
of a run that is being written, and `q` to leave it."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time

import pytest

from benchmarks.watch_cost import SyntheticRun
from helpers.launch import REPO, torchrun_env


def read_until(fd: int, text: bytes, timeout: float) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while text not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                seen += os.read(fd, 65536)
            except OSError:  # the child closed the terminal
                break
    return seen


@pytest.mark.slow
def test_the_live_view_draws_the_run_and_q_leaves(tmp_path):
    run = SyntheticRun(str(tmp_path / "run"), 2, ops_per_step=1, slow_rank=1, slow_from=5,
                       slow_ms=50.0, sample_hz=0)
    run.start()
    for _ in range(40):
        run.write_step()
    run.flush()
    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    env = torchrun_env(TERM="xterm-256color")
    for name in ("COLUMNS", "LINES", "NO_COLOR"):
        env.pop(name, None)
    watch = subprocess.Popen([sys.executable, "-m", "ranktrace.watch", "--interval", "0.2",
                              str(run.folder)], stdin=child, stdout=child, stderr=child,
                             cwd=REPO, env=env, close_fds=True)
    os.close(child)
    try:
        drawn = read_until(main, b"ranks wait for rank 1", 20)
        assert b"ranks wait for rank 1: 50.0 ms a step" in drawn
        assert b"\x1b[" in drawn  # drawn by rich, in colour
        os.write(main, b"q")
        watch.wait(10)
        rest = read_until(main, b"left by the user", 5)
    finally:
        watch.kill()
        os.close(main)
        run.close()
    assert watch.returncode == 0
    assert b"ranktrace watch: run: left by the user (2 ranks: 2 running) at step 39" in rest
