"""Asynchronous placement jobs: ``warmup``, ``pin``, ``evict`` and ``persist`` with progress
and cancel (``/v1/jobs``).

The synchronous placement endpoints (:mod:`tierd.admin.placement`) hold the HTTP request
open for the whole operation, which is fine for a script on a small prefix but not for an
operator warming a data set of terabytes: a dropped connection loses the progress, and
nothing can stop the work once started.  A job runs as an asyncio task owned by the daemon;
the request that starts it returns at once (``202``), anyone with the token can watch it
(``GET /v1/jobs/{id}``: bytes and files done of the total, throughput, ETA) and stop it
(``DELETE /v1/jobs/{id}``).

* ``POST /v1/jobs`` ``{"kind", "prefix"?, "tier"?, "timeout"?}`` -- ``202`` with the job
  (``404 no_such_bucket`` when the prefix's bucket does not exist); ``kind`` is one of
  :data:`KINDS`:

  - ``warmup``: every block under ``prefix`` onto ``tier`` (default: each file's policy
    tier), like ``POST /v1/placement/warmup``;
  - ``pin``: the prefix's policy gets ``pin`` (and ``tier`` when given), then it is warmed
    up onto that tier: the data is local and stays;
  - ``evict``: clean blocks off ``tier`` (``mem``, ``hot``, ``warm`` or ``all``, the
    default), like ``POST /v1/placement/evict``;
  - ``persist``: wait until cold has every change under ``prefix`` (at most ``timeout``
    seconds, then the job fails), like ``POST /v1/placement/persist``.

* ``GET /v1/jobs[?state=S]`` -- ``{"jobs": [...]}``, newest first;
* ``GET /v1/jobs/{id}`` -- one job (:meth:`Job.doc`);
* ``DELETE /v1/jobs/{id}`` -- cancel it (a no-op on a finished job) and answer the job once
  it stopped (or after :data:`CANCEL_WAIT` seconds, still ``running``).

**Stopping cleanly.**  A job works file by file, and each file's step runs as its own task
that a cancel does not interrupt (:func:`_step`): evicting a file updates the bitmaps, punches
the blocks and then the tier's accounting, and copying a file into the memory tier allocates
a pool region before filling it -- cut in the middle, either would leave the books wrong or a
region leaked.  A cancel therefore takes effect between files: the file in progress finishes
(its blocks stay, they are valid cache), no further file is started, and the job ends
``cancelled``.  A ``persist`` job only waits, so it stops at once.

At most :data:`MAX_RUNNING` jobs run at a time (the others are ``queued``), at most
:data:`MAX_ACTIVE` may be queued or running (``429`` beyond), and the last
:data:`KEEP_FINISHED` finished jobs are remembered (jobs are not persisted: a restart forgets
them, and stops the running ones with the daemon).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from aiohttp import web

from tierd.admin.auth import identity
from tierd.admin.backend import json_error as _err
from tierd.admin.prefix import NoSuchBucket, check_prefix, prefix_error
from tierd.errors import FsError
from tierd.logs import get_logger, kv
from tierd.placement.engine import HOT, POLICY_TIERS, WARM
from tierd.placement.memtier import MEM
from tierd.placement.ops import PlacementOps
from tierd.placement.paths import files_under
from tierd.tiers import TierError

log = get_logger("admin")

KINDS = ("warmup", "pin", "evict", "persist")
STATES = ("queued", "running", "done", "failed", "cancelled")
ACTIVE = frozenset({"queued", "running"})
#: jobs working at the same time (more wait, ``queued``)
MAX_RUNNING = 4
#: queued + running jobs at most; a new one beyond is refused with 429
MAX_ACTIVE = 64
#: finished jobs remembered for ``GET /v1/jobs``
KEEP_FINISHED = 100
#: seconds ``DELETE /v1/jobs/{id}`` waits for the job to stop before it answers
CANCEL_WAIT = 10.0
SHUTDOWN_WAIT = 3.0
_FIELDS = frozenset({"kind", "prefix", "tier", "timeout"})

T = TypeVar("T")
Ops = Callable[[], PlacementOps | None]
JOBS: web.AppKey[JobManager] = web.AppKey("tierd.admin.jobs")


class JobFailed(Exception):
    """The job could not do what it was asked (its message becomes the job's ``error``)."""


@dataclass
class Job:
    """One job and its progress; :meth:`doc` is what the API answers."""

    id: str
    kind: str
    prefix: str
    tier: str | None
    timeout: float | None
    identity: str
    state: str = "queued"
    created: float = field(default_factory=time.time)
    started: float | None = None
    finished: float | None = None
    #: bytes of the files handled so far, of ``total`` (None until the job has counted)
    done: int = 0
    total: int | None = None
    files_done: int = 0
    files: int | None = None
    error: str | None = None
    result: dict[str, Any] | None = None
    task: asyncio.Task[None] | None = None
    _t0: float = 0.0
    _t1: float | None = None

    def doc(self) -> dict[str, Any]:
        """The job as JSON: ``bytes_per_s`` averages over its running time, ``eta_s`` is
        the time left at that rate (None when unknown or finished)."""
        elapsed = 0.0
        if self._t0:
            elapsed = (self._t1 if self._t1 is not None else time.monotonic()) - self._t0
        rate = self.done / elapsed if elapsed > 0 else 0.0
        eta = None
        if self.state == "running" and self.total is not None and rate > 0:
            eta = round(max(0, self.total - self.done) / rate, 3)
        return {
            "id": self.id, "kind": self.kind, "prefix": self.prefix, "tier": self.tier,
            "timeout": self.timeout, "state": self.state, "identity": self.identity,
            "created": self.created, "started": self.started, "finished": self.finished,
            "elapsed_s": round(elapsed, 3), "done": self.done, "total": self.total,
            "files_done": self.files_done, "files": self.files,
            "bytes_per_s": round(rate, 3), "eta_s": eta,
            "error": self.error, "result": self.result,
        }


async def _step(coro: Coroutine[Any, Any, T]) -> T:
    """Run one file's work to its end even if the job is cancelled meanwhile (module doc);
    the cancel is raised once the step is over."""
    task = asyncio.create_task(coro)
    task.add_done_callback(_retrieve)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait({task})  # a second cancel (daemon shutdown) stops waiting
        raise


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: a step that failed after a cancel is not logged twice


def _inodes(ops: PlacementOps, prefix: str) -> list[tuple[int, int]]:
    with ops.p.meta.snapshot() as tx:
        return [(f.ino, f.size) for f in files_under(tx, prefix)]


def _pending(ops: PlacementOps, prefix: str) -> tuple[int, int]:
    """Files and bytes under ``prefix`` still waiting for the persister."""
    n = nbytes = 0
    with ops.p.meta.snapshot() as tx:
        for f in files_under(tx, prefix):
            if tx.queued(f.ino) is not None:
                n += 1
                nbytes += f.size
    return n, nbytes


async def _warmup(job: Job, ops: PlacementOps) -> None:
    gen = cast(AsyncGenerator[dict[str, Any], None], ops.warmup(job.prefix, job.tier))

    async def step() -> dict[str, Any] | None:
        try:
            return await gen.__anext__()
        except StopAsyncIteration:
            return None

    copied: dict[str, int] = {}
    try:
        while (doc := await _step(step())) is not None:
            job.total, job.files = int(doc["total"]), int(doc["files"])
            job.done = int(doc["done"])
            copied = dict(doc.get("copied", copied))
            if "tier" in doc:
                job.files_done += 1
    finally:
        with contextlib.suppress(RuntimeError):  # still running after a second cancel
            await gen.aclose()
    job.result = {"prefix": job.prefix, "warmed": job.done, "files": job.files_done,
                  "copied": copied}


async def _pin(job: Job, ops: PlacementOps) -> None:
    pol = await ops.set_policy(job.prefix, pin=True, tier=job.tier)
    await _warmup(job, ops)
    job.result = {**(job.result or {}), "policy": pol}


async def _evict(job: Job, ops: PlacementOps) -> None:
    tier = job.tier or "all"
    files = _inodes(ops, job.prefix)
    job.files, job.total = len(files), sum(size for _, size in files)
    freed = {MEM: 0, HOT: 0, WARM: 0}
    for ino, size in files:
        await _step(ops.evict_one(ino, tier, freed))
        job.done += size
        job.files_done += 1
    job.result = {"prefix": job.prefix, "evicted": sum(freed.values()), "tiers": freed}


async def _persist(job: Job, ops: PlacementOps) -> None:
    files, total = _pending(ops, job.prefix)
    job.files, job.total = files, total
    loop = asyncio.get_running_loop()
    deadline = None if job.timeout is None else loop.time() + job.timeout
    while True:
        left = 1.0 if deadline is None else min(1.0, deadline - loop.time())
        doc: dict[str, Any] = (await ops.persist_wait(job.prefix, left) if left > 0
                               else {"persisted": False})
        ok = bool(doc["persisted"])
        n, nbytes = _pending(ops, job.prefix)
        job.total = max(job.total or 0, job.done + nbytes)  # more may have been written
        job.done = max(job.done, min(job.total, total - nbytes))
        job.files_done = max(job.files_done, files - n)
        if ok or n == 0:
            break
        bad: list[dict[str, Any]] = doc.get("unpersistable") or []
        if bad and n <= len(bad):
            # all that is left are files the store refuses: the drain answers at once, so
            # looping on would spin the event loop (and wait for ever)
            first = bad[0]
            raise JobFailed(f"{len(bad)} file(s) under {job.prefix!r} cannot be persisted "
                            f"(the cold store refuses them; tierctl status names them), "
                            f"first {first['key']!r}: {first['error']}")
        if deadline is not None and loop.time() >= deadline:
            raise JobFailed(f"{n} file(s) under {job.prefix!r} not persisted within "
                            f"{job.timeout:g} s (is the cold store reachable?)")
    job.done, job.files_done = job.total, job.files
    job.result = {"prefix": job.prefix, "persisted": True}


RUNNERS: dict[str, Callable[[Job, PlacementOps], Awaitable[None]]] = {
    "warmup": _warmup, "pin": _pin, "evict": _evict, "persist": _persist}


class JobManager:
    """The daemon's jobs (one per admin application)."""

    def __init__(self, get_ops: Ops) -> None:
        self._get_ops = get_ops
        self.jobs: dict[str, Job] = {}
        self._running = asyncio.Semaphore(MAX_RUNNING)

    def ops(self) -> PlacementOps:
        o = self._get_ops()
        if o is None:
            raise web.HTTPServiceUnavailable(reason="placement is not running")
        return o

    def validate(self, doc: dict[str, Any]) -> tuple[str, str, str | None, float | None]:
        """``(kind, prefix, tier, timeout)`` of a ``POST /v1/jobs`` body; ValueError with
        the reason otherwise."""
        unknown = sorted(set(doc) - _FIELDS)
        if unknown:
            raise ValueError(f"unknown field {unknown[0]!r} (expected kind, prefix, tier, "
                             "timeout)")
        kind = doc.get("kind")
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}")
        # a bucket that does not exist: NoSuchBucket (404), not a job that finds nothing
        prefix = check_prefix(self.ops().p.meta, doc.get("prefix", ""))
        tier = doc.get("tier")
        if tier is not None and not isinstance(tier, str):
            raise ValueError("tier must be a string")
        timeout = doc.get("timeout")
        if timeout is not None and (isinstance(timeout, bool)
                                    or not isinstance(timeout, int | float)
                                    or not 0 < timeout <= 1e9):
            raise ValueError("timeout must be a positive number of seconds")
        if kind == "persist":
            if tier is not None:
                raise ValueError("a persist job takes no tier")
        elif timeout is not None:
            raise ValueError(f"a {kind} job takes no timeout")
        if kind == "evict":
            if tier is not None and tier not in (*POLICY_TIERS, "all"):
                raise ValueError("tier must be mem, hot, warm or all")
        elif tier is not None:
            if kind == "pin" and tier not in POLICY_TIERS:
                raise ValueError("tier must be mem, hot or warm")
            self.ops().check_tier(tier)
        return kind, prefix, tier, None if timeout is None else float(timeout)

    def create(self, doc: dict[str, Any], who: str) -> Job:
        kind, prefix, tier, timeout = self.validate(doc)
        ops = self.ops()
        if sum(1 for j in self.jobs.values() if j.state in ACTIVE) >= MAX_ACTIVE:
            raise OverflowError(f"{MAX_ACTIVE} jobs are queued or running; wait for some "
                                "or cancel them")
        job = Job(secrets.token_hex(8), kind, prefix, tier, timeout, who)
        self.jobs[job.id] = job
        job.task = asyncio.create_task(self._run(job, ops), name=f"tierd-job-{job.id}")
        log.info("job started", extra=kv(identity=who, job=job.id, kind=kind, prefix=prefix,
                                         tier=tier or "-"))
        self._trim()
        return job

    async def _run(self, job: Job, ops: PlacementOps) -> None:
        try:
            async with self._running:
                job.state, job.started, job._t0 = "running", time.time(), time.monotonic()
                await RUNNERS[job.kind](job, ops)
            job.state = "done"
        except asyncio.CancelledError:
            job.state = "cancelled"  # the task ends normally: the cancel was asked for
        except (JobFailed, ValueError) as e:
            job.state, job.error = "failed", str(e)
        except (TierError, FsError) as e:
            job.state, job.error = "failed", f"cold store unavailable: {e}"
        except Exception as e:
            log.exception("job %s (%s %r) failed", job.id, job.kind, job.prefix)
            job.state, job.error = "failed", f"internal error ({type(e).__name__}); see the log"
        finally:
            job.finished = time.time()
            if job._t0:
                job._t1 = time.monotonic()
            if job.state != "done":
                job.result = None
            log.info("job finished", extra=kv(job=job.id, kind=job.kind, state=job.state,
                                              done=job.done, error=job.error or "-"))

    def _trim(self) -> None:
        finished = [j for j in self.jobs.values() if j.state not in ACTIVE]
        for j in finished[:max(0, len(finished) - KEEP_FINISHED)]:
            del self.jobs[j.id]

    async def cancel(self, job: Job, who: str) -> None:
        """Ask ``job`` to stop and wait (at most :data:`CANCEL_WAIT`) until it has."""
        task = job.task
        if task is None or task.done():
            return
        log.info("job cancel", extra=kv(identity=who, job=job.id))
        task.cancel()
        await asyncio.wait({task}, timeout=CANCEL_WAIT)

    async def shutdown(self, app: web.Application) -> None:
        """Stop every job with the daemon (before placement closes)."""
        tasks = [j.task for j in self.jobs.values() if j.task is not None and not j.task.done()]
        for t in tasks:
            t.cancel()
        if tasks:  # a job that does not stop must not hold the daemon past its stop grace
            await asyncio.wait(tasks, timeout=SHUTDOWN_WAIT)


routes = web.RouteTableDef()


def _manager(request: web.Request) -> JobManager:
    return request.app[JOBS]


def _find(request: web.Request) -> Job | web.Response:
    job = _manager(request).jobs.get(request.match_info["id"])
    if job is None:
        return _err(404, "not_found", f"no job {request.match_info['id']!r} (finished "
                    "jobs are kept until a restart, the last "
                    f"{KEEP_FINISHED} of them)")
    return job


@routes.post("/v1/jobs")
async def create(request: web.Request) -> web.Response:
    try:
        doc = await request.json()
    except (ValueError, RecursionError):
        return _err(400, "bad_request", "the body must be a JSON object")
    if not isinstance(doc, dict):
        return _err(400, "bad_request", "the body must be a JSON object")
    try:
        job = _manager(request).create(doc, identity(request))
    except (ValueError, NoSuchBucket) as e:
        return prefix_error(e)
    except OverflowError as e:
        return _err(429, "too_many_jobs", str(e))
    return web.json_response(job.doc(), status=202,
                             headers={"Location": f"/v1/jobs/{job.id}"})


@routes.get("/v1/jobs")
async def listing(request: web.Request) -> web.Response:
    state = request.query.get("state")
    if state is not None and state not in STATES:
        return _err(400, "bad_request", f"state must be one of {', '.join(STATES)}")
    jobs = [j.doc() for j in reversed(_manager(request).jobs.values())
            if state is None or j.state == state]
    return web.json_response({"jobs": jobs})


@routes.get("/v1/jobs/{id}")
async def get(request: web.Request) -> web.Response:
    job = _find(request)
    return job if isinstance(job, web.Response) else web.json_response(job.doc())


@routes.delete("/v1/jobs/{id}")
async def cancel(request: web.Request) -> web.Response:
    job = _find(request)
    if isinstance(job, web.Response):
        return job
    await _manager(request).cancel(job, identity(request))
    return web.json_response(job.doc())
