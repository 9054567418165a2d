"""The cluster differential (test_cluster_differential.py) with write-back running: every
node persists what it holds as soon as it can (persist_delay 0), so uploads, cold deletes
and imports of the three nodes run between the operations, and two nodes writing one key
meet in the cold store (only the key's home deletes or replaces its object; a carried-out
delete stays a tombstone that imports respect: tierd/placement/deletes.py, intents.py)."""

from __future__ import annotations

import pytest

from .test_cluster_differential import (
    model_dirs,  # noqa: F401  (the model directories: a fixture of that module)
)
from .test_cluster_differential import (
    test_s3_doors_and_mounts_of_three_nodes_behave_as_one_directory as _mixed,
)
from .test_cluster_differential import (
    test_s3_doors_of_three_nodes_behave_as_one_directory as _s3,
)

pytestmark = pytest.mark.usefixtures("bucket")
BUCKET = "differential"  # the functions above use their module's name (another cluster)


@pytest.fixture(scope="module")
def cluster_settings() -> dict[str, str]:
    return {"TIERD_PERSIST_DELAY": "0"}


test_s3_doors_with_write_back = _s3
test_s3_doors_and_mounts_with_write_back = _mixed
