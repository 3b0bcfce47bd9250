"""DDP gradients are bit for bit the same with the comms recorder's bucket hook
(--ddp-bucket-hook) as without it, on 3 gloo ranks, in every DDP configuration that changes how
buckets are reduced; and the comparison can fail (tests/helpers/ddp_identity.py). The same
scenario on 2 ranks runs in test_comms_records_on_ranks.py's group of 2 ranks (one start of
ranks fewer)."""

from __future__ import annotations

import pytest

from helpers.comms_ranks import run_ranks
from helpers.ddp_identity import check_identity, scenario_identity


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory):
    return run_ranks(3, {"identity": scenario_identity}, tmp_path_factory.mktemp("three_ranks"))


def test_ddp_gradients_bit_identical_three_ranks(three_ranks):
    check_identity(three_ranks, 3)
