"""Client of tierd's memory pool: ask for regions, receive their descriptors, map them.

The daemon is found through ``socket_path``, else ``TIERD_POOL_SOCKET``, else the
``pool_socket`` of the running daemon's ``endpoints.json`` (in ``TIERD_DATA_DIR`` or the
default data directory).  One connection per client; calls are serialised by a lock so a
client may be shared by threads (``dcp.async_save`` writes from a thread).
"""

from __future__ import annotations

import contextlib
import errno
import json
import mmap
import os
import socket
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tierd.mempool.wire import SHARED_SOCKET, encode, recv_message


class PoolRequestError(OSError):
    """The daemon refused a request; ``errno`` and the message say why."""


class PoolQuotaExceeded(PoolRequestError):
    """The tenant's quota (EDQUOT) or the pool (ENOSPC) has no room: nothing was copied."""


class PoolFull(PoolQuotaExceeded):
    """The pool itself has no room (ENOSPC), whatever the tenant's quota: the message says
    "memory pool full"; an exceeded quota is a plain :class:`PoolQuotaExceeded` (EDQUOT)."""


def default_socket() -> Path:
    """Where the daemon is, when the caller does not say: ``TIERD_POOL_SOCKET``; else the
    ``pool_socket`` of ``endpoints.json`` in ``TIERD_DATA_DIR``; else that of a daemon of
    the caller's own (its default data directory); else the shared ``/run/tierd/pool.sock``
    -- which needs neither the caller's home directory nor read access to the daemon's data
    directory (a training user's container has neither)."""
    env = os.environ.get("TIERD_POOL_SOCKET")
    if env:
        return Path(env)
    data = os.environ.get("TIERD_DATA_DIR")
    if data:
        return _from_endpoints(Path(data)) or (
            SHARED_SOCKET if _is_socket(SHARED_SOCKET) else Path(data) / "pool.sock")
    own = None
    with contextlib.suppress(Exception):  # no usable home directory: not an error here
        import platformdirs

        own = Path(platformdirs.user_data_dir("tierd"))
    found = _from_endpoints(own) if own is not None else None
    if found is not None:
        return found
    if _is_socket(SHARED_SOCKET) or own is None:
        return SHARED_SOCKET
    return own / "pool.sock"


def _from_endpoints(data: Path) -> Path | None:
    try:
        return Path(json.loads((data / "endpoints.json").read_text())["pool_socket"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(path.stat().st_mode)
    except OSError:
        return False


@dataclass
class Mapping:
    """One region (or file) mapped into this process."""

    id: int
    size: int
    mm: mmap.mmap

    def close(self) -> None:
        self.mm.close()


class PoolClient:
    def __init__(self, socket_path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(socket_path) if socket_path is not None else default_socket()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            self._sock.connect(str(self.path))
        except OSError as e:
            self._sock.close()
            raise ConnectionError(f"cannot reach the tierd memory pool at {self.path}: "
                                  f"{e.strerror or e} (is tierd running? set "
                                  f"TIERD_POOL_SOCKET; the shared place is {SHARED_SOCKET})"
                                  ) from None
        self._lock = threading.Lock()

    def call(self, op: str, **fields: Any) -> tuple[dict[str, Any], list[int]]:
        """One request; the reply and the descriptors that came with it (the caller owns
        them).  A refusal raises :class:`PoolRequestError`."""
        with self._lock:
            self._sock.sendall(encode({"op": op, **fields}))
            reply, fds = recv_message(self._sock)
        if not reply.get("ok"):
            for fd in fds:
                os.close(fd)
            code = int(reply.get("errno", errno.EIO))
            cls = {errno.EDQUOT: PoolQuotaExceeded, errno.ENOSPC: PoolFull}.get(
                code, PoolRequestError)
            raise cls(code, str(reply.get("error", "refused")))
        return reply, fds

    # -- regions -------------------------------------------------------------------------
    def alloc(self, size: int, name: str = "", persistent: bool = False) -> Mapping:
        reply, fds = self.call("alloc", size=size, name=name, persistent=persistent)
        return self.map_region(reply["region"], fds)

    def open(self, region: int) -> Mapping:
        reply, fds = self.call("open", region=region)
        return self.map_region(reply["region"], fds)

    def free(self, region: int) -> None:
        self.call("free", region=region)

    def regions(self) -> list[dict[str, Any]]:
        regions: list[dict[str, Any]] = self.call("list")[0]["regions"]
        return regions

    def stats(self) -> dict[str, Any]:
        return self.call("stats")[0]

    @staticmethod
    def map_region(region: dict[str, Any], fds: list[int], private: bool = False) -> Mapping:
        """Map the first of ``fds`` (``region``: its id and size) and close them all;
        ``private``: copy-on-write, this process's writes stay its own."""
        fd = fds[0]
        try:
            size = int(region["size"])
            flags = mmap.MAP_PRIVATE if private else mmap.MAP_SHARED
            mm = mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            for f in fds:
                os.close(f)
        return Mapping(int(region["id"]), size, mm)

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> PoolClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
