"""What every test module may use: the test data folder, the `slow` marks, a 1-rank process
group, and the integration tests' shared runs. Launching scripts: tests/helpers/launch.py.

(tests/integration/ has no conftest.py of its own: a second module named conftest would make
`from conftest import DATA` in the modules here ambiguous.)"""

from pathlib import Path

import pytest

# REPO and DATA (real traces recorded by other projects, and HTA's numbers on them:
# tests/data/README.md) are also importable from here, for the modules outside tests/integration.
from helpers.launch import DATA, REPO  # noqa: F401
from helpers.runs import SharedRuns

# Every test under tests/integration/ starts torchrun, the tracer or other Python processes: all
# are `slow`, so `pytest -m "not slow"` (the inner loop, `make test-fast`) leaves them out and
# `make test` runs them.
INTEGRATION = Path(__file__).resolve().parent / "integration"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.is_relative_to(INTEGRATION):
            item.add_marker(pytest.mark.slow)


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

