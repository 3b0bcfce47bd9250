"""What every test may use: the `slow` mark of everything under tests/integration/ (and `timed`
of the modules that assert on timings), a 1-rank
process group, and the integration tests' shared runs. The suite mirrors the package:
tests/unit/<stage>/ for each floor of analysis/ and for the tracer, tests/integration/ for
traced runs, tests/golden/ for the stored documents; shared builders and the one launcher are
in tests/helpers/ (imported as `helpers.*`; no test module imports another). tests/README.md
explains the layout and how to add a test."""

from pathlib import Path

import pytest
from packaging.version import Version

from helpers import alone
from helpers.runs import SharedRuns

# Every test under tests/integration/ starts torchrun, the tracer or other Python processes: all
# are `slow`, so `pytest -m "not slow"` (the inner loop, `make test-fast`) leaves them out and
# `make test` runs them.
INTEGRATION = Path(__file__).resolve().parent / "integration"
# Under pytest-xdist (`make test`: `-n 2 --dist loadgroup`), the tests that read one shared run
# (tests/helpers/runs.py) or one module-scoped fixture are kept on one worker, which records the
# run once: the modules named here by their group, every other integration module by its name.
# The modules below without a group have neither, and their tests go to whichever worker is free.
XDIST_GROUPS = {
    "test_tracer_end_to_end": "ddp-bucket-hook",
    "test_tensorboard_view": "ddp-bucket-hook",
    "test_crossrank_names_stragglers": "crossrank-runs",
    "test_timeline_of_traced_runs": "crossrank-runs",
    "test_breakdown_command": "crossrank-runs",
    "test_diff_of_traced_runs": "crossrank-runs",
    "test_late_rank_causes": "crossrank-runs",
    "test_crossrank_on_a_traced_straggler": "crossrank-runs",
    "test_workloads_train_like_references": "tiny-workloads",
    "test_traced_training_bit_identical": "tiny-workloads",
}
UNGROUPED = {"test_tracer_under_faults", "test_stop_diagnosis_runs", "test_scaling_sweeps",
             "test_comms_recorder"}
# The modules whose assertions are on timings (a late rank named and none without a delay, a
# diff's verdict on step times, a sweep's lost efficiency, a slow phase's window): marked
# `timed`, which `make test` leaves to `make test-timed`, one process with nothing else running.
# Their timings then come from a machine the rest of the suite does not load.
TIMED = {module for module, group in XDIST_GROUPS.items() if group == "crossrank-runs"} | {
    "test_scaling_sweeps", "test_capture_slow_steps"}


def pytest_configure(config):
    loadgroup = config.getoption("dist", "no") == "loadgroup"
    if loadgroup and Version(pytest.__version__) >= Version("9.2"):
        # pytest 9.2 computes node ids that xdist 3.8 cannot rename `<id>@<group>`: every
        # group would be lost, and each shared run and module fixture recorded once per worker.
        raise pytest.UsageError(f"pytest {pytest.__version__} loses pytest-xdist's groups: "
                                f"install pyproject.toml's dev extra (pytest<9.2)")
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:  # a pytest-xdist worker
        alone.start(workerinput["testrunuid"])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Under xdist, each test (its fixtures' set-up and teardown too) holds the shared lock that
    a timed run waits for (tests/helpers/alone.py)."""
    alone.share()
    try:
        yield
    finally:
        alone.unshare()


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.is_relative_to(INTEGRATION):
            item.add_marker(pytest.mark.slow)
            module = item.path.stem
            if module in TIMED:
                item.add_marker(pytest.mark.timed)
            if module not in UNGROUPED:
                item.add_marker(pytest.mark.xdist_group(XDIST_GROUPS.get(module, module)))


@pytest.fixture(scope="session")
def shared_runs(tmp_path_factory) -> SharedRuns:
    """Each run of the table in tests/helpers/runs.py, recorded once per session on first use,
    for every integration test that reads it."""
    return SharedRuns(tmp_path_factory.mktemp("shared-runs"))


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

