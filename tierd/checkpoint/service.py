"""Checkpoints: staged in pool memory, committed atomically, persisted in the background.

A step's life: ``staging`` (the client copies tensors into a region the daemon handed it)
→ ``committed`` (the client said so; the save returns: training goes on) → ``local``
(published in the namespace, durable on the hot tier) → ``persisted`` (cold has it, through
the tiers' write-back).  Only the step directory's rename publishes it, so a crash at any
point leaves it whole or absent; a committed step that had not reached ``local`` lives only
in pool memory and is gone with the daemon, which is why ``wait_persisted`` exists.

Regions are the run's, not the step's: a step that reached ``local`` keeps its region as a
pool copy (loads from it are zero-copy) until the next save of the run reuses it, so steady
state allocates nothing and the client's mapping of the region stays warm.

Retention per run: the last ``keep_local`` steps keep their pool/hot copies, older ones are
evicted from hot once cold has them; with ``keep_cold`` > 0 steps beyond the last
``keep_cold`` are deleted.  The newest committed step is never removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from tierd.acl import Identity
from tierd.checkpoint import publish
from tierd.checkpoint.manifest import (
    DATA,
    FORMAT,
    MANIFEST,
    PART_PREFIX,
    TMP_PREFIX,
    check_manifest,
    check_run,
    check_step,
    parse_step_dir,
    step_dir,
    tmp_dir,
)
from tierd.checkpoint.parts import REMOTE_WAIT, Parts, manifest_parts
from tierd.checkpoint.reclaim import Reclaimer
from tierd.checkpoint.state import (
    COMMITTED,
    FAILED,
    LOCAL,
    PERSISTED,
    STAGING,
    Run,
    Step,
)
from tierd.errors import FsError
from tierd.logs import get_logger, kv
from tierd.mempool.pool import MemPool, PoolError, Region
from tierd.mempool.server import Peer, PoolServer, Reply
from tierd.namespace.api import NamespaceAPI, check_bucket_name

log = get_logger("checkpoint")

#: how long a save waits for a region of its run still being written out before giving up
REGION_WAIT = 60.0

__all__ = ["COMMITTED", "FAILED", "LOCAL", "PERSISTED", "STAGING", "CheckpointService",
           "Run", "Step"]


class CheckpointService:
    def __init__(self, ns: NamespaceAPI, pool: MemPool, *, keep_local: int = 2,
                 keep_cold: int = 0, shared: bool = False) -> None:
        self.ns = ns
        #: a node of a cluster: other nodes publish steps into the same runs
        self.shared = shared
        self.pool = pool
        self.keep_local = keep_local
        self.keep_cold = keep_cold
        self.runs: dict[tuple[str, str], Run] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        #: placement holds taken for readers, per connection
        self._holds: dict[int, list[int]] = defaultdict(list)
        #: (phase, seconds) of each step: stall, local, persisted (the daemon's metrics)
        self.observe: Callable[[str, float], None] | None = None
        #: this daemon's name in a multi-node job's parts (a writer compares it with the
        #: coordinator's to learn whether its node gets the commit directly)
        self.node = uuid.uuid4().hex[:16]
        self.parts = Parts(self)
        self.reclaimer = Reclaimer(self)

    def register(self, server: PoolServer) -> None:
        for op, fn in (("ckpt.stage", self._stage), ("ckpt.commit", self._commit),
                       ("ckpt.abort", self._abort), ("ckpt.wait", self._wait),
                       ("ckpt.list", self._list), ("ckpt.open", self._open),
                       ("ckpt.delete", self._delete), ("ckpt.hello", self._hello)):
            server.route(op, fn)
        server.on_close.append(self._closed)
        self.pool.late_reclaimers.append(self.reclaimer.reclaim)

    async def close(self) -> None:
        with contextlib.suppress(ValueError):
            self.pool.late_reclaimers.remove(self.reclaimer.reclaim)
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await t

    def track(self, t: asyncio.Task[None]) -> None:
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        self.track(asyncio.create_task(coro, name=name))

    def hold(self, peer: Peer, ino: int) -> None:
        """A placement hold on ``ino`` for as long as ``peer`` is connected (set by the
        opener: :func:`publish.open_data`)."""
        self._holds[peer.conn].append(ino)

    # -- runs --------------------------------------------------------------------------
    async def run(self, ident: Identity, msg: dict[str, Any], create: bool = False) -> Run:
        bucket = str(msg.get("bucket") or "checkpoints")
        check_bucket_name(bucket)
        name = check_run(msg.get("run"))
        key = (bucket, name)
        if create:
            await self._ensure_bucket(ident, bucket)
        run = self.runs.get(key)
        if run is None:
            run = Run(bucket, name, self.keep_local, self.keep_cold)
            if not create and not await self._exists(run):
                # a read of a run nobody saved: answer it empty without remembering it (a
                # listing would show every name ever asked for, without bound)
                run.scanned = True
                await self._check_access(ident, run, False)
                return run
            self.runs[key] = run
        for attr in ("keep_local", "keep_cold"):
            if msg.get(attr) is not None:
                v = msg[attr]
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise FsError(errno.EINVAL, f"{attr} must be a non-negative integer")
                setattr(run, attr, v)
        await self._check_access(ident, run, create)
        if not run.scanned or self.shared:  # on a cluster: steps other nodes published
            await self._scan(run)
        await self.parts.resolve(run)
        run.used_at = time.monotonic()
        return run

    async def _exists(self, run: Run) -> bool:
        """Whether the namespace holds the run's directory (a run saved before a restart)."""
        try:
            await self.ns.resolve(Identity.ROOT, f"{run.bucket}/{run.name}")
        except FsError:
            return False
        return True

    async def _check_access(self, ident: Identity, run: Run, write: bool) -> None:
        """The namespace's permission rule on the run's directory (its bucket's while it
        has none), asked before anything is staged: a step the caller could not publish
        must fail at ``stage``, not after the training loop was told it was saved."""
        try:
            d = await self.ns.resolve(ident, f"{run.bucket}/{run.name}")
        except FsError as e:
            if e.errno != errno.ENOENT:
                raise
            try:
                d = await self.ns.resolve(ident, run.bucket)
            except FsError as e2:
                if write or e2.errno != errno.ENOENT:
                    raise
                return  # nothing there to read: the step lookup says "no checkpoints"
        await self.ns.access(ident, d.ino, (os.W_OK if write else os.R_OK) | os.X_OK)

    async def _ensure_bucket(self, ident: Identity, bucket: str) -> None:
        try:
            await self.ns.get_bucket(bucket)
        except FsError as e:
            if e.errno != errno.ENOENT:
                raise
            with contextlib.suppress(FsError):  # a racing creator is fine
                await self.ns.create_bucket(ident, bucket)

    async def _scan(self, run: Run) -> None:
        """Learn the steps the namespace holds (after a restart) and drop a crash's
        temporary directories."""
        try:
            d = await self.ns.resolve(Identity.ROOT, f"{run.bucket}/{run.name}")
        except FsError:
            run.scanned = True
            return
        seen: set[int] = set()
        # on a cluster a published step missing from the listing was deleted by another
        # node -- if it was published before the listing was read: a step of this node's
        # whose publish ends while the listing is read (its state turns LOCAL meanwhile)
        # may be missing from it, and is not gone
        known = {n for n, s in run.steps.items() if s.state in (LOCAL, PERSISTED)}
        for name_b, inode in await self.ns.listdir(Identity.ROOT, d.ino):
            name = name_b.decode(errors="replace")
            n = parse_step_dir(name)
            if n is not None and inode.is_dir:
                seen.add(n)
            if n is not None and inode.is_dir and n not in run.steps:
                run.steps[n] = Step(n, Identity(inode.uid, inode.gid), LOCAL)
                run.steps[n].local.set()
            elif name.startswith(TMP_PREFIX) and not self.shared:
                # (on a cluster it may be another node's save in progress: left alone)
                await publish.remove_step_dir(self.ns, Identity.ROOT, run.bucket, run.name,
                                              name)
        if self.shared:  # steps another node deleted are gone here too
            for n in [n for n, s in run.steps.items()
                      if s.state in (LOCAL, PERSISTED) and n in known and n not in seen]:
                del run.steps[n]
        for s in run.steps.values():
            if s.state == LOCAL and not s.inos:
                await self._learn_inos(run, s)
        run.scanned = True

    async def _learn_inos(self, run: Run, s: Step) -> None:
        """The files of a published step (its data or the parts held here, and the
        manifest)."""
        inos = []
        with contextlib.suppress(FsError):
            d = await self.ns.resolve(Identity.ROOT,
                                      f"{run.bucket}/{run.name}/{step_dir(s.step)}")
            inos = [inode.ino for name, inode in await self.ns.listdir(Identity.ROOT, d.ino)
                    if name.decode(errors="replace") in (DATA, MANIFEST)
                    or name.startswith(PART_PREFIX.encode())]
        s.inos = inos
        if self.ns.all_persisted(inos):
            s.state = PERSISTED
            s.persisted.set()

    # -- saving ------------------------------------------------------------------------
    async def _hello(self, peer: Peer, msg: dict[str, Any]) -> Reply:
        return Reply(node=self.node, tenant=peer.tenant)

    async def _stage(self, peer: Peer, msg: dict[str, Any]) -> Reply:
        run = await self.run(peer.ident, msg, create=True)
        n = check_step(msg.get("step"))
        run.conns.add(peer.conn)
        if msg.get("parts") is not None:
            return await self.parts.stage(peer, run, n, msg)
        size = max(int(msg["size"]), 1)
        old = run.steps.get(n)
        if old is not None and old.state != FAILED:
            raise FsError(errno.EEXIST, f"step {n} of run {run.name!r} already exists "
                          f"({old.state}); delete it first or save another step")
        region = await self.region_for(run, peer, size)
        old = run.steps.get(n)  # (the wait for a region let other requests in)
        if old is not None and old.state != FAILED:
            raise FsError(errno.EEXIST, f"step {n} of run {run.name!r} is being saved")
        for s in run.steps.values():
            s.forget_region(region)  # its pool copy is overwritten now; hot has it
        region.conn, region.persistent = peer.conn, False
        run.steps[n] = Step(n, peer.ident, STAGING, region, peer.conn)
        run.region_part[region.id] = -1
        return Reply([os.dup(region.fd)], region=region.describe(), node=self.node)

    async def region_for(self, run: Run, peer: Peer, size: int, part: int = -1) -> Region:
        """A region of at least ``size`` bytes: an idle one of the run's (the one this
        part had last time first: the writer's mapping of it is warm), else a new one,
        making room by reclaiming the pool copies of other runs (least recently used
        first), freeing the run's own idle regions and waiting for busy ones."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + REGION_WAIT
        while True:
            idle = [r for r in run.regions if r.tenant == peer.tenant and r.size >= size
                    and not run.region_busy(r) and r.id in self.pool.regions]
            if idle:
                return min(idle, key=lambda r: (run.region_part.get(r.id) != part, r.size))
            try:
                with self.reclaimer.sparing(run):
                    self.pool.check_room(peer.tenant, size)
            except PoolError:
                spare = [r for r in run.regions if r.tenant == peer.tenant
                         and not run.region_busy(r)]
                if spare:
                    self.drop_region(run, spare[0])
                    continue
                busy = any(run.region_busy(r) for r in run.regions)
                if not busy or loop.time() >= deadline:
                    raise  # the quota/full error, naming the numbers
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(run.changed.wait(), deadline - loop.time())
                continue
            r = await self.pool.alloc_backed(peer.tenant, size,
                                             name=f"ckpt:{run.bucket}/{run.name}",
                                             conn=peer.conn)
            run.regions.append(r)
            return r

    def drop_region(self, run: Run, r: Region) -> None:
        run.regions.remove(r)
        run.region_part.pop(r.id, None)
        for s in run.steps.values():
            s.forget_region(r)
        if r.id in self.pool.regions:
            self.pool.free(r.id)

    def _staged(self, run: Run, peer: Peer, n: int) -> Step:
        s = run.steps.get(n)
        if s is None or s.parts or s.state != STAGING or s.conn != peer.conn:
            raise FsError(errno.ENOENT, f"step {n} of run {run.name!r} is not being staged "
                          "by this connection")
        return s

    async def _commit(self, peer: Peer, msg: dict[str, Any]) -> Reply:
        run = await self.run(peer.ident, msg)
        n = check_step(msg.get("step"))
        if msg.get("part") is not None:
            return await self.parts.commit_part(peer, run, n, msg)
        if msg.get("parts") is not None:
            return await self.parts.commit(peer, run, n, msg)
        s = self._staged(run, peer, n)
        assert s.region is not None
        doc = check_manifest(msg.get("manifest"), s.region.size)
        doc.update(format=FORMAT, run=run.name, step=s.step)
        s.manifest = doc
        s.state = COMMITTED
        s.committed_at = time.monotonic()
        if self.observe is not None:
            self.observe("stall", s.committed_at - s.staged_at)
        s.region.conn, s.region.persistent = 0, True  # the daemon's now, until published
        self.spawn(self._persist(run, s), f"ckpt-{run.name}-{s.step}")
        return Reply(state=s.state)

    async def _abort(self, peer: Peer, msg: dict[str, Any]) -> Reply:
        run = await self.run(peer.ident, msg)
        n = check_step(msg.get("step"))
        if msg.get("part") is not None:
            return await self.parts.abort(peer, run, n, msg)
        s = self._staged(run, peer, n)
        del run.steps[s.step]
        if s.region is not None:
            s.region.conn, s.region.persistent = 0, True
        run.signal()
        return Reply(aborted=s.step)

    def _closed(self, peer: Peer) -> None:
        """A client went away: its staged steps vanish (their regions are already freed),
        and its parts' steps learn what that means for them (:meth:`Parts.closed`)."""
        self.parts.closed(peer)
        for run in self.runs.values():
            run.conns.discard(peer.conn)
            for n in [n for n, s in run.steps.items()
                      if s.state == STAGING and not s.parts and s.conn == peer.conn]:
                del run.steps[n]
                log.info("dropped a staged checkpoint of a closed connection",
                         extra=kv(run=run.name, step=n, pid=peer.pid))
            for r in [r for r in run.regions if r.id not in self.pool.regions]:
                self.drop_region(run, r)  # (freed with the connection already)
            run.signal()
        for ino in self._holds.pop(peer.conn, []):
            self.ns.release_held(ino)

    async def _persist(self, run: Run, s: Step) -> None:
        assert s.region is not None and s.manifest is not None
        try:
            s.inos = await publish.publish(self.ns, self.pool.far, s.ident, run.bucket,
                                           run.name, s.step, s.region, s.manifest)
            await self.published(run, s)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.exception("checkpoint %s/%s step %d failed", run.bucket, run.name, s.step)
            s.state, s.error = FAILED, f"{type(e).__name__}: {e}"
            s.local.set()
            s.persisted.set()
            await publish.remove_step_dir(self.ns, Identity.ROOT, run.bucket, run.name,
                                          tmp_dir(s.step))
        finally:
            run.signal()

    async def published(self, run: Run, s: Step,
                        elsewhere: Callable[[], Awaitable[None]] | None = None) -> None:
        """Step ``s`` is on hot under its name: ``local``; then ``persisted`` once the
        placement engine has its files in cold (and ``elsewhere`` returned: the parts other
        nodes wrote), with a retention pass after each."""
        s.state = LOCAL
        s.local.set()
        if self.observe is not None:
            self.observe("local", time.monotonic() - s.committed_at)
        run.signal()
        await self.retain(run)
        for ino in s.inos:
            await self.ns.wait_persisted(ino)
        if elsewhere is not None:
            await elsewhere()
        if s.state == LOCAL:
            s.state = PERSISTED
        s.persisted.set()
        if self.observe is not None:
            self.observe("persisted", time.monotonic() - s.committed_at)
        await self.retain(run)

    async def retain(self, run: Run) -> None:
        async with run.retaining:
            done = sorted(n for n, s in run.steps.items() if s.state in (LOCAL, PERSISTED))
            if not done:
                return
            newest = done[-1]
            for n in done[:-run.keep_local] if run.keep_local else done[:-1]:
                s = run.steps.get(n)  # a delete may have taken it meanwhile
                if s is not None and s.state == PERSISTED:
                    for ino in s.inos:
                        await self.ns.evict_hot(ino)
            if run.keep_cold:
                for n in done[:-run.keep_cold]:
                    s = run.steps.get(n)
                    if n != newest and s is not None and s.state == PERSISTED:
                        await self._remove(run, n)

    # -- reading and management ---------------------------------------------------------
    async def _wait(self, peer: Peer, msg: dict[str, Any]) -> Reply:
        run = await self.run(peer.ident, msg)
        n = check_step(msg.get("step"))
        s = self._step(run, n)
        level = msg.get("level", "cold")
        if level not in ("local", "cold"):
            raise FsError(errno.EINVAL, "level must be 'local' or 'cold'")
        timeout = msg.get("timeout")
        try:
            await asyncio.wait_for(self._settled(run, s, level),
                                   None if timeout is None else float(timeout))
        except TimeoutError:
            raise FsError(errno.ETIMEDOUT, f"step {n} of run {run.name!r} did not reach "
                          f"{level} within {timeout} s (state {s.state})") from None
        if s.state == FAILED:
            raise FsError(errno.EIO, f"step {n} of run {run.name!r} failed: {s.error}")
        return Reply(state=s.state)

    async def _settled(self, run: Run, s: Step, level: str) -> None:
        """Until ``s`` reached ``level``.  For ``cold`` the older steps of the run settle too
        (persisted, failed or removed) and retention has run: a run's steps are a sequence,
        and after waiting for step N the run's cold state is what the retention rule says,
        not whatever order the uploads happened to finish in."""
        if level == "local":
            await s.local.wait()
            return
        await s.persisted.wait()
        for o in [o for n, o in run.steps.items() if n < s.step and o.state != STAGING]:
            await o.persisted.wait()  # (a staged step may never commit: not waited for)
        # the step's own retention pass runs after its event is set: make sure one has
        await self.retain(run)

    def _step(self, run: Run, n: int | None) -> Step:
        """Step ``n`` (None: the newest) or an error naming the steps there are."""
        have = run.committed()
        if n is None and have:
            n = have[-1]
        s = run.steps.get(n) if n is not None else None
        if s is None or s.state == STAGING:
            raise FsError(errno.ENOENT, f"run {run.name!r} in bucket {run.bucket!r} has no "
                          f"step {n}; it has steps {have}" if have else
                          f"run {run.name!r} in bucket {run.bucket!r} has no checkpoints")
        return s

    async def _list(self, peer: Peer, msg: dict[str, Any]) -> Reply:
        return Reply(**await self.listing(peer.ident, msg))

    async def listing(self, ident: Identity, msg: dict[str, Any]) -> dict[str, Any]:
        """A run's committed steps and where each is (``tierctl ckpt list``)."""
        run = await self.run(ident, msg)
        for s in run.steps.values():
            if s.state == LOCAL and s.inos and self.ns.all_persisted(s.inos):
                s.state = PERSISTED
        steps = [s.describe() for n, s in sorted(run.steps.items()) if s.state != STAGING]
        return {"bucket": run.bucket, "run": run.name, "steps": steps,
                "keep_local": run.keep_local, "keep_cold": run.keep_cold}

    async def _open(self, peer: Peer, msg: dict[str, Any]) -> Reply:
        """A step's manifest and data.  A multi-part step answers its manifest alone, and
        each part with ``part`` (a rank reads only the parts its plan needs)."""
        run = await self.run(peer.ident, msg)
        want = msg.get("step")
        n = None if want is None else check_step(want)
        timeout = float(msg.get("timeout") or REMOTE_WAIT)
        await self.parts.settle(run, n, timeout)
        s = self._step(run, n)
        if s.region is not None and s.manifest is not None:
            try:  # the pool's ownership rule; other readers go through the namespace's
                region = self.pool.get(s.region.id, peer.tenant)
            except PoolError:
                pass
            else:
                return Reply([os.dup(region.fd)], step=s.step, where="pool",
                             region=region.describe(), manifest=s.manifest)
        manifest = s.manifest or await publish.read_manifest(
            self.ns, peer.ident, run.bucket, run.name, s.step)
        if manifest_parts(manifest):
            s.manifest = manifest
            if msg.get("part") is None:
                return Reply(step=s.step, where="manifest", manifest=manifest)
            return await self.parts.open_part(peer, run, s, manifest, msg["part"], timeout)
        fd, ino, where = await publish.open_data(self.ns, peer.ident, run.bucket, run.name,
                                                 s.step)
        self.hold(peer, ino)
        return Reply([fd], step=s.step, where=where, manifest=manifest)

    async def _delete(self, peer: Peer, msg: dict[str, Any]) -> Reply:
        return Reply(deleted=await self.delete(peer.ident, msg))

    async def delete(self, ident: Identity, msg: dict[str, Any]) -> int:
        """Remove step ``msg["step"]`` of a run (the SDK's delete, ``tierctl ckpt rm``)."""
        run = await self.run(ident, msg)
        n = check_step(msg.get("step"))
        s = run.steps.get(n)
        if s is not None and s.parts and s.state == STAGING and s.orphaned_at:
            self.parts.drop(run, s, "deleted while its parts were in doubt")
            return n
        s = self._step(run, n)
        if s.state == COMMITTED:
            raise FsError(errno.EBUSY, f"step {n} is still being written out; wait for it")
        await self._remove(run, n, ident)  # the namespace checks the caller may
        return n

    async def run_names(self, bucket: str) -> list[str]:
        """The runs of ``bucket``: those this daemon has seen, and every directory of the
        bucket that holds a step (after a restart the daemon has seen none)."""
        names = {r.name for r in self.runs.values() if r.bucket == bucket}
        try:
            top = await self.ns.resolve(Identity.ROOT, bucket)
        except FsError:
            return sorted(names)
        for name_b, inode in await self.ns.listdir(Identity.ROOT, top.ino):
            name = name_b.decode(errors="replace")
            if name in names or not inode.is_dir:
                continue
            try:
                check_run(name)
            except FsError:
                continue
            entries = await self.ns.listdir(Identity.ROOT, inode.ino)
            if any(e.is_dir and parse_step_dir(n.decode(errors="replace")) is not None
                   for n, e in entries):
                names.add(name)
        return sorted(names)

    async def _remove(self, run: Run, n: int, ident: Identity = Identity.ROOT) -> None:
        await publish.remove_step_dir(self.ns, ident, run.bucket, run.name, step_dir(n))
        gone = run.steps.pop(n, None)  # only once the namespace let it go
        if gone is not None:
            for r in gone.regions():
                gone.forget_region(r)
        run.signal()

    def status(self) -> list[dict[str, Any]]:
        return [{"bucket": r.bucket, "run": r.name,
                 "steps": [s.describe() for _, s in sorted(r.steps.items())]}
                for r in self.runs.values()]
