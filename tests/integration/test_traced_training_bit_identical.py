"""The tracer never changes the training it observes: traced and untraced runs of every workload,
eager, and of the distributed ones under torch.compile, give the same losses and final parameters,
bit for bit. The compiled runs carry the `compiled` mark: Inductor's C++ compiles are the largest
single share of the suite's CPU time, so `make test-compiled` runs them beside `make test`
(CI runs both).

Each workload runs twice on 2 gloo CPU ranks (dp: one process), once plainly and once under
``python -m tracer.record``, with a tiny model and two steps; the plain eager runs are the shared
runs `*-tiny` (tests/helpers/runs.py), which the workload tests also check against a reference.
Compiled runs keep no FX graph or AOTAutograd cache, so a traced run compiles every graph itself
and can never reuse code Inductor generated untraced (or the reverse); they share one folder of
compiled C++ kernels, which are found by their generated source code, so only identical code is
reused (ddp runs first: its kernels are the model's, which the other workloads generate too).
They log Dynamo's graph breaks, which must be the same with and without the tracer.
"""

import re
from pathlib import Path

import pytest
import torch

from helpers import tracer_files as h
from helpers.launch import launch, torchrun_env
from helpers.runs import TINY_MODEL, TINY_STEPS, TINY_WORKLOADS
from tracer import schema

WORKLOADS = {name: TINY_WORKLOADS[name] for name in ("dp", "ddp", "model_parallel", "pipeline")}
# Compiled: the distributed workloads, each a different way its collectives meet compiled code
# (DDP's reducer outside the graphs, model_parallel's functional collectives inside them, the
# pipeline's p2p between compiled stages); ddp first: see above. dp, one process with no
# collective, adds nothing the others do not test, at a compile's cost.
COMPILED_WORKLOADS = ("ddp", "model_parallel", "pipeline")
COMPILED_NOTICE = "collectives were compiled into torch.compile graphs"


def run(folder: Path, workload: str, compiled: bool, traced: bool, kernels: Path):
    script, flags, nproc, _ = WORKLOADS[workload]
    folder.mkdir(parents=True)
    env = torchrun_env()
    if compiled:
        env = torchrun_env(TORCHINDUCTOR_CACHE_DIR=kernels, TORCHINDUCTOR_FX_GRAPH_CACHE="0",
                           TORCHINDUCTOR_AUTOGRAD_CACHE="0", TORCHINDUCTOR_COMPILE_THREADS="1",
                           TORCH_LOGS="graph_breaks")
    tracer = None
    if traced:
        (folder / "traces").mkdir()
        tracer = ["--out", folder / "traces"]
    result = launch(script, *TINY_MODEL, *flags, "--save", folder / "out.pt",
                    *(["--compile"] if compiled else []), nproc=nproc, tracer=tracer, env=env,
                    timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def graph_breaks(stderr: str) -> list[str]:
    """Dynamo's graph-break log lines without pids, times and ranks."""
    lines = [line for line in stderr.splitlines() if "Graph break" in line]
    return sorted(re.sub(r"^.*?\] ", "", line) for line in lines)


def warnings_in(stderr: str) -> list[str]:
    return sorted(re.sub(r"^.*?: ", "", line) for line in stderr.splitlines() if "Warning:" in line)


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    return tmp_path_factory.mktemp("inductor")


@pytest.mark.parametrize(("workload", "compiled"), [
    *[pytest.param(name, False, id=f"eager-{name}") for name in WORKLOADS],
    *[pytest.param(name, True, id=f"compiled-{name}", marks=pytest.mark.compiled)
      for name in COMPILED_WORKLOADS]])
def test_traced_training_is_bit_identical(tmp_path, shared_runs, workload, compiled, kernels):
    if compiled:
        plain_folder = tmp_path / "plain"
        plain = run(plain_folder, workload, compiled, traced=False, kernels=kernels)
    else:
        shared = shared_runs[f"{workload}-tiny"]
        plain_folder, plain = shared.folder, shared.result
    traced = run(tmp_path / "traced", workload, compiled, traced=True, kernels=kernels)
    assert " ok steps=2 " in traced.stderr, traced.stderr
    for name in WORKLOADS[workload][3]:
        expected = torch.load(plain_folder / name, weights_only=True)
        actual = torch.load(tmp_path / "traced" / name, weights_only=True)
        assert actual["losses"].tolist() == expected["losses"].tolist(), name
        assert actual["params"].keys() == expected["params"].keys()
        for param, value in expected["params"].items():
            assert torch.equal(actual["params"][param], value), f"{name}: {param}"
        for param, grad in expected.get("first_grads", {}).items():
            assert torch.equal(actual["first_grads"][param], grad), f"{name}: gradient of {param}"
    # No graph break and no warning from the tracer (torch.compile(DDP) once got both).
    assert graph_breaks(traced.stderr) == graph_breaks(plain.stderr)
    assert warnings_in(traced.stderr) == warnings_in(plain.stderr)
    # Collectives inside compiled graphs are not recorded, and the run says so.
    has_compiled_collectives = compiled and workload == "model_parallel"
    assert (COMPILED_NOTICE in traced.stderr) == has_compiled_collectives, traced.stderr
    if workload == "ddp":
        gradients_in_every_step(tmp_path / "traced")


def gradients_in_every_step(folder: Path) -> None:
    """Traced with default options, every step of a DDP run has its gradient all-reduces in the
    comm records (torch's Flight Recorder: DDP's C++ reducer issues them), 4 bytes per fp32
    parameter in all, and its step record counts them."""
    saved = torch.load(folder / "out.pt", weights_only=True)
    parameters = sum(value.numel() for value in saved["params"].values())
    run_dir = h.only_run_dir(folder / "traces")
    for rank in (0, 1):
        records = h.read_jsonl(h.jsonl_path(run_dir, schema.COMMS_FILE, rank),
                               schema.CommRecord)
        steps = h.steps(run_dir, rank)
        assert [s.step for s in steps] == list(range(TINY_STEPS))
        for step in steps:
            own = [r for r in records if r.step == step.step]
            buckets = [r for r in own if r.op == "all_reduce" and r.source == "native"]
            assert buckets and all(r.dtype == "float32" for r in buckets), (step, own)
            assert sum(r.bytes for r in buckets) == 4 * parameters
            assert all(r.timing == "issue" and r.end_ns == r.start_ns for r in buckets)
            assert step.comm_ops == len(own)
            assert step.comm_bytes == sum(r.bytes for r in own)
