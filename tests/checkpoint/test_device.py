"""The GPU path's logic, on a machine without a GPU.

``tierd_client.device`` names CUDA in one class (``CudaRuntime``); everything else -- when
a region is pinned and unpinned, what ``save(blocking=False)`` leaves queued and when it
commits, the pinned double buffer of restores -- runs over the ``Runtime`` interface.  Here
it runs over ``DeferredRuntime``, which stands in for CUDA the way a copy engine behaves: a
queued copy happens only when an event recorded after it is synchronized, and reads its
source then.  So a save committed before its copies finished, or a staging buffer refilled
before its transfer left it, produces wrong bytes and fails these tests.  Tensors the test
marks as "device" ones (``on_device``) go through the runtime; the rest are host tensors.
The daemon is real."""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from tierd_client.checkpoint import Checkpointer
from tierd_client.dcp import TierdStorageReader, TierdStorageWriter
from tierd_client.device import _address

from .conftest import Tierd


class Event:
    def __init__(self, rt: DeferredRuntime, upto: int) -> None:
        self.rt, self.upto = rt, upto

    def synchronize(self) -> None:
        self.rt.run(self.upto)

    def query(self) -> bool:
        return self.rt.ran >= self.upto


class DeferredRuntime:
    name = "deferred"

    def __init__(self) -> None:
        self.device: set[int] = set()
        self.queue: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.ran = 0
        self.log: list[tuple[Any, ...]] = []
        self.ck: Checkpointer | None = None

    def on_device(self, t: torch.Tensor) -> torch.Tensor:
        self.device.add(t.untyped_storage().data_ptr())
        return t

    def wants(self, t: torch.Tensor) -> bool:
        return t.untyped_storage().data_ptr() in self.device

    def host_register(self, addr: int, size: int) -> bool:
        self.log.append(("register", addr, size))
        return True

    def host_unregister(self, addr: int) -> None:
        assert self.ck is not None
        still_mapped = [m for m in self.ck._maps.values()
                        if not m.mm.closed and _address(m.mm) == addr]
        self.log.append(("unregister", addr, bool(still_mapped)))

    def side(self) -> Any:
        return contextlib.nullcontext()

    def copy_async(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        self.queue.append((dst, src))  # the source is read when the copy runs

    def record(self) -> Event:
        return Event(self, len(self.queue))

    def run(self, upto: int) -> None:
        while self.ran < upto:
            dst, src = self.queue[self.ran]
            dst.copy_(src)
            self.ran += 1

    def join(self) -> None:
        pass

    def staging(self, nbytes: int) -> torch.Tensor:
        self.log.append(("staging", nbytes))
        return torch.empty(nbytes, dtype=torch.uint8)


def checkpointer(socket: str, **kw: Any) -> tuple[Checkpointer, DeferredRuntime]:
    rt = DeferredRuntime()
    ck = Checkpointer(socket, runtime=rt, **kw)
    rt.ck = ck
    return ck, rt


def test_save_of_device_tensors_is_queued_into_pinned_pool_memory_and_committed_by_wait(
        tierd: Tierd) -> None:
    ck, rt = checkpointer(tierd.socket, keep_local=1)
    w = torch.randn(50_000)
    state = {"w": rt.on_device(w.clone()), "host": torch.arange(7), "epoch": 3}
    handle = ck.save("gpu", 1, state, blocking=False)
    assert not handle.done() and rt.ran == 0  # the copy engine has not run yet ...
    assert ck.list("gpu") == []  # ... so nothing is committed
    assert handle.wait() == "committed" and handle.done()
    got = ck.load("gpu", 1)
    assert torch.equal(got["w"], w) and torch.equal(got["host"], torch.arange(7))
    assert got["epoch"] == 3
    registered = [e for e in rt.log if e[0] == "register"]
    assert len(registered) == 1  # the region was pinned when first mapped for a save
    ck.wait_persisted("gpu", 1, level="local")
    state["w"].add_(1)
    ck.save("gpu", 2, state)  # blocking: returns committed; same region, not pinned again
    assert [e for e in rt.log if e[0] == "register"] == registered
    assert torch.equal(ck.load("gpu", 2)["w"], w + 1)
    addr = registered[0][1]
    ck.close()
    # unpinned before the mapping went (a new mapping at that address fails otherwise)
    assert [e for e in rt.log if e[0] == "unregister"] == [("unregister", addr, True)]


def test_restore_into_device_tensors_goes_through_a_pinned_double_buffer(
        tierd: Tierd) -> None:
    ck, rt = checkpointer(tierd.socket)
    ck.device.chunk = 4096  # 50_000 floats: 49 chunks through two buffers
    saved = {"w": torch.randn(50_000), "b": torch.randn(300).to(torch.bfloat16),
             "t": torch.randn(40, 30), "step": 9}
    ck.save("restore", 1, saved)
    into = {"w": rt.on_device(torch.zeros(50_000)),
            "b": rt.on_device(torch.zeros(300, dtype=torch.bfloat16)),
            "t": rt.on_device(torch.zeros(30, 40)).t(),  # not contiguous: a plain copy
            "step": 0}
    out = ck.load("restore", into=into)
    assert out["w"] is into["w"] and out["step"] == 9
    for k in ("w", "b", "t"):
        assert torch.equal(into[k], saved[k]), k
    assert [e for e in rt.log if e[0] == "staging"] == [("staging", 4096)] * 2
    assert not [e for e in rt.log if e[0] == "register"]  # a load pins nothing
    ck.close()


def test_dcp_with_device_tensors(tierd: Tierd) -> None:
    warnings.filterwarnings("ignore", message=".*single process.*")
    ck, rt = checkpointer(tierd.socket, bucket="dcp-gpu")
    ck.device.chunk = 1024
    w = torch.randn(64, 48)
    sd = {"w": rt.on_device(w.clone()), "n": torch.tensor(5)}
    dcp.save(sd, storage_writer=TierdStorageWriter("tierd://dcp-gpu/r/1", checkpointer=ck))
    target = {"w": rt.on_device(torch.zeros(64, 48)), "n": torch.tensor(0)}
    dcp.load(target, storage_reader=TierdStorageReader("tierd://dcp-gpu/r/1", checkpointer=ck))
    assert torch.equal(target["w"], w) and int(target["n"]) == 5
    assert len([e for e in rt.log if e[0] == "register"]) == 1
    ck.close()
