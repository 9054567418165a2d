"""How checkpoint bytes move between tensors and pool memory: the CPU way, or CUDA's.

The SDK's copies go through a :class:`Copier` over a small :class:`Runtime`, so the same
logic runs with CUDA and without it:

* **Saving a GPU tensor** is a device-to-host copy straight into the mapped pool region.
  Into pageable memory the copy engine runs at a quarter of its speed; into pinned memory
  at full speed.  So a region that receives GPU tensors is registered as pinned
  (``cudaHostRegister``) **once per region**, by the first save that copies GPU tensors
  into it (:meth:`Copier.save`), and unregistered before it is unmapped (a later mapping
  at the same address otherwise fails with "resource already mapped").  The copies are
  queued with ``non_blocking=True`` on a side stream (ordered after the caller's stream)
  and an event is recorded: ``save(..., blocking=False)`` returns at once and its
  handle's ``wait()`` waits for the event.
* **Restoring into GPU tensors** reads a private mapping of the checkpoint (pageable, and
  registering it for one load costs more than it saves).  It goes through a **pinned double
  buffer**: chunk k+1 is copied into one pinned buffer while the copy engine moves chunk k
  from the other to the device; a buffer is refilled only after the event of its previous
  transfer completed.

Without CUDA (:class:`HostRuntime`) every copy is an ordinary ``copy_``, events are already
complete and registration does nothing: the behaviour of a CPU-only save.  The runtime is
the only place that names CUDA, which is what lets the pipeline's logic be exercised on a
machine without a GPU.
"""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any, Protocol

import torch

#: bytes per chunk of a restore's pinned double buffer
CHUNK = 32 << 20


class Event(Protocol):
    def synchronize(self) -> None: ...

    def query(self) -> bool: ...


class Done:
    """An event that has happened (copies made synchronously)."""

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class Runtime(Protocol):
    """What the copier needs of an accelerator runtime."""

    name: str

    def wants(self, t: torch.Tensor) -> bool:
        """Whether ``t`` lives on this runtime's device (its copies go through it)."""

    def host_register(self, addr: int, size: int) -> bool:
        """Pin ``size`` bytes of host memory at ``addr``; False if refused."""

    def host_unregister(self, addr: int) -> None: ...

    def side(self) -> Any:
        """A context in which queued copies run on the side stream, after the caller's."""

    def copy_async(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Queue ``dst.copy_(src)`` on the side stream (inside :meth:`side`)."""

    def record(self) -> Event:
        """An event after everything queued on the side stream so far."""

    def join(self) -> None:
        """Make the caller's stream wait for the side stream (restored tensors are then
        safe to use in the caller's stream order)."""

    def staging(self, nbytes: int) -> torch.Tensor:
        """A host buffer the device copies from at full speed (pinned)."""


class HostRuntime:
    """No accelerator: synchronous copies, nothing to pin."""

    name = "cpu"

    def wants(self, t: torch.Tensor) -> bool:
        return False

    def host_register(self, addr: int, size: int) -> bool:
        return False

    def host_unregister(self, addr: int) -> None:
        pass

    def side(self) -> Any:
        return nullcontext()

    def copy_async(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src)

    def record(self) -> Event:
        return Done()

    def join(self) -> None:
        pass

    def staging(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8)


class CudaRuntime:
    """CUDA through torch: a side stream, events, ``cudaHostRegister`` via torch's cudart."""

    name = "cuda"

    def __init__(self) -> None:
        self._stream: Any = None
        self._cudart: Any = torch.cuda.cudart()  # type: ignore[no-untyped-call]

    def wants(self, t: torch.Tensor) -> bool:
        return t.is_cuda

    @property
    def stream(self) -> Any:
        if self._stream is None:
            self._stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        return self._stream

    def host_register(self, addr: int, size: int) -> bool:
        # cudaHostRegisterDefault (0): portable enough for one device per process
        rc = self._cudart.cudaHostRegister(addr, size, 0)
        return int(getattr(rc, "value", rc)) == 0

    def host_unregister(self, addr: int) -> None:
        self._cudart.cudaHostUnregister(addr)

    @contextmanager
    def side(self) -> Iterator[None]:
        s = self.stream
        s.wait_stream(torch.cuda.current_stream())  # after whatever produced the tensors
        with torch.cuda.stream(s):
            yield

    def copy_async(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src, non_blocking=True)
        for t in (dst, src):
            if t.is_cuda:  # the caching allocator must not reuse it before the copy ran
                t.record_stream(self.stream)

    def record(self) -> Event:
        ev: Event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        ev.record(self.stream)  # type: ignore[attr-defined]
        return ev

    def join(self) -> None:
        torch.cuda.current_stream().wait_stream(self.stream)

    def staging(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


def default_runtime() -> Runtime:
    return CudaRuntime() if torch.cuda.is_available() else HostRuntime()


def _address(mm: mmap.mmap) -> int:
    c = ctypes.c_char.from_buffer(mm)
    try:
        return ctypes.addressof(c)
    finally:
        del c  # (a live export would stop the mapping from being closed)


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


class Copier:
    """The SDK's copies over one runtime (see the module docstring)."""

    def __init__(self, runtime: Runtime | None = None, chunk: int = CHUNK) -> None:
        self.rt = runtime if runtime is not None else default_runtime()
        self.chunk = chunk
        #: pinned pool mappings: id(mmap) -> address
        self.registered: dict[int, int] = {}
        self._buffers: list[torch.Tensor] = []

    # -- pool regions ----------------------------------------------------------------------
    def region_mapped(self, mm: mmap.mmap) -> None:
        """A region receiving device tensors: pin it once (later saves into it find it
        pinned)."""
        if id(mm) in self.registered:
            return
        addr = _address(mm)
        if self.rt.host_register(addr, len(mm)):
            self.registered[id(mm)] = addr

    def region_unmapping(self, mm: mmap.mmap) -> None:
        """Before ``mm`` is closed: unpin it."""
        addr = self.registered.pop(id(mm), None)
        if addr is not None:
            self.rt.host_unregister(addr)

    # -- saving ----------------------------------------------------------------------------
    def save(self, mm: mmap.mmap, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> Event:
        """``dst.copy_(src)`` for each (dst a view of the pool region ``mm``); device
        tensors are queued on the side stream, into the region pinned when it first gets
        any, host tensors copied now.  The event of the queued copies."""
        device = [(d, s) for d, s in pairs if self.rt.wants(s)]
        for d, s in pairs:
            if not self.rt.wants(s):
                d.copy_(s)
        if not device:
            return Done()
        self.region_mapped(mm)
        with self.rt.side():
            for d, s in device:
                self.rt.copy_async(d, s)
            return self.rt.record()

    # -- restoring -------------------------------------------------------------------------
    def restore(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """``dst.copy_(src)`` for each (src a host view of a checkpoint): into device
        tensors through the pinned double buffer, host ones directly."""
        device = [(d, s) for d, s in pairs if self.rt.wants(d)]
        for d, s in pairs:
            if not self.rt.wants(d):
                d.copy_(s)
        if device:
            self._through_buffers(device)

    def _buffer(self, i: int) -> torch.Tensor:
        while len(self._buffers) <= i:
            self._buffers.append(self.rt.staging(self.chunk))
        return self._buffers[i]

    def _through_buffers(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        events: list[Event | None] = [None, None]
        turn = 0
        with self.rt.side():
            for dst, src in pairs:
                if not dst.is_contiguous() or dst.dtype != src.dtype:
                    self.rt.copy_async(dst, src.contiguous())  # rare: not worth a pipeline
                    continue
                d, s = _flat(dst), _flat(src.contiguous())
                for off in range(0, s.numel(), self.chunk):
                    n = min(self.chunk, s.numel() - off)
                    ev = events[turn]
                    if ev is not None:
                        ev.synchronize()  # the buffer's previous transfer has left it
                    buf = self._buffer(turn)[:n]
                    buf.copy_(s[off:off + n])
                    self.rt.copy_async(d[off:off + n], buf)
                    events[turn] = self.rt.record()
                    turn ^= 1
            self.rt.record().synchronize()  # everything queued, the plain copies too
        self.rt.join()
