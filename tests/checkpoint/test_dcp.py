"""torch.distributed.checkpoint through TierdStorageWriter/Reader: save, async_save, load."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from tierd_client.checkpoint import Checkpointer
from tierd_client.dcp import TierdStorageReader, TierdStorageWriter

from .conftest import Tierd


def model_and_optim(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.ReLU(), torch.nn.Linear(48, 8))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    m(torch.randn(5, 64)).sum().backward()
    opt.step()
    return m, opt


@pytest.fixture(autouse=True)
def _quiet() -> None:
    warnings.filterwarnings("ignore", message=".*single process.*")


def test_dcp_save_async_save_and_load(tierd: Tierd) -> None:
    m, opt = model_and_optim(1)
    sd = {"model": m.state_dict(), "optim": opt.state_dict(), "extra": {"epoch": 7}}
    dcp.save(sd, storage_writer=TierdStorageWriter("tierd://dcp-runs/a/1", tierd.socket))
    fut = dcp.async_save(sd, storage_writer=TierdStorageWriter("tierd://dcp-runs/a/2",
                                                               tierd.socket))
    fut.result(timeout=60)
    for step in (1, 2):
        m2, opt2 = model_and_optim(2)
        target = {"model": m2.state_dict(), "optim": opt2.state_dict(), "extra": {"epoch": 0}}
        reader = TierdStorageReader(f"tierd://dcp-runs/a/{step}", tierd.socket)
        dcp.load(target, storage_reader=reader)
        for k, v in sd["model"].items():
            assert torch.equal(v, target["model"][k]), k
        for k, v in sd["optim"]["state"][0].items():
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(
                target["optim"]["state"][0][k])), k
        assert target["extra"] == {"epoch": 7}
    with Checkpointer(tierd.socket, bucket="dcp-runs") as ck:
        assert [s["step"] for s in ck.list("a")] == [1, 2]
        assert ck.wait_persisted("a", 2) == "persisted"
    assert not TierdStorageWriter.validate_checkpoint_id("/tmp/not-tierd")
    assert TierdStorageWriter.validate_checkpoint_id("tierd://b-1/run/3")
