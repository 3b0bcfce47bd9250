"""What every test module may use: the test data folder, the `slow` marks, and a fixture that
launches workload scripts in a subprocess, always on CPU (gloo)."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Real traces recorded by other projects, and HTA's numbers on them (tests/data/README.md).
DATA = Path(__file__).resolve().parent / "data"

# Modules whose tests start torchrun or other Python processes: `pytest -m "not slow"` leaves
# them out of the inner loop, `make test` runs them. Each took 30 s to 4 min on 2 busy cores
# (`--durations=0`); the other modules take under 10 s each.
SLOW_MODULES = {
    "test_cli",  # a traced 2-rank run (module fixture) and `python -m analysis.breakdown` calls
    "test_comms",  # traced 2- and 3-rank runs
    "test_comms_identity",  # DDP on 2- and 3-rank process groups, with and without the recorder
    "test_comms_recorder",  # a crashed peer under torchrun, traced and untraced
    "test_crossrank_runs",  # traced multi-rank runs
    "test_crossrank_workloads",  # traced workloads with a delayed rank, two torchrun agents
    "test_dask_scheduler",  # a Dask scheduler and two worker processes on 127.0.0.1
    "test_diff_runs",  # traced 2-rank runs compared
    "test_faults",  # a traced run per fault
    "test_gpu_validation",  # one `scripts/gpu_validation --cpu --quick` run
    "test_record",  # traced runs under torchrun
    "test_scaling_runs",  # traced sweeps at 1, 2 and 4 ranks
    "test_stop_runs",  # traced 2- and 4-rank runs with a hang, mismatch or crash
    "test_tensorboard",  # a traced 2-rank run and a TensorBoard server
    "test_timeline",  # traced DDP and pipeline runs
    "test_unchanged_training",  # every workload twice, eager and compiled
    "test_workloads",  # each workload under torchrun
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.stem in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)

# Runs a script the way ranktrace's tracer does: runpy with sys.argv and sys.path[0] set as
# python would, counting optimizer steps through the global post hook the tracer relies on.
_RUNPY = """
import os, runpy, sys
from torch.optim.optimizer import register_optimizer_step_post_hook
steps = []
register_optimizer_step_post_hook(lambda *_: steps.append(1))
sys.argv = sys.argv[1:]
sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
runpy.run_path(sys.argv[0], run_name="__main__")
print(f"optimizer steps {len(steps)}")
"""


@pytest.fixture
def one_rank():
    """A 1-rank gloo process group in the pytest process, for the length of one test (kept if
    one is already up)."""
    import torch.distributed as dist
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if created:
        dist.destroy_process_group()


def torchrun_env(**extra: str) -> dict:
    """The environment for a test's torchrun: no launcher variables inherited from outside,
    CPU only with one intra-op thread, gloo on the loopback interface, and `extra` on top."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
           and not k.startswith("RANKTRACE_")}
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", **extra)
    if any(name == "lo" for _, name in socket.if_nameindex()):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo's sockets stay on loopback
    return env


@pytest.fixture
def launch():
    """launch(script, *args, nproc=2): torchrun over nproc ranks; nproc=None: runpy, one process."""

    def run(script: str, *args, nproc: int | None = 2, timeout: float = 120):
        path = str(REPO / "workloads" / script)
        if nproc is None:
            cmd = [sys.executable, "-c", _RUNPY, path]
        else:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc-per-node={nproc}", path]
        return subprocess.run(cmd + [str(a) for a in args], cwd=REPO, env=torchrun_env(),
                              capture_output=True, text=True, timeout=timeout)

    return run
