"""What every admin route shares: the backend it serves (the daemon), declared as a
:class:`~typing.Protocol`, the application keys its state lives under, and the error answer.

The routes are module-level handlers on each module's :class:`aiohttp.web.RouteTableDef`;
they find the daemon as ``request.app[BACKEND]`` and call only what :class:`AdminBackend`
declares, so what the admin door may reach is written down here (and mypy checks that
:class:`tierd.daemon.Daemon` provides it) instead of being found with ``getattr``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from aiohttp import web

from tierd.admin.auth import AdminAuth

if TYPE_CHECKING:
    from tierd.acl.users import Directory
    from tierd.checkpoint.door import MemoryDoor
    from tierd.config import Config
    from tierd.namespace.api import NamespaceAPI
    from tierd.placement.ops import PlacementOps


class Mount(Protocol):
    """The daemon's FUSE mount, as the admin API shows it."""

    @property
    def mountpoint(self) -> Path:
        """Where it is mounted."""
        ...


class AdminBackend(Protocol):
    """What the admin API needs from the daemon; each part is None until it has started
    (a route then answers 503)."""

    @property
    def config(self) -> Config:
        """The daemon's settings (the status page reads its data directory)."""
        ...

    @property
    def fuse(self) -> Mount | None:
        """The FUSE mount it serves, if any (``/v1/mounts``)."""
        ...

    @property
    def namespace(self) -> NamespaceAPI | None:
        """The namespace buckets are made and read through (``/v1/buckets``)."""
        ...

    def status(self) -> dict[str, Any]:
        """The ``/v1/status`` document."""
        ...

    def placement_ops(self) -> PlacementOps | None:
        """Operator actions on placement (``/v1/placement``, ``/v1/tiers``, ``/v1/jobs``)."""
        ...

    def directory(self) -> Directory | None:
        """Users and access keys (``/v1/users``, ``/v1/keys``; owners of buckets)."""
        ...

    def memory_door(self) -> MemoryDoor | None:
        """The memory pool and checkpoints (``/v1/pool``, ``/v1/ckpt``)."""
        ...

    async def attach_mount(self, mountpoint: Path) -> None:
        """Mount the namespace at ``mountpoint`` (``tierd_fuse.MountError`` when refused)."""
        ...

    async def detach_mount(self) -> None:
        """Unmount it, as at shutdown."""
        ...


#: the daemon the routes serve
BACKEND: web.AppKey[AdminBackend] = web.AppKey("tierd.admin.backend")
#: the admin API's tokens (the status page logs in with them)
AUTH: web.AppKey[AdminAuth] = web.AppKey("tierd.admin.auth")


_T = TypeVar("_T")


def ready(part: _T | None, why: str) -> _T:
    """``part`` of the daemon, or ``503`` with ``why`` while it has not started."""
    if part is None:
        raise web.HTTPServiceUnavailable(reason=why)
    return part


def json_error(status: int, code: str, message: str) -> web.Response:
    """The admin API's error answer, ``{"error": code, "message": text}`` (every module's)."""
    return web.json_response({"error": code, "message": message}, status=status)
