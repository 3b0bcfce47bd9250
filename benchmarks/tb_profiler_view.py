"""torch-tb-profiler's distributed view of a run folder, fetched from a real TensorBoard.

    python benchmarks/tb_profiler_view.py traces/<run> [--json]

starts TensorBoard on 127.0.0.1 (a port the OS picks) over that one run folder, waits for the
pytorch_profiler plugin to load it, prints the plugin's per-worker Computation / Overlapping /
Communication / Other split (the "Computation/Communication Overview" chart), its Data Transfer /
Synchronizing split and its communication ops table, and stops TensorBoard. The numbers are the
plugin's, in microseconds; `docs/viewing.md` says how the plugin computes them, so they can be
compared with our own analysis. tests/integration/test_tensorboard_view.py uses `TensorBoard` and
`distributed_view` from here.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

PROFILER_API = "/data/plugin/pytorch_profiler"
OVERLAP_LEGENDS = ("Computation", "Overlapping", "Communication", "Other")
_URL_RE = re.compile(r"TensorBoard \S+ at (http://127\.0\.0\.1:\d+)/")


class TensorBoardError(RuntimeError):
    pass


class TensorBoard:
    """A TensorBoard subprocess on loopback, in its own process group, killed on close.

    `--port 0` lets the OS pick a free port (no race with other tests), and TensorBoard prints
    the one it got. The pytorch_profiler plugin parses traces in child processes, hence the
    process group: closing kills them too."""

    def __init__(self, logdir: str, start_timeout_s: float = 60.0, extra_args: tuple = ()):
        self.logdir = logdir
        self.url: str | None = None
        self._tmp = tempfile.mkdtemp(prefix="ranktrace-tb-")
        self.log_path = os.path.join(self._tmp, "tensorboard.log")
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "tensorboard.main", "--logdir", logdir,
                 "--host", "127.0.0.1", "--port", "0", "--reload_interval", "1", *extra_args],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        try:
            self._wait_for_url(start_timeout_s)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> TensorBoard:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _wait_for_url(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            match = _URL_RE.search(self.log())
            if match:
                self.url = match.group(1)
                return
            if self._proc.poll() is not None:
                raise TensorBoardError(f"TensorBoard exited with {self._proc.returncode}:\n"
                                       f"{self.log_tail()}")
            time.sleep(0.2)
        raise TensorBoardError(f"TensorBoard did not start within {timeout_s:.0f} s:\n"
                               f"{self.log_tail()}")

    def log(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def get(self, path: str, **params):
        """GET a JSON route; None for a 'null' answer. HTTP errors raise with the server's text."""
        url = self.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                body = response.read()
                if response.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
        except urllib.error.HTTPError as err:
            text = err.read().decode("utf-8", "replace")
            raise TensorBoardError(
                f"GET {path} {params}: HTTP {err.code}: {text.strip()}") from None
        return json.loads(body)

    def wait_for(self, what: str, probe, timeout_s: float = 60.0):
        """Poll `probe()` until it returns something truthy (HTTP errors count as not yet)."""
        deadline = time.monotonic() + timeout_s
        last = None
        while time.monotonic() < deadline:
            try:
                result = probe()
                if result:
                    return result
                last = result
            except (TensorBoardError, urllib.error.URLError, ConnectionError) as err:
                last = err
            if self._proc.poll() is not None:
                break
            time.sleep(0.3)
        raise TensorBoardError(f"gave up waiting for {what} (last answer: {last!r}); "
                               f"TensorBoard log:\n{self.log_tail()}")

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        shutil.rmtree(self._tmp, ignore_errors=True)


def wait_for_profiler_run(tb: TensorBoard, run: str, timeout_s: float = 60.0) -> None:
    """Until the plugin lists `run` and has finished loading every run."""
    def loaded():
        answer = tb.get(PROFILER_API + "/runs")
        return run in answer["runs"] and not answer["loading"]
    tb.wait_for(f"torch-tb-profiler to load run {run!r}", loaded, timeout_s)


def distributed_view(tb: TensorBoard, run: str) -> dict:
    """{span: {"overlap", "waittime", "commops", "gpuinfo"}} as the plugin answers them.

    A span is one profiler window, numbered from "1" in each worker's file order. A run without
    a distributed view (no worker "All") gives {}."""
    if "All" not in tb.get(PROFILER_API + "/workers", run=run, view="Distributed"):
        return {}
    view = {}
    for span in tb.get(PROFILER_API + "/spans", run=run, worker="All"):
        view[span] = {route: tb.get(f"{PROFILER_API}/distributed/{route}", run=run, span=span)
                      for route in ("overlap", "waittime", "commops", "gpuinfo")}
    return view


def overlap_rows(view: dict) -> list[tuple]:
    """(span, step, worker, computation, overlapping, communication, other), us; step "all" is
    the plugin's mean over the window's steps."""
    rows = []
    for span, routes in view.items():
        for step, workers in routes["overlap"]["data"].items():
            for worker, values in workers.items():
                rows.append((span, step, worker, *values))
    return rows


def format_view(run: str, view: dict) -> str:
    if not view:
        return (f"{run}: torch-tb-profiler shows no distributed view (a worker has no "
                "communication it recognises, or their op counts differ; see docs/viewing.md)")
    out = [f"{run}: torch-tb-profiler distributed view, us (step 'all' = mean per step)"]
    header = (f"{'span':>4} {'step':>5} {'worker':>8} "
              + " ".join(f"{n:>13}" for n in OVERLAP_LEGENDS))
    out += ["", "Computation/Communication Overview", header]
    for span, step, worker, *values in overlap_rows(view):
        out.append(f"{span:>4} {step:>5} {worker:>8} " + " ".join(f"{v:13.0f}" for v in values))
    out += ["", "Synchronizing/Communication Overview",
            f"{'span':>4} {'step':>5} {'worker':>8} {'Data Transfer':>13} {'Synchronizing':>13}"]
    for span, routes in view.items():
        for step, workers in routes["waittime"]["data"].items():
            for worker, (transfer, sync) in workers.items():
                out.append(f"{span:>4} {step:>5} {worker:>8} {transfer:13.0f} {sync:13.0f}")
    out += ["", "Communication Operations Stats"]
    for span, routes in view.items():
        for worker, table in routes["commops"]["data"].items():
            names = [c["name"] for c in table["columns"]]
            for row in table["rows"]:
                cells = ", ".join(f"{n}={v if isinstance(v, str) else round(v)}"
                                  for n, v in zip(names, row))
                out.append(f"span {span} {worker}: {cells}")
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="one run folder, e.g. traces/<run>")
    parser.add_argument("--json", action="store_true", help="print the plugin's raw answers")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds to wait for TensorBoard and the plugin")
    args = parser.parse_args(argv)
    run_dir = os.path.abspath(args.run_dir)
    if not os.path.isdir(run_dir):
        parser.error(f"not a folder: {args.run_dir}")
    if not any(re.search(r"\.pt\.trace\.json(\.gz)?$", n) for n in os.listdir(run_dir)):
        parser.error(f"no Kineto trace (*.pt.trace.json[.gz]) in {args.run_dir}")
    # With the run folder itself as logdir the plugin names the run after the folder and loads
    # nothing else from beside it.
    run = os.path.basename(run_dir)
    with TensorBoard(run_dir, start_timeout_s=args.timeout) as tb:
        wait_for_profiler_run(tb, run, args.timeout)
        view = distributed_view(tb, run)
    print(json.dumps(view, indent=1) if args.json else format_view(run, view))
    return 0


if __name__ == "__main__":
    sys.exit(main())
