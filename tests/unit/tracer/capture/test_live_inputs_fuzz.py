"""The capture watch's live inputs fuzzed in one process: asks and request files of random bytes,
of random JSON and of well-formed records with extreme or wrong values, and the same as values
and counts in a torchrun-style store. Whatever comes, a pass ends within bounds and raises
nothing, every window planned is within --max-window-steps and after this rank's step, and at
most MAX_PROBLEMS problems are written. (The same on a running job:
tests/integration/test_capture_live_inputs.py.)"""

from __future__ import annotations

import json
import os
import random
import time

import pytest
import torch.distributed as dist
from torch.profiler import ProfilerAction

from tracer import schema
from tracer.capture.capture_requests import StoreLog
from tracer.capture.capture_watch import MAX_PROBLEMS, CaptureWatch
from tracer.capture.slow_steps import MAX_LEAD_STEPS
from tracer.options.config import TracerConfig
from tracer.session.run_folder import LaunchInfo

STEP = 500
EXTREMES = [0, 1, -1, 19, 20, 21, STEP, STEP + 5, 10**9, -10**12, 10**11, 2**63 - 1, -2**63,
            2**64, 1.5, float("nan"), None, "3", [], {}, True]


def random_value(rng: random.Random):
    return rng.choice(EXTREMES + [rng.randrange(-10**6, 10**6), "x" * rng.randrange(0, 300),
                                  "\x1b[2J\n\r"])


def random_input(rng: random.Random, run: str, kind: str) -> bytes:
    """One ask or request file's bytes."""
    choice = rng.randrange(4)
    if choice == 0:
        return os.urandom(rng.randrange(0, 4097))
    if choice == 1:
        return json.dumps({k: random_value(rng) for k in rng.sample(
            ["steps", "t_ns", "run", "trigger", "trigger_step", "first_step", "ask", "change"],
            rng.randrange(0, 8))}).encode()
    now = time.time_ns()
    if kind == "ask":
        fields = {"steps": random_value(rng), "t_ns": rng.choice([now, 0, now + 10**15]),
                  "run": rng.choice([run, "", "other", random_value(rng)])}
    else:
        fields = {"trigger": rng.choice(["on_demand", "slow_step", "x", random_value(rng)]),
                  "trigger_step": random_value(rng), "first_step": random_value(rng),
                  "steps": random_value(rng), "t_ns": rng.choice([now, 1, now + 10**15]),
                  "run": rng.choice([run, run, "other"])}
    try:
        return json.dumps(fields).encode()
    except ValueError:
        return b"{}"


class Driver:
    def __init__(self):
        self._step = STEP
        self._idle = ProfilerAction.NONE
        self.planned: list[tuple[int, int]] = []
        self.stopped = False

    def fixed_action(self, k):
        return self._idle

    def plan_window(self, first, steps):
        self.planned.append((first, steps))
        return True

    def take_missed(self):
        return []

    def take_cuts(self):
        return {}


def watch_in(folder, store=None):
    written, failed = [], []
    watch = CaptureWatch(TracerConfig(), LaunchInfo(rank=0, world_size=2), str(folder),
                         Driver(), written.append)
    watch.fail = failed.append
    if store is not None:
        watch.store = watch.log = StoreLog(store, "fuzz", 0)
    return watch, written, failed


def check(watch, written, failed, passes: int = 5) -> None:
    for _ in range(passes):
        started = time.monotonic()
        watch.run_pass()
        assert time.monotonic() - started < 2.0
        watch.driver._step += 10
    assert failed == []
    config = watch.config
    for first, steps in watch.driver.planned:
        assert 1 <= steps <= config.max_window_steps
        assert STEP < first <= STEP + 50 * passes + MAX_LEAD_STEPS
    problems = [r for r in written if isinstance(r, schema.TracerProblem)]
    assert len(problems) <= MAX_PROBLEMS
    assert all(m.isprintable() for m in (p.message for p in problems))


@pytest.mark.parametrize("seed", range(20))
def test_random_ask_and_request_files_never_break_a_pass(tmp_path, seed):
    rng = random.Random(seed)
    for index in range(rng.randrange(1, 30)):
        for kind, pattern in (("ask", schema.CAPTURE_ASK_FILE),
                              ("request", schema.CAPTURE_REQUEST_FILE)):
            path = tmp_path / pattern.format(index=index)
            if rng.random() < 0.05:
                os.mkfifo(path)
            else:
                path.write_bytes(random_input(rng, tmp_path.name, kind))
    check(*watch_in(tmp_path))


@pytest.fixture(scope="module")
def server():
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


@pytest.mark.parametrize("seed", range(20))
def test_random_store_values_and_counts_never_break_a_pass(tmp_path, server, seed):
    rng = random.Random(seed)
    prefix = f"{StoreLog(server, 'fuzz', 0).prefix}"
    server.delete_key(f"{prefix}/count")
    count = rng.randrange(0, 30)
    for index in range(count):
        if rng.random() < 0.9:  # some numbered and never written
            server.set(f"{prefix}/{index}", random_input(rng, tmp_path.name, "request"))
    if rng.random() < 0.2:
        server.set(f"{prefix}/count", os.urandom(8))  # a count that is no number
    else:
        server.add(f"{prefix}/count", rng.choice([count, count, 10**6]))
    for index in range(rng.randrange(0, 5)):
        (tmp_path / schema.CAPTURE_ASK_FILE.format(index=index)).write_bytes(
            random_input(rng, tmp_path.name, "ask"))
    client = dist.TCPStore("127.0.0.1", server.port, is_master=False, wait_for_workers=False)
    check(*watch_in(tmp_path, client))
    for index in range(count):
        server.delete_key(f"{prefix}/{index}")
