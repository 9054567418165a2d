"""Steps saved by many ranks: a part per rank, committed once by the job's coordinator.

Each rank stages its part in the daemon of its own node (``ckpt.stage`` with ``part`` and
``parts``, the job's world size, and ``save``, the id of this save attempt), copies into
the region and commits the part: from then on the daemon owns the bytes and writes them to
``<run>/.tierd-tmp-step-N/data-<rank>`` on hot, unpublished.  The coordinator, once every
rank's part is committed (DCP gathers their results), commits the step with the global
manifest (``ckpt.commit`` without ``part``): the daemon writes the manifest next to its
parts and renames the directory to ``step-N`` -- readers see every part or none.

With ranks on several nodes, the other nodes' daemons hold parts of a step whose commit
reaches only the coordinator's daemon.  The ranks there learn the outcome from the job's
own store (:mod:`tierd_client.dcp`) and pass the same commit (or an abort) to their daemon,
which publishes its parts the same way: ``step-N`` on every node holds the manifest and
that node's parts, and the cold store, shared by the nodes, gets the whole step.  A reader
on one node fetches the parts written elsewhere from cold.

Failures.  A part lost before its writer committed it (the rank died, or aborted) makes
the step impossible: the daemon drops every part of it it holds.  The coordinator's
connection ending before the step's commit drops the step on the coordinator's daemon.
Parts on another node whose writers all went away after committing their parts are **in
doubt**: the step may have been committed.  They stay (durable on hot, unpublished) until
the outcome is known -- the step's manifest is in the cold store (committed: published
here), or the same step is saved again, or ``IN_DOUBT_GRACE`` passed without a manifest in
cold (dropped).  The daemon looks for that outcome itself, from the moment the parts are in
doubt (every ``DOUBT_POLL`` to ``DOUBT_POLL_MAX`` s): the other nodes' readers, and the
coordinator's node waiting for these parts to reach cold, need them published whether or
not a client of this daemon ever asks about the run again.  A daemon restart drops
unpublished parts like any temporary directory: a step is durable on a node once it is
``local`` there.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import time
from typing import TYPE_CHECKING, Any

from tierd.acl import Identity
from tierd.checkpoint import publish
from tierd.checkpoint.manifest import (
    FORMAT,
    check_global_manifest,
    check_parts,
    check_save,
    part_name,
    tmp_dir,
)
from tierd.checkpoint.state import (
    COMMITTED,
    FAILED,
    LOCAL,
    PERSISTED,
    PREPARED,
    STAGING,
    WRITTEN,
    Part,
    Run,
    Step,
)
from tierd.errors import FsError
from tierd.logs import get_logger, kv
from tierd.mempool.server import Peer, Reply
from tierd.tiers import TierError

if TYPE_CHECKING:
    from tierd.checkpoint.service import CheckpointService

log = get_logger("checkpoint")

#: seconds after which parts in doubt with no manifest in the cold store are dropped
IN_DOUBT_GRACE = 300.0
#: seconds between looks at the cold store for the outcome of parts in doubt: the first,
#: doubled up to the second
DOUBT_POLL = 0.5
DOUBT_POLL_MAX = 5.0
#: how long a reader waits for a part written on another node to reach the cold store
REMOTE_WAIT = 60.0


class Parts:
    """The multi-part side of :class:`CheckpointService` (which routes to it)."""

    def __init__(self, svc: CheckpointService) -> None:
        self.svc = svc
        self.grace = IN_DOUBT_GRACE
        #: runs whose parts in doubt a task is settling (:meth:`_settle`), by bucket and name
        self._settling: set[tuple[str, str]] = set()

    # -- saving --------------------------------------------------------------------------
    async def stage(self, peer: Peer, run: Run, n: int, msg: dict[str, Any]) -> Reply:
        part, parts = check_parts(msg.get("part"), msg.get("parts"))
        save = check_save(msg.get("save"))
        coordinator = bool(msg.get("coordinator"))
        size = max(int(msg["size"]), 1)
        _refuse_dropped(run, n, save)  # (its temporary directory is being removed)
        s = run.steps.get(n)
        if s is not None and s.state == STAGING and s.parts and s.save != save:
            await self._supersede(run, s, save)
            s = run.steps.get(n)
        if s is not None and s.state == FAILED:
            del run.steps[n]
            s = None
        if s is not None and (s.state != STAGING or not s.parts):
            raise FsError(errno.EEXIST, f"step {n} of run {run.name!r} already exists "
                          f"({s.state}); delete it first or save another step")
        if s is not None:
            if s.parts != parts:
                raise FsError(errno.EINVAL, f"step {n} is being saved with {s.parts} parts, "
                              f"not {parts}")
            if s.ident.uid != peer.ident.uid:
                raise FsError(errno.EACCES, f"step {n} of run {run.name!r} is being saved "
                              "by another user")
            if part in s.members:
                raise FsError(errno.EEXIST, f"part {part} of step {n} is already being saved")
        region = await self.svc.region_for(run, peer, size, part)
        s = run.steps.get(n)  # (the wait for a region let other requests in)
        _refuse_dropped(run, n, save)
        if s is None or s.state == FAILED:
            s = Step(n, peer.ident, STAGING, parts=parts, save=save)
            run.steps[n] = s
            s.hold = contextlib.ExitStack()
            s.hold.enter_context(self.svc.ns.publishing(
                f"{run.bucket}/{run.name}/{tmp_dir(n, save)}/"))
        elif part in s.members or s.save != save or s.state != STAGING:
            raise FsError(errno.EEXIST, f"part {part} of step {n} is already being saved")
        for other in run.steps.values():
            other.forget_region(region)
        region.conn, region.persistent = peer.conn, False
        s.members[part] = Part(part, peer.conn, region, coordinator=coordinator)
        run.region_part[region.id] = part
        return Reply([os.dup(region.fd)], region=region.describe(), node=self.svc.node)

    def member(self, peer: Peer, run: Run, msg: dict[str, Any], n: int) -> tuple[Step, Part]:
        s = run.steps.get(n)
        part = msg.get("part")
        p = s.members.get(part) if s is not None and isinstance(part, int) else None
        if s is None or p is None or p.conn != peer.conn:
            _refuse_dropped(run, n)
            raise FsError(errno.ENOENT, f"part {part} of step {n} of run {run.name!r} is not "
                          "being staged by this connection")
        return s, p

    async def commit_part(self, peer: Peer, run: Run, n: int, msg: dict[str, Any]) -> Reply:
        s, p = self.member(peer, run, msg, n)
        if p.state != STAGING:
            raise FsError(errno.EEXIST, f"part {p.index} of step {n} is committed already")
        assert p.region is not None
        size = (msg.get("manifest") or {}).get("size")
        if not isinstance(size, int) or not 0 <= size <= p.region.size:
            raise FsError(errno.EINVAL, f"part size {size!r} does not fit the region of "
                          f"{p.region.size} bytes")
        p.size, p.state = size, PREPARED
        p.region.conn, p.region.persistent = 0, True  # the daemon's now
        self._spawn(s, self._write(run, s, p), f"ckpt-{run.name}-{n}-part{p.index}")
        return Reply(state=PREPARED, node=self.svc.node)

    async def _write(self, run: Run, s: Step, p: Part) -> None:
        assert p.region is not None
        try:
            p.ino = await publish.write_part(self.svc.ns, self.svc.pool.far, s.ident,
                                             run.bucket, run.name, tmp_dir(s.step, s.save),
                                             p.index, p.region, p.size)
            p.state = WRITTEN
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.exception("part %d of checkpoint %s/%s step %d failed", p.index, run.bucket,
                          run.name, s.step)
            self.fail(run, s, f"part {p.index}: {type(e).__name__}: {e}")
        finally:
            p.written.set()
            run.signal()

    async def commit(self, peer: Peer, run: Run, n: int, msg: dict[str, Any]) -> Reply:
        """The step's commit with the global manifest: from the coordinator on its node,
        from the ranks of every other node once the job's store says it committed.  A
        repeat (several ranks of a node pass it on) answers the step's state."""
        save = str(msg.get("save") or "")
        s = run.steps.get(n)
        if s is not None and s.parts and s.save == save and s.state in (COMMITTED, LOCAL,
                                                                         PERSISTED):
            return Reply(state=s.state)
        if s is None or not s.parts or s.state != STAGING or s.save != save:
            _refuse_dropped(run, n)
            raise FsError(errno.ENOENT, f"step {n} of run {run.name!r} (save {save!r}) is not "
                          "being saved here")
        if s.ident.uid != peer.ident.uid:
            raise FsError(errno.EACCES, f"step {n} of run {run.name!r} is another user's")
        self._commit(run, s, check_global_manifest(msg.get("manifest"), s.parts))
        return Reply(state=s.state)

    def _commit(self, run: Run, s: Step, doc: dict[str, Any]) -> None:
        staging = [i for i, p in s.members.items() if p.state == STAGING]
        if staging:
            raise FsError(errno.EIO, f"parts {staging} of step {s.step} were not committed "
                          "by their writers")
        for i, p in s.members.items():
            if doc["parts"][i]["size"] != p.size:
                raise FsError(errno.EINVAL, f"the manifest gives part {i} {doc['parts'][i]['size']}"
                              f" bytes; its writer committed {p.size}")
        doc.update(format=FORMAT, run=run.name, step=s.step, save=s.save)
        s.manifest = doc
        s.state, s.committed_at, s.orphaned_at = COMMITTED, time.monotonic(), 0.0
        if self.svc.observe is not None:
            self.svc.observe("stall", s.committed_at - s.staged_at)
        self._spawn(s, self._publish(run, s), f"ckpt-{run.name}-{s.step}")
        run.signal()

    async def _publish(self, run: Run, s: Step) -> None:
        svc = self.svc
        assert s.manifest is not None
        try:
            for p in list(s.members.values()):
                await p.written.wait()
            if s.state == FAILED:
                return
            man = await publish.publish_parts(svc.ns, s.ident, run.bucket, run.name, s.step,
                                              tmp_dir(s.step, s.save), s.manifest)
            s.inos = [p.ino for p in s.members.values()] + man
            self._release_hold(s)
            sizes = {e["part"]: e["size"] for e in s.manifest["parts"]}

            async def elsewhere() -> None:  # other nodes' parts: persisted once cold has them
                for i in (i for i in range(s.parts) if i not in s.members):
                    while not await publish.in_cold(svc.ns, run.bucket, run.name, s.step,
                                                    part_name(i), sizes[i]):
                        await asyncio.sleep(0.5)

            await svc.published(run, s, elsewhere)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.exception("checkpoint %s/%s step %d failed", run.bucket, run.name, s.step)
            self.fail(run, s, f"{type(e).__name__}: {e}")
        finally:
            run.signal()

    async def abort(self, peer: Peer, run: Run, n: int, msg: dict[str, Any]) -> Reply:
        """A writer gives up its part (its copy failed, or the job's store says the save was
        aborted): the step cannot be committed, and its parts here go."""
        s, p = self.member(peer, run, msg, n)
        if s.state != STAGING:
            raise FsError(errno.EBUSY, f"step {n} of run {run.name!r} is committed already")
        self.drop(run, s, f"part {p.index} was aborted by its writer")
        return Reply(aborted=n)

    # -- losing a step -------------------------------------------------------------------
    def fail(self, run: Run, s: Step, why: str) -> None:
        """A part could not be written out: a step not yet published is dropped; one being
        published is marked failed (its readers get the reason)."""
        if s.state == STAGING:
            self.drop(run, s, why)
            return
        if s.state in (FAILED, PERSISTED):
            return
        s.state, s.error = FAILED, why
        s.local.set()
        s.persisted.set()
        self._cleanup(run, s)

    def drop(self, run: Run, s: Step, why: str) -> None:
        """Forget a step that will never be committed here, and remove its parts."""
        if run.steps.get(s.step) is s:
            del run.steps[s.step]
        run.aborted[s.step] = (s.save, why)
        while len(run.aborted) > 32:
            del run.aborted[next(iter(run.aborted))]
        s.state, s.error = FAILED, why
        s.local.set()
        s.persisted.set()
        log.info("checkpoint step dropped", extra=kv(run=run.name, step=s.step, why=why))
        self._cleanup(run, s)
        run.signal()

    def _cleanup(self, run: Run, s: Step) -> None:
        for p in s.members.values():
            if p.region is not None and p.region.id in self.svc.pool.regions:
                p.region.conn, p.region.persistent = 0, True  # back to the run, idle
        current = asyncio.current_task()
        pending = [t for t in s.tasks if t is not current]
        for t in pending:
            t.cancel()

        async def clean() -> None:
            for t in pending:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
            try:
                await publish.remove_step_dir(self.svc.ns, Identity.ROOT, run.bucket,
                                              run.name, tmp_dir(s.step, s.save))
            except FsError as e:  # (its files stay: an operator sees them under the run)
                log.warning("could not remove the temporary directory of a dropped step",
                            extra=kv(run=run.name, step=s.step, error=str(e)))
            finally:
                self._release_hold(s)

        self.svc.spawn(clean(), f"ckpt-clean-{run.name}-{s.step}")

    def _release_hold(self, s: Step) -> None:
        if s.hold is not None:
            s.hold.close()
            s.hold = None

    def closed(self, peer: Peer) -> None:
        """A writer's connection ended: decide what its parts' steps become."""
        for run in list(self.svc.runs.values()):
            for s in [s for s in run.steps.values() if s.parts and s.state == STAGING]:
                mine = [p for p in s.members.values() if p.conn == peer.conn]
                if not mine:
                    continue
                if any(p.state == STAGING for p in mine):
                    self.drop(run, s, f"the writer of part {mine[0].index} went away before "
                              "committing it")
                elif any(p.coordinator for p in mine):
                    self.drop(run, s, "the coordinator went away before committing the step")
                else:
                    for p in mine:
                        p.closed = True
                    if all(p.closed for p in s.members.values()):
                        s.orphaned_at = time.monotonic()  # in doubt: see resolve()
                        self._watch_doubt(run)

    def _watch_doubt(self, run: Run) -> None:
        """Settle ``run``'s parts in doubt in the background (one task per run)."""
        key = (run.bucket, run.name)
        if key not in self._settling:
            self._settling.add(key)
            self.svc.spawn(self._settle(run, key), f"ckpt-doubt-{run.name}")

    async def _settle(self, run: Run, key: tuple[str, str]) -> None:
        """:meth:`resolve` until no step of ``run`` has parts in doubt: each ends committed
        (its manifest reached cold), superseded, or dropped after the grace period.  A
        cold store that does not answer is asked again at the next look."""
        delay = DOUBT_POLL
        try:
            while any(s.parts and s.state == STAGING and s.orphaned_at
                      for s in run.steps.values()):
                await asyncio.sleep(delay)
                delay = min(delay * 2, DOUBT_POLL_MAX)
                try:
                    await self.resolve(run)
                except (FsError, TierError) as e:
                    log.info("parts in doubt: the cold store gave no answer yet",
                             extra=kv(run=run.name, error=str(e)))
                except Exception:  # (a manifest that is not one: looked at again later)
                    log.exception("settling parts in doubt failed",
                                  extra=kv(run=run.name))
        finally:
            self._settling.discard(key)

    async def _supersede(self, run: Run, s: Step, save: str) -> None:
        """Step ``s`` is to be saved again (a new ``save``): the earlier attempt goes,
        unless it is being written now or was committed by its coordinator's node."""
        if any(p.state == STAGING and not p.closed for p in s.members.values()):
            raise FsError(errno.EBUSY, f"step {s.step} of run {run.name!r} is being saved by "
                          f"another job now (save {s.save!r})")
        if not any(p.coordinator for p in s.members.values()):
            doc = await publish.cold_manifest(self.svc.ns, run.bucket, run.name, s.step)
            if doc is not None and doc.get("save") == s.save and s.state == STAGING:
                self._commit(run, s, doc)
                raise FsError(errno.EEXIST, f"step {s.step} of run {run.name!r} already "
                              "exists (committed); delete it first or save another step")
        if run.steps.get(s.step) is s and s.state == STAGING:
            self.drop(run, s, f"superseded by save {save!r}")

    async def resolve(self, run: Run) -> None:
        """Parts in doubt learn their step's outcome from the cold store (the coordinator's
        node persists the manifest), or are dropped once ``grace`` passed without it."""
        now = time.monotonic()
        for s in [s for s in run.steps.values() if s.parts and s.state == STAGING
                  and s.orphaned_at]:
            doc = await publish.cold_manifest(self.svc.ns, run.bucket, run.name, s.step)
            if s.state != STAGING:
                continue
            if doc is not None and doc.get("save") == s.save:
                log.info("parts in doubt: the step was committed",
                         extra=kv(run=run.name, step=s.step))
                self._commit(run, s, doc)
            elif now - s.orphaned_at > self.grace:
                self.drop(run, s, f"no commit reached the cold store within {self.grace:g} s "
                          "of its writers going away")

    # -- reading -------------------------------------------------------------------------
    async def open_part(self, peer: Peer, run: Run, s: Step, manifest: dict[str, Any],
                        part: int, timeout: float) -> Reply:
        """One part's data: its pool copy here (same tenant), else its file on this node,
        else the file another node wrote, through the cold store."""
        svc = self.svc
        entries = manifest["parts"]
        if not isinstance(part, int) or not 0 <= part < len(entries):
            raise FsError(errno.EINVAL, f"step {s.step} has parts 0-{len(entries) - 1}, not "
                          f"{part!r}")
        size = int(entries[part]["size"])
        p = s.members.get(part)
        if p is not None and p.region is not None and p.region.tenant == peer.tenant \
                and p.region.id in svc.pool.regions:
            return Reply([os.dup(p.region.fd)], step=s.step, part=part, size=size,
                         where="pool", manifest=None)
        leaf = part_name(part)
        if p is not None and s.state == COMMITTED:  # its region went to another writer:
            with contextlib.suppress(TimeoutError):  # its file is being published
                await asyncio.wait_for(s.local.wait(), timeout)
            if s.state == FAILED:
                raise FsError(errno.EIO, f"step {s.step} of run {run.name!r} failed: "
                              f"{s.error}")
        await publish.import_remote(svc.ns, peer.ident, run.bucket, run.name, s.step, leaf,
                                    size, 0.0 if p is not None else timeout)
        fd, ino, where = await publish.open_data(svc.ns, peer.ident, run.bucket, run.name,
                                                 s.step, leaf)
        svc.hold(peer, ino)
        return Reply([fd], step=s.step, part=part, size=size, where=where, manifest=None)

    async def settle(self, run: Run, n: int | None, timeout: float) -> None:
        """Before a read of step ``n``: when its parts here are all committed by their
        writers and its commit is on its way (the job's store passes it on just after the
        coordinator's), give it up to ``timeout`` s.  Not for the latest step (what is
        committed now is the answer) nor for parts in doubt."""
        if n is None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            s = run.steps.get(n)
            if (s is None or not s.parts or s.state != STAGING or s.orphaned_at
                    or any(p.state == STAGING for p in s.members.values())
                    or loop.time() >= deadline):
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(run.changed.wait(), deadline - loop.time())

    def _spawn(self, s: Step, coro: Any, name: str) -> None:
        t: asyncio.Task[None] = asyncio.create_task(coro, name=name)
        s.tasks.add(t)
        t.add_done_callback(s.tasks.discard)
        self.svc.track(t)


def _refuse_dropped(run: Run, n: int, save: str | None = None) -> None:
    """EIO with the reason when step ``n`` was dropped lately (and ``save`` is given: when
    it was that save of it)."""
    dropped = run.aborted.get(n)
    if dropped is not None and save in (None, dropped[0]):
        raise FsError(errno.EIO, f"step {n} of run {run.name!r} was aborted: {dropped[1]}")


def manifest_parts(manifest: dict[str, Any] | None) -> bool:
    """Whether a step's manifest is a multi-part one."""
    return manifest is not None and isinstance(manifest.get("parts"), list)

