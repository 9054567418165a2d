"""The tierd process: one asyncio loop owning the namespace and serving every door.

:meth:`Daemon.run` is the whole life cycle:

1. take the data directory's lock (``flock`` on ``<data_dir>/tierd.lock``; the file holds the
   PID) -- two daemons on one lmdb environment and one set of tier directories would corrupt
   each other, so the second one refuses, naming the data directory and the holder's PID;
2. create the directory layout, open the metadata store and the namespace, and mount it
   with FUSE when ``mount`` is set (served by this same loop; see :mod:`tierd_fuse`);
3. start the S3 and admin listeners (port 0 = any free port), log the bound addresses and
   write them to ``<data_dir>/endpoints.json`` for tests and tools;
4. wait for SIGTERM or SIGINT, then shut down in reverse order and return, so the process
   exits 0 after a clean stop.

Startup failures (lock held, port in use, unusable directory) raise :class:`StartupError`
with a message for the operator; the CLI turns it into a non-zero exit.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import fcntl
import json
import os
import signal
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from tierd import __version__
from tierd.acl.keys import CredentialsError, KeyStore, bootstrap_root_key, migrate_keys
from tierd.acl.secrets import SecretBox, SecretError, write_private
from tierd.acl.users import Directory
from tierd.admin import AdminAuth, bootstrap_admin_token, make_admin_app
from tierd.admin.auth import TokenError
from tierd.admin.metrics import instrument_admin
from tierd.checkpoint.door import MemoryDoor
from tierd.cluster import cluster_node, follow_cluster
from tierd.config import Config, HostPort
from tierd.errors import no_space
from tierd.logs import AccessLogger, get_logger, kv
from tierd.meta.store import MetaStore
from tierd.metrics import Metrics
from tierd.namespace import Namespace
from tierd.namespace.lifecycle import LifecycleJob
from tierd.placement import Placement
from tierd.placement.ops import PlacementOps, placement_from_config
from tierd.s3 import limits as s3_limits
from tierd.s3 import make_s3_app
from tierd.s3.auth import Authenticator

if TYPE_CHECKING:
    from tierd_fuse import FuseDoor

log = get_logger("daemon")

#: seconds a listener waits for in-flight requests at shutdown before closing them
SHUTDOWN_GRACE = 5.0


class StartupError(Exception):
    """The daemon cannot start; the message says why and what to do."""


class DataDirLock:
    """An exclusive, non-blocking ``flock`` on ``<data_dir>/tierd.lock``.

    ``flock`` (not a PID file alone) because the kernel drops it when the process dies, so a
    crashed daemon never leaves a stale lock behind.  The PID is written into the file only
    to name the holder in the second instance's error message.  The file is never unlinked:
    unlinking a lock file races with a newcomer locking the old inode.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise StartupError(f"cannot open lock file {self.path}: {e.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StartupError(
                f"another tierd (pid {holder}) is already running on data directory "
                f"{self.path.parent} (lock {self.path}); stop it or use another --data-dir "
                "(to mount the running daemon's namespace: tierctl mount add DIR)"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        pid = f"{os.getpid()}\n".encode()
        try:  # written over the old PID, then cut: no new block needed on a full disk
            os.pwrite(fd, pid, 0)
            os.ftruncate(fd, len(pid))
        except OSError as e:  # only names the holder to a second instance: not fatal
            log.warning("cannot record the PID in the lock file %s: %s", self.path,
                        e.strerror or e)

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)  # before unlocking: the next holder writes its own PID
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def _url_host(host: str) -> str:
    """A host to put in a URL that clients can connect to (wildcards become loopback)."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


class Daemon:
    """One tierd process.  ``await Daemon(config).run()`` serves until SIGTERM/SIGINT."""

    def __init__(self, config: Config, *, exit_on_unmount: bool = False) -> None:
        self.config = config
        #: stop the daemon when its mount is removed from outside (``tierd mount`` sets it)
        self.exit_on_unmount = exit_on_unmount
        self.fuse: FuseDoor | None = None
        self.started_monotonic = 0.0
        self.meta: MetaStore | None = None
        self.placement: Placement | None = None
        self.namespace: Namespace | None = None
        self.memory: MemoryDoor | None = None
        #: the job applying the buckets' S3 lifecycle rules, once started
        self.lifecycle: LifecycleJob | None = None
        #: access keys (S3 door, admin API) and the user directory, once started
        self.keys: KeyStore | None = None
        self.users: Directory | None = None
        #: door name -> bound (host, port) of its first socket; filled once listening
        self.bound: dict[str, HostPort] = {}
        #: this daemon's Prometheus registry (GET /metrics on the admin listener)
        self.metrics = Metrics()
        self._stop = asyncio.Event()
        self._stop_signal: str | None = None

    # -- life cycle --------------------------------------------------------------------------

    async def run(self) -> None:
        """Start, serve until asked to stop, stop.  Raises :class:`StartupError`."""
        self.started_monotonic = time.monotonic()
        loop = asyncio.get_running_loop()
        # Blocking file calls (fdatasync above all) wait on the disk, not the CPU: asyncio's
        # default of cores + 4 threads made concurrent PUTs queue behind each other's syncs.
        loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(
            max_workers=self.config.io_threads, thread_name_prefix="tierd-io"))
        # Handlers first: a signal arriving during start-up must stop us cleanly afterwards,
        # not kill the process half-way through opening the store.  (Outside the main thread,
        # e.g. embedded in a test, there are no signal handlers: use request_stop().)
        handled: list[signal.Signals] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self._on_signal, sig)
                handled.append(sig)
            except (ValueError, RuntimeError):
                log.debug("no handler for %s outside the main thread", sig.name)
        try:
            async with self._started():
                log.info("tierd ready", extra=kv(pid=os.getpid(), version=__version__))
                await self._stop.wait()
                log.info("shutting down", extra=kv(signal=self._stop_signal))
            log.info("stopped cleanly")
        finally:
            for sig in handled:
                loop.remove_signal_handler(sig)

    def request_stop(self) -> None:
        """Ask :meth:`run` to shut down (what SIGTERM does)."""
        self._stop.set()

    def _on_signal(self, sig: signal.Signals) -> None:
        if self._stop.is_set():
            log.warning("already shutting down", extra=kv(signal=sig.name))
            return
        self._stop_signal = sig.name
        self._stop.set()

    @contextlib.asynccontextmanager
    async def _started(self) -> AsyncIterator[None]:
        """Everything :meth:`run` starts, stopped in reverse order on the way out."""
        cfg = self.config
        async with contextlib.AsyncExitStack() as stack:
            self._make_dirs([cfg.data_dir])
            lock = DataDirLock(cfg.lock_file)
            lock.acquire()
            stack.callback(lock.release)
            log.info("data directory locked", extra=kv(data_dir=cfg.data_dir))
            if cfg.mount is not None:
                await self._clear_stale_mount(cfg.mount)
            await self._clear_last_mount()
            self._make_dirs([cfg.meta_dir, cfg.hot_dir, cfg.warm_dir, cfg.cold_dir])

            # lmdb open/close touch the disk, PostgreSQL's the network: keep them off the loop.
            where = "the metadata database (meta_url)" if cfg.meta_url else cfg.meta_dir
            try:
                if cfg.meta_url:
                    self.meta = await asyncio.to_thread(
                        MetaStore.open_pg, cfg.meta_url, sync=cfg.meta_sync,
                        node=cfg.node_name)
                else:
                    self.meta = await asyncio.to_thread(
                        MetaStore.open_lmdb, cfg.meta_dir, sync=cfg.meta_sync,
                        map_size=cfg.meta_map_size)
            except Exception as e:  # lmdb/psycopg errors, SchemaError: nothing to serve
                raise StartupError(
                    f"cannot open the metadata store in {where}: {type(e).__name__}: {e}"
                ) from e
            stack.push_async_callback(self._close_meta)
            self.meta.node = cfg.node_name  # a node of a cluster: its own records
            self.placement = await placement_from_config(cfg, self.meta)
            stack.push_async_callback(self.placement.shutdown)
            self.namespace = await Namespace.load(self.meta, cfg.hot_dir, umask=cfg.umask,
                                                  placement=self.placement)
            stack.push_async_callback(self._close_namespace)
            if cfg.node_name:  # one node of a cluster: the peer door before any other door
                try:
                    await stack.enter_async_context(
                        cluster_node(cfg, self.meta, self.namespace, self.placement))
                except OSError as e:  # PeerDoorError: its message names peer_listen
                    raise StartupError(str(e)) from None
                stop_follow = follow_cluster(self.namespace, self.placement, self.meta,
                                             self._forget_keys)
                if stop_follow is not None:  # joins the feed's thread: off the loop
                    stack.push_async_callback(asyncio.to_thread, stop_follow)
            self.memory = MemoryDoor.from_config(self.namespace, cfg)
            try:
                await self.memory.start()
            except OSError as e:
                raise StartupError(f"cannot serve the memory pool on {cfg.pool_socket}: "
                                   f"{e.strerror or e} (setting pool_socket)") from None
            stack.push_async_callback(self.memory.stop)
            # the pool is also a placement tier (policies naming "mem")
            self.placement.attach_pool(self.memory.pool, cfg.pool_mem_tier_share)
            stack.callback(self.placement.detach_pool)
            self.metrics.attach(placement=self.placement, pool=self.memory.pool)
            stack.callback(self.metrics.attach)  # nothing to read once they are closed
            self.memory.ckpt.observe = self.metrics.observe_checkpoint
            self.lifecycle = LifecycleJob(self.namespace, cfg.lifecycle_interval,
                                          on_action=self.metrics.observe_lifecycle)
            self.lifecycle.start()
            stack.push_async_callback(self.lifecycle.stop)

            # the mount of the setting, or one attached later (POST /v1/mounts)
            stack.push_async_callback(self._unmount)
            if cfg.mount is not None:
                await self._mount(cfg.mount)

            admin_auth = await self._setup_identity(self.meta)
            admin = make_admin_app(self, admin_auth)
            instrument_admin(admin, self.metrics)
            s3 = await self._make_s3(self.meta, self.namespace)
            for door, app, addr, key in (
                ("s3", s3, cfg.s3_listen, "s3_listen"),
                ("admin", admin, cfg.admin_listen, "admin_listen"),
            ):
                runner = await self._listen(door, app, addr, key)
                stack.push_async_callback(runner.cleanup)

            await asyncio.to_thread(self._write_endpoints)
            stack.callback(self._remove_endpoints)
            yield

    def _forget_keys(self) -> None:
        """Cached S3 credentials are stale (another node changed users or keys)."""
        if self.keys is not None:
            self.keys.invalidate()

    async def _setup_identity(self, meta: MetaStore) -> AdminAuth:
        """Users and keys (secrets key, migration of older records, the root key) and the
        admin token; see tierd.acl.keys and tierd.admin.auth."""
        cfg = self.config

        def setup() -> tuple[KeyStore, str]:
            box = (SecretBox.from_cluster_secret(cfg.cluster_secret) if cfg.node_name
                   else SecretBox.from_data_dir(cfg.data_dir))
            migrate_keys(meta, box)
            bootstrap_root_key(meta, cfg.data_dir, box=box)
            return KeyStore(meta, box), bootstrap_admin_token(cfg.data_dir)

        try:
            keys, token = await asyncio.to_thread(setup)
        except CredentialsError as e:
            raise StartupError(f"S3 root credentials: {e}") from None
        except (SecretError, TokenError) as e:
            raise StartupError(str(e)) from None
        except OSError as e:
            raise StartupError(f"cannot write the credentials files in {cfg.data_dir}: "
                               f"{e.strerror or e}") from None
        self.keys, self.users = keys, Directory(keys)
        sigv4 = Authenticator(keys, cfg.region, float(cfg.s3_max_clock_skew))
        return AdminAuth(token, sigv4)

    async def _make_s3(self, meta: MetaStore, ns: Namespace) -> web.Application:
        """The S3 gateway (keys from :meth:`_setup_identity`)."""
        cfg = self.config
        assert self.keys is not None
        ns.min_part_size = cfg.s3_min_part_size
        app = make_s3_app(ns, self.keys, region=cfg.region, domains=cfg.s3_domain,
                          max_skew=float(cfg.s3_max_clock_skew), metrics=self.metrics,
                          allow_sigv2=cfg.s3_allow_sigv2,
                          complete_keepalive=cfg.s3_complete_keepalive)
        s3_limits.apply(app, cfg.s3_idle_timeout, cfg.s3_body_timeout)
        return app

    @staticmethod
    def _make_dirs(dirs: list[Path]) -> None:
        for d in dirs:
            try:
                d.mkdir(parents=True, exist_ok=True, mode=0o700)
            except (FileExistsError, NotADirectoryError):  # mkdir's "File exists" misleads
                raise StartupError(f"cannot use {d} as a directory: it or a directory above "
                                   "it is a file; choose another path") from None
            except OSError as e:
                raise StartupError(f"cannot create directory {d}: {e.strerror}") from None
            if not os.access(d, os.W_OK | os.X_OK):
                raise StartupError(f"directory {d} is not writable by this user")

    async def _listen(
        self, door: str, app: web.Application, addr: HostPort, key: str
    ) -> web.AppRunner:
        runner = app.get(s3_limits.RUNNER_CLASS, web.AppRunner)(
            app,
            access_log_class=AccessLogger,
            access_log=get_logger(f"{door}.access"),
            shutdown_timeout=SHUTDOWN_GRACE,
            # bodies are stored as sent: Content-Encoding is an object's metadata to S3 (a
            # gzip object keeps its bytes and ETag), and no door takes compressed requests
            auto_decompress=False,
            **app.get(s3_limits.RUNNER_ARGS, {}),
        )
        await runner.setup()
        site = web.TCPSite(runner, addr.host, addr.port, shutdown_timeout=SHUTDOWN_GRACE)
        try:
            await site.start()
        except OSError as e:
            await runner.cleanup()
            if isinstance(e, socket.gaierror):
                why = f"cannot resolve host {addr.host!r} ({e.strerror})"
            elif e.errno == errno.EADDRINUSE:
                why = "address already in use (another process listens there)"
            else:
                why = e.strerror or str(e)
            raise StartupError(
                f"cannot listen for {door} on {addr}: {why}; change {key} "
                f"(--{key.replace('_', '-')} or TIERD_{key.upper()})"
            ) from None
        first = runner.addresses[0]  # a host name may bind several sockets; report one
        self.bound[door] = HostPort(first[0], int(first[1]))
        log.info(
            "listening",
            extra=kv(door=door, address=str(self.bound[door]), url=self._url(door)),
        )
        return runner

    # -- the FUSE door ---------------------------------------------------------------------------

    async def _mount(self, mountpoint: Path) -> None:
        """Mount the namespace at ``mountpoint``, served by this loop (a stale mount left by
        a killed daemon is cleared first; a busy mount point is refused)."""
        # imported here: a daemon without a mount must not need a working FUSE install
        from tierd_fuse import MountError

        try:
            await self.attach_mount(mountpoint)
        except MountError as e:
            raise StartupError(f"{e} (setting mount)") from None

    async def _clear_stale_mount(self, mountpoint: Path) -> None:
        """Before the namespace loads, clear a mount a killed daemon left at ``mountpoint``
        (and refuse a busy one), not only when mounting.  The dead mount's kernel connection
        keeps the hot files the daemon passed through (backing files) until the mount goes,
        and with them a write lease the daemon held at its death (``fuse/files.py``
        ``written_elsewhere`` takes one and gives it back at a passthrough writer's
        release); the start's recovery opens those files (``HotDir.detach``), and an open of
        a file under a lease nobody gives back waits the kernel's lease-break-time (45 s):
        the start stalled that long when the kill fell between the two calls."""
        from tierd_fuse import MountError
        from tierd_fuse.mount import prepare_mountpoint

        try:
            await prepare_mountpoint(mountpoint)
        except MountError as e:
            raise StartupError(f"{e} (setting mount)") from None

    async def _clear_last_mount(self) -> None:
        """The mount a killed daemon of this data directory had attached at run time
        (``POST /v1/mounts``): the ``endpoints.json`` it left names it.  Cleared like the
        ``mount`` setting's when its server is gone, for the same reason; left alone when
        something else serves there now."""
        try:
            doc = json.loads(self.config.endpoints_file.read_text())
            last = doc.get("mount") if doc.get("pid") != os.getpid() else None
        except (OSError, ValueError, AttributeError):
            return
        mine = self.config.mount
        if not isinstance(last, str) or (mine is not None and last == os.path.abspath(mine)):
            return
        try:
            from tierd_fuse.mount import clear_if_stale
        except ImportError:  # no FUSE door installed: nothing of ours can be mounted
            return
        await clear_if_stale(Path(last))

    async def attach_mount(self, mountpoint: Path) -> None:
        """Mount the namespace now (at start, or ``POST /v1/mounts`` on a running daemon:
        a second tierd cannot open the data directory).  One mount per daemon (pyfuse3
        has one session per process); ``tierd_fuse.MountError`` says why not."""
        from tierd_fuse import FuseDoor, MountError

        assert self.namespace is not None
        if self.fuse is not None:
            raise MountError(f"this tierd already serves a mount at {self.fuse.mountpoint} "
                             "(one per daemon): remove it first (tierctl mount rm)")
        door = FuseDoor(self.namespace, mountpoint, on_unmounted=self._on_unmounted,
                        metrics=self.metrics, backend=self.config.fuse_backend,
                        passthrough=self.config.fuse_passthrough,
                        passthrough_writes=self.config.fuse_passthrough_writes,
                        poll_us=self.config.fuse_poll_us)
        await door.start()
        self.fuse = door
        if self.bound:  # serving already: tools read the mount from endpoints.json
            await asyncio.to_thread(self._write_endpoints)

    async def detach_mount(self) -> None:
        """Unmount (``DELETE /v1/mounts``) as at shutdown: a mount still in use is
        detached, and processes with files open on it get ENOTCONN."""
        await self._unmount()
        await asyncio.to_thread(self._write_endpoints)

    async def _unmount(self) -> None:
        if self.fuse is not None:
            door, self.fuse = self.fuse, None
            await door.stop()

    def _on_unmounted(self) -> None:
        """The mount went away from outside (``tierd umount``)."""
        self.fuse = None  # the door is closed: a new mount may be attached
        if self.exit_on_unmount:
            log.info("mount removed; stopping as asked (exit on unmount)")
            self.request_stop()

    async def _close_namespace(self) -> None:
        if self.namespace is not None:
            ns, self.namespace = self.namespace, None
            await ns.close()

    async def _close_meta(self) -> None:
        if self.meta is not None:
            meta, self.meta = self.meta, None
            await asyncio.to_thread(meta.close)

    # -- endpoints.json ----------------------------------------------------------------------

    def _url(self, door: str) -> str:
        hp = self.bound[door]
        return f"http://{_url_host(hp.host)}:{hp.port}"

    def endpoints(self) -> dict[str, Any]:
        """What ``endpoints.json`` holds: the PID and, per door, the bound address."""
        doc: dict[str, Any] = {"pid": os.getpid(), "data_dir": str(self.config.data_dir)}
        for door, hp in self.bound.items():
            doc[door] = {"host": hp.host, "port": hp.port, "url": self._url(door)}
        if self.fuse is not None:
            doc["mount"] = str(self.fuse.mountpoint)
        if self.memory is not None:
            doc["pool_socket"] = str(self.memory.server.path)
        return doc

    def _write_endpoints(self) -> None:
        """Write ``endpoints.json`` atomically (readers never see half a file).  On a full
        disk the previous run's file goes first (it names dead ports anyway, and frees
        the block the new one needs); if it still does not fit, start anyway without it:
        the addresses are in the log."""
        path = self.config.endpoints_file
        tmp = path.with_name(path.name + ".tmp")
        text = (json.dumps(self.endpoints(), indent=2) + "\n").encode()
        for attempt in (0, 1):
            try:
                write_private(tmp, text, mode=0o644)
                os.replace(tmp, path)
                return
            except OSError as e:
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()
                if no_space(e) and attempt == 0 and self._stale_endpoints():
                    continue
                log.warning("cannot write %s: %s (the addresses are in the log above)",
                            path, e.strerror or e)
                return

    def _stale_endpoints(self) -> bool:
        """Remove an ``endpoints.json`` another process wrote (a killed daemon's); True
        if one was removed."""
        path = self.config.endpoints_file
        try:
            if json.loads(path.read_text()).get("pid") == os.getpid():
                return False
        except (OSError, ValueError, AttributeError):
            pass
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        return True

    def _remove_endpoints(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.config.endpoints_file.unlink()

    # -- AdminBackend ------------------------------------------------------------------------

    def placement_ops(self) -> PlacementOps | None:
        """Operator actions on placement (admin API), None before start."""
        if self.placement is None or self.namespace is None:
            return None
        return PlacementOps(self.placement)

    def directory(self) -> Directory | None:
        """Users and access keys (admin API), None before start."""
        return self.users

    def memory_door(self) -> MemoryDoor | None:
        """The memory pool and checkpoints (admin API), None before start."""
        return self.memory

    def status(self) -> dict[str, Any]:
        """The ``/v1/status`` document (see :mod:`tierd.admin.app`)."""
        counts = self.namespace.stats() if self.namespace is not None else {}
        meta: dict[str, Any] = {}
        if self.meta is not None:
            meta = {"engine": getattr(self.meta.engine, "name", type(self.meta.engine).__name__)}
            meta.update(self.meta.engine.stat())
        return {
            "version": __version__,
            "uptime_seconds": round(time.monotonic() - self.started_monotonic, 3),
            "data_dir": str(self.config.data_dir),
            "pid": os.getpid(),
            "inodes": counts.get("inodes", 0),
            "bytes": counts.get("bytes", 0),
            "buckets": counts.get("buckets", 0),
            "open_files": counts.get("open_files", 0),
            "meta": meta,
            "listen": {door: str(hp) for door, hp in self.bound.items()},
            "mount": str(self.fuse.mountpoint) if self.fuse is not None else None,
            "pool": None if self.memory is None else {
                k: v for k, v in self.memory.pool.stats().items() if k != "tenants"},
            "mem_tier": (None if self.placement is None or self.placement.mem is None
                         else self.placement.mem.describe()),
            "placement": self._placement_status(),
            "requests": self.metrics.door_totals(),
        }

    def _placement_status(self) -> dict[str, Any] | None:
        """Tiers, dirty bytes, the persist queue and the cold store for ``tierctl status``
        (cheap figures the engine keeps; the queue scan is bounded, see queue_summary)."""
        p = self.placement
        if p is None:
            return None
        tiers = {tc.name: {"used": tc.used, "capacity": tc.capacity} for tc in p.tiers()}
        if p.mem is not None:
            tiers = {"mem": {"used": p.mem.used, "capacity": p.mem.capacity}, **tiers}
        return {
            "tiers": tiers,
            "dirty": {"bytes": p.dirty_bytes, "files": len(p.dirty),
                      "limit": p.settings.dirty_limit},
            "queue": p.queue_summary(),
            "cold": {"url": _no_userinfo(str(getattr(p.cold, "url", ""))),
                     **p.cold_status()},
            "stats": p.stats.as_dict(),
        }


def _no_userinfo(url: str) -> str:
    """``scheme://user:secret@host/x`` -> ``scheme://host/x`` (status documents are shown
    to operators and pasted into tickets)."""
    scheme, sep, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    return f"{scheme}{sep}{netloc.rpartition('@')[2]}{slash}{path}" if sep else url
