"""What every test may use: the `slow` mark of everything under tests/integration/, a 1-rank
process group, and the integration tests' shared runs. The suite mirrors the package:
tests/unit/<stage>/ for each floor of analysis/ and for the tracer, tests/integration/ for
traced runs, tests/golden/ for the stored documents; shared builders and the one launcher are
in tests/helpers/ (imported as `helpers.*`; no test module imports another)."""

from pathlib import Path

import pytest

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

