"""The tracer never changes the training it observes: traced and untraced runs of every workload,
eager and under torch.compile, give the same losses and final parameters, bit for bit.

Each workload runs twice on 2 gloo CPU ranks (dp: one process), once plainly and once under
``python -m tracer.record``, with a tiny model and two steps. Compiled runs keep no FX graph
or AOTAutograd cache, so a traced run compiles every graph itself and can never reuse code
Inductor generated untraced (or the reverse); they share one folder of compiled C++ kernels,
which are found by their generated source code, so only identical code is reused. They log
Dynamo's graph breaks, which must be the same with and without the tracer.
"""

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
MODEL = ["--hidden", "16", "--layers", "2", "--batch-size", "8", "--steps", "2", "--seed", "0",
         "--lr", "0.1"]
WORKLOADS = {  # name -> (script, extra flags, ranks (None: one process), files --save writes)
    "dp": ("dp.py", [], None, ["out.pt"]),
    "ddp": ("ddp.py", ["--pg-timeout-s", "60"], 2, ["out.pt"]),
    "model_parallel": ("model_parallel.py", ["--pg-timeout-s", "60"], 2,
                       ["out.rank0.pt", "out.rank1.pt"]),
    "pipeline": ("pipeline.py", ["--pg-timeout-s", "60", "--microbatches", "2"], 2,
                 ["out.rank0.pt", "out.rank1.pt"]),
}
COMPILED_NOTICE = "collectives were compiled into torch.compile graphs"

pytestmark = pytest.mark.slow


def launch(folder: Path, workload: str, compiled: bool, traced: bool, kernels: Path):
    script, flags, nproc, _ = WORKLOADS[workload]
    folder.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
           and not k.startswith(("RANKTRACE_", "TORCH_LOGS", "TORCHINDUCTOR_"))}
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", TORCHINDUCTOR_CACHE_DIR=str(kernels),
               TORCHINDUCTOR_FX_GRAPH_CACHE="0", TORCHINDUCTOR_AUTOGRAD_CACHE="0",
               TORCHINDUCTOR_COMPILE_THREADS="1")
    if compiled:
        env["TORCH_LOGS"] = "graph_breaks"
    if any(name == "lo" for _, name in socket.if_nameindex()):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    command = [sys.executable]
    if nproc is not None:
        command += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    if traced:
        (folder / "traces").mkdir()
        command += ["-m", "tracer.record", "--out", str(folder / "traces")]
    command += [str(REPO / "workloads" / script), *MODEL, *flags, "--save", str(folder / "out.pt")]
    if compiled:
        command.append("--compile")
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def graph_breaks(stderr: str) -> list[str]:
    """Dynamo's graph-break log lines without pids, times and ranks."""
    lines = [line for line in stderr.splitlines() if "Graph break" in line]
    return sorted(re.sub(r"^.*?\] ", "", line) for line in lines)


def warnings_in(stderr: str) -> list[str]:
    return sorted(re.sub(r"^.*?: ", "", line) for line in stderr.splitlines() if "Warning:" in line)


@pytest.fixture(scope="module", params=[False, True], ids=["eager", "compiled"])
def compiled(request):
    return request.param


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    return tmp_path_factory.mktemp("inductor")


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_traced_training_is_bit_identical(tmp_path, workload, compiled, kernels):
    plain = launch(tmp_path / "plain", workload, compiled, traced=False, kernels=kernels)
    traced = launch(tmp_path / "traced", workload, compiled, traced=True, kernels=kernels)
    assert " ok steps=2 " in traced.stderr, traced.stderr
    for name in WORKLOADS[workload][3]:
        expected = torch.load(tmp_path / "plain" / name, weights_only=True)
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
