"""Checkpoints on a cluster: the pool and the staging are per node, the catalogue is the
shared namespace, so a step saved through one node lists, loads and deletes on another
(tierd.checkpoint.service with ``shared``)."""

from __future__ import annotations

import pytest

from .clusterlib import Cluster

torch = pytest.importorskip("torch")
from tierd_client.checkpoint import Checkpointer  # noqa: E402


def state(step: int) -> dict[str, object]:
    return {"w": torch.full((256, 256), float(step)), "step": torch.tensor(step)}


def same(a: dict[str, object], b: dict[str, object]) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) for k in a)


def test_a_step_saved_on_n1_lists_loads_and_deletes_on_n2(cluster: Cluster) -> None:
    n1, n2 = cluster[1], cluster[2]
    with Checkpointer(str(n1.data_dir / "pool.sock")) as c1, \
            Checkpointer(str(n2.data_dir / "pool.sock")) as c2:
        c1.save("shared", 1, state(1))
        c1.wait_persisted("shared", 1, level="local")
        assert [s["step"] for s in c2.list("shared")] == [1]
        # a second step after n2 looked at the run once: n2 sees it too (it rescans)
        c1.save("shared", 2, state(2))
        c1.wait_persisted("shared", 2, level="local")
        assert [s["step"] for s in c2.list("shared")] == [1, 2]
        # n2 loads the bytes n1 wrote (dirty on n1 or in cold: the peer door or cold)
        assert same(c2.load("shared", 2), state(2))
        # a delete through n1 is gone on n2's next listing
        c1.delete("shared", 1)
        assert [s["step"] for s in c2.list("shared")] == [2]
