"""The peer data door of one node: its server (:mod:`tierd.peer.server`), its registry
entry and heartbeat (:mod:`tierd.peer.registry`), started and stopped together.

The daemon starts it once its namespace can read (the reader answers from the hot tier) and
stops it before the namespace closes.  Listening comes first and registering second, so
the URL other nodes find in the registry always answers; ``peer_listen`` may name port 0,
and the URL then carries the port the door got.
"""

from __future__ import annotations

import asyncio
import errno
import socket

from aiohttp import web

from tierd.config_parsers import HostPort
from tierd.logs import get_logger
from tierd.meta.store import MetaStore
from tierd.peer import registry, server
from tierd.peer.registry import Heartbeat, NodeInfo
from tierd.peer.server import LocalReader, PartReader

log = get_logger("peer")

_WILDCARDS = ("", "0.0.0.0", "::")


def default_url(bound: HostPort) -> str:
    """``http://HOST:PORT`` of a bound door; a wildcard address (listening on every
    interface) becomes this machine's host name, the one name of it other nodes may
    resolve (set ``peer_url`` when they cannot)."""
    host = socket.gethostname() if bound.host in _WILDCARDS else bound.host
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    return f"http://{host}:{bound.port}"


class PeerDoorError(OSError):
    """The door cannot start: the message says why and which setting to change (an
    ``OSError``, as a failed listen is anywhere else)."""


def _why(e: OSError, host: str) -> str:
    if isinstance(e, socket.gaierror):
        return f"cannot resolve host {host!r} ({e.strerror})"
    if e.errno == errno.EADDRINUSE:
        return "address already in use (another process listens there)"
    return e.strerror or str(e)


class PeerDoor:
    """Node ``node``'s peer data door on ``listen``, reachable at ``url`` ("" = the
    default: :func:`default_url`), serving ``reader`` to requests signed with ``secret``
    and registered in ``meta`` (and multipart parts with ``part_reader``)."""

    def __init__(self, *, node: str, secret: str, listen: HostPort, meta: MetaStore,
                 reader: LocalReader, url: str = "",
                 heartbeat_s: float = registry.HEARTBEAT_S,
                 max_length: int = server.MAX_LENGTH,
                 part_reader: PartReader | None = None) -> None:
        self.node = node
        self.listen = listen
        self.meta = meta
        self.url = url
        self.bound: HostPort | None = None
        self.info: NodeInfo | None = None
        self._app = server.make_app(node, secret, reader, max_length=max_length,
                                    part_reader=part_reader)
        self._heartbeat_s = heartbeat_s
        self._runner: web.AppRunner | None = None
        self.heartbeat: Heartbeat | None = None

    async def start(self) -> str:
        """Listen, register and start the heartbeat; returns the URL registered.
        :class:`PeerDoorError` says what failed in words an operator can act on."""
        runner = web.AppRunner(self._app, access_log=None, shutdown_timeout=2.0)
        await runner.setup()
        site = web.TCPSite(runner, self.listen.host, self.listen.port)
        try:
            await site.start()
        except BaseException as e:
            await runner.cleanup()
            if isinstance(e, OSError):
                raise PeerDoorError(f"cannot listen for the peer door on {self.listen}: "
                                    f"{_why(e, self.listen.host)}; change peer_listen "
                                    "(--peer-listen or TIERD_PEER_LISTEN)") from None
            raise
        self._runner = runner
        first = runner.addresses[0]
        self.bound = HostPort(str(first[0]), int(first[1]))
        self.url = self.url or default_url(self.bound)
        try:
            self.info = await asyncio.to_thread(registry.register, self.meta, self.node,
                                                self.url)
        except BaseException as e:
            await self.stop()
            if isinstance(e, Exception):
                raise PeerDoorError(f"cannot register node {self.node!r} in the metadata "
                                    f"store's node registry: {e}") from e
            raise
        self.heartbeat = Heartbeat(self.meta, self.info, self._heartbeat_s)
        self.heartbeat.start()
        log.info("peer door of node %r listening on %s, registered as %s", self.node,
                 self.bound, self.url)
        return self.url

    async def stop(self) -> None:
        """Stop the heartbeat and the server.  The registry entry stays: the node is seen
        dead once its lease runs out, and its unpersisted files stay named under it."""
        if self.heartbeat is not None:
            await self.heartbeat.stop()
            self.heartbeat = None
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
