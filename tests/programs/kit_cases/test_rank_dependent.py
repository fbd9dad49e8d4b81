"""Cases for tests/tools/test_testing_kit.py: each rank collects a different number of tests."""
import os

import pytest

RANK = int(os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or 0)


@pytest.mark.parametrize("n", range(RANK + 1))
def test_one_per_rank_number(n):
    pass
