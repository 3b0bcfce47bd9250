"""The live inputs of a running job, fuzzed (issue 45): while a 2-rank DDP run waits at step 100,
the run folder gets asks of 10^9 steps, of random bytes, of another run, of -1 steps and a FIFO
under an ask's name, and torchrun's store gets requests for steps -10^12..10^11, of another run
and of random bytes; then the run goes on. Whatever came, the run ends with exit code 0, the
losses of the untraced run, every step of every rank recorded, its time within 3x the untraced
run's + 20 s; the one window asked within range (the 10^9-step ask clipped to
--max-window-steps) is traced at the same steps on both ranks, and every input left out is one
problem in the records, which the analysis reads. (Each input on its own, in 3,000-step runs,
and the cost of each: docs/benchmarks.md, Live inputs.)
"""

from __future__ import annotations

import os
import socket
import time

import torch.distributed as dist

from analysis.ingest.records import read_records
from helpers.launch import launch, start
from helpers.tracer_files import load_trace, losses, manifest, of_kind, steps, traces
from tracer import schema
from tracer.capture.capture_requests import FileLog, StoreLog

SCRIPT = "tests/scripts/slow_from.py"
STEPS = 600
WAIT_AT = 100
# Steps of 3 ms asleep and about 1 ms of work: the window asked on demand opens 1 s of steps after
# the ask (about 250), and its 20 steps end before the run's. Asleep, not busy: two runs of 600
# steps on two ranks would otherwise spend 7 s of CPU on the pace alone.
ARGS = ("--steps", str(STEPS), "--step-ms", "0", "--step-sleep-ms", "3", "--slow-from",
        str(WAIT_AT), "--slow-ms", "0")
RUN_ID = "live-inputs"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def inject(run_dir, port: int) -> None:
    """Every input, while both ranks wait at step WAIT_AT: the requests first, so that they are
    requests 0-2 (rank 0 answers the asks with a request of its own, appended after them)."""
    store = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False)
    requests = StoreLog(store, RUN_ID, 0)
    now = time.time_ns()
    base = dict(trigger="on_demand", t_ns=now, run=run_dir.name)
    requests.append(schema.CaptureRequest(trigger_step=WAIT_AT, first_step=-10**12,
                                          steps=10**11, **base))
    requests.append(schema.CaptureRequest(trigger_step=WAIT_AT, first_step=WAIT_AT + 50,
                                          steps=3, **{**base, "run": "another-run"}))
    index = int(store.add(f"{requests.prefix}/count", 1)) - 1
    store.set(f"{requests.prefix}/{index}", os.urandom(4096))
    asks = FileLog(str(run_dir), schema.CAPTURE_ASK_FILE, schema.CaptureAsk)
    asks.append(schema.CaptureAsk(steps=10**9, t_ns=now, run=run_dir.name))
    (run_dir / schema.CAPTURE_ASK_FILE.format(index=1)).write_bytes(os.urandom(4096))
    asks.next = 2
    asks.append(schema.CaptureAsk(steps=3, t_ns=now, run="another-run"))
    asks.append(schema.CaptureAsk(steps=-1, t_ns=now))
    os.mkfifo(run_dir / schema.CAPTURE_ASK_FILE.format(index=4))


def test_whatever_comes_in_asks_and_requests_the_run_ends_whole_and_unharmed(tmp_path):
    begun = time.monotonic()
    untraced = launch(SCRIPT, *ARGS, "--losses", tmp_path / "untraced.txt", nproc=2)
    untraced_s = time.monotonic() - begun
    assert untraced.returncode == 0, untraced.stderr[-3000:]
    go, port = tmp_path / "go", free_port()
    run_dir = tmp_path / "traces" / "live"
    begun = time.monotonic()
    run = start(SCRIPT, *ARGS, "--losses", tmp_path / "traced.txt", "--wait-for", go, nproc=2,
                standalone=False,
                torchrun=("--master-addr=127.0.0.1", f"--master-port={port}",
                          f"--rdzv-id={RUN_ID}"),
                tracer=("--out", tmp_path / "traces", "--run-name", "live"))
    try:
        for _ in range(2):
            run.wait_for_line(f"waiting at step {WAIT_AT}")
        inject(run_dir, port)
        time.sleep(0.5)  # a few passes of every rank's capture thread
    finally:
        go.touch()
    out, err = run.communicate(timeout=300)
    traced_s = time.monotonic() - begun
    assert run.popen.returncode == 0, err[-3000:]
    assert traced_s < 3 * untraced_s + 20
    assert losses(tmp_path / "traced.txt") == losses(tmp_path / "untraced.txt")
    for rank in (0, 1):
        assert [s.step for s in steps(run_dir, rank)] == list(range(STEPS))
    # The one window within range: the 10^9-step ask, clipped, at the same steps on both ranks.
    records = {rank: of_kind(manifest(run_dir, rank), schema.CaptureRecord) for rank in (0, 1)}
    ((first,), (other,)) = records.values()
    assert (first.trigger, first.steps, first.asked_steps, first.missed) == (
        "on_demand", 20, 10**9, False)
    assert (other.first_step, other.steps) == (first.first_step, 20)
    window = list(range(first.first_step, first.first_step + 20))
    for rank in (0, 1):
        traced = [sorted(int(e["name"].split("#")[1]) for e in load_trace(p)["traceEvents"]
                         if e.get("name", "").startswith("ProfilerStep#"))
                  for p in traces(run_dir, rank)]
        assert traced == [[7, 8, 9], window]
    # Each input left out is one problem, in the records and in what the analysis reads.
    said = {rank: [p.message for p in of_kind(manifest(run_dir, rank), schema.TracerProblem)]
            for rank in (0, 1)}
    asks = [m for m in said[0] + said[1] if m.startswith("capture ask")]
    assert sorted(asks) == sorted([
        "capture ask 0 asks for 1000000000 steps: clipped to --max-window-steps 20",
        "capture ask 1 cannot be read (not a CaptureAsk JSON object of at most 64 KiB): ignored",
        "capture ask 2 is for run 'another-run', not this one ('live'): ignored",
        "capture ask 3 asks for -1 steps: ignored",
        "capture ask 4 cannot be read (not a CaptureAsk JSON object of at most 64 KiB): ignored"])
    requests = [m for m in said[0] if not m.startswith("capture ask")]
    assert requests == [
        "the window of steps -1000000000000--900000000001 asked on demand is not opened: "
        "100000000000 steps, more than --max-window-steps 20",
        "capture request 1 is of run 'another-run', not this one ('live'): ignored",
        "capture request 2 cannot be read (not a CaptureRequest JSON object of at most 64 KiB):"
        " ignored"]
    assert [m for m in said[1] if not m.startswith("capture ask")] == []
    _, problems = read_records(run_dir, 0)
    assert any(p.endswith("rank 0: tracer part 'capture': capture request 1 is of run "
                          "'another-run', not this one ('live'): ignored") for p in problems)
    assert out.count("waiting at step") == 2
