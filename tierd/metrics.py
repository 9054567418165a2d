"""The daemon's Prometheus metrics (``GET /metrics`` on the admin listener).

One :class:`Metrics` per daemon, with its **own** :class:`~prometheus_client.CollectorRegistry`
(never the process-wide default one): tests run several daemons in one process, and a
library that registers into the default registry must not end up in tierd's exposition.

Two kinds of metrics live here:

* **events** the doors report as they happen -- requests per door and operation, and
  requests in flight (:class:`tierd.reqstats.RequestStats`, ``Metrics.requests``: every
  request pays for it, so it keeps plain dictionaries the loop writes, without
  prometheus_client's locks), checkpoint phase durations
  (:meth:`Metrics.observe_checkpoint`);
* **state** read at scrape time by :class:`StateCollector` from the objects that already keep
  it (the placement engine's ``stats``, a :class:`~tierd.placement.stats.PlacementStats`,
  and tier caches, the memory tier, the memory pool, the persist queue in metadata).
  Reading at scrape time, rather than incrementing metrics inside the placement code, keeps
  one source of truth and costs nothing between scrapes.

Everything runs on the daemon's loop except the persist-queue scan (a metadata read that
grows with the queue), which :meth:`Metrics.render` does in a worker thread first.

Label values are bounded: ``door`` is ``s3``/``admin``/``fuse``, ``operation`` an S3 API name
(``GetObject``), an admin route (``GET /v1/status``) or a FUSE operation (``read``), and
``status`` a class (``2xx``, ``4xx``, ``5xx``) for HTTP doors, ``ok`` or an errno name
(``ENOENT``) for FUSE.  See docs/observability.md for the full list.
"""

from __future__ import annotations

import asyncio
import errno
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from tierd.logs import REQUEST_ID, new_request_id, request_id_var
from tierd.reqstats import RequestStats

if TYPE_CHECKING:
    from tierd.mempool.pool import MemPool
    from tierd.placement import Placement

#: the exposition's content type: the classic text format every Prometheus version reads
#: (prometheus_client's CONTENT_TYPE_LATEST names 1.0.0 since 0.22; our names and label
#: values are plain ASCII, so the body is the same)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DOORS = ("s3", "admin", "fuse")
#: request latency buckets, seconds: sub-millisecond metadata calls up to minute-long PUTs
REQUEST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                   2.5, 5.0, 10.0, 30.0, 60.0)
#: checkpoint phase buckets, seconds: a stall of milliseconds up to a slow cold upload
CHECKPOINT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                      60.0, 120.0, 300.0, 600.0, 1800.0)
#: checkpoint phases (:meth:`Metrics.observe_checkpoint`)
CHECKPOINT_PHASES = ("stall", "local", "persisted")
#: where a door's handler records the operation it ran (the S3 door: ``GetObject``)
OPERATION = "tierd.operation"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def status_class(status: int) -> str:
    """``404`` -> ``4xx``: counts per class keep the label set small."""
    return f"{status // 100}xx" if 100 <= status < 600 else "other"


def errno_status(err: int | None) -> str:
    """A FUSE reply's status label: ``ok`` or the errno's name (``ENOENT``)."""
    if not err:
        return "ok"
    return errno.errorcode.get(err, "EOTHER")


@dataclass
class QueueSnapshot:
    """The persist queue as the last scrape saw it."""

    depth: int = 0
    oldest_age: float = 0.0


class Metrics:
    """The daemon's registry and the metrics the doors update; see the module docstring."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        #: requests per door, operation and status, their latencies, and those in flight:
        #: written on the loop only, without prometheus_client's locks (tierd.reqstats)
        self.requests = RequestStats(DOORS, REQUEST_BUCKETS)
        r.register(self.requests)
        self.checkpoint_seconds = Histogram(
            "tierd_checkpoint_duration_seconds",
            "Checkpoint phases: stall = stage to commit (training waits), local = commit to "
            "durable on the hot tier, persisted = commit to in the cold store",
            ["phase"], buckets=CHECKPOINT_BUCKETS, registry=r)
        self.lifecycle = Counter(
            "tierd_lifecycle_actions",
            "What the lifecycle job did: action = expire (current objects deleted), "
            "abort_upload, expire_noncurrent (versions and delete markers removed), skipped "
            "(changed after the scan, or an upload completed meanwhile)", ["action"], registry=r)
        #: the event metrics above that prometheus_client keeps (thread-safe: render()
        #: formats them off the loop as they are): a new one goes here
        self.events: list[Collector] = [self.checkpoint_seconds, self.lifecycle]
        self.state = StateCollector()
        r.register(self.state)

    # -- what the daemon hands over once started ------------------------------------------
    def attach(self, *, placement: Placement | None = None, pool: MemPool | None = None) -> None:
        """The objects whose state is read at scrape time (None detaches)."""
        self.state.placement, self.state.pool = placement, pool

    # -- events ---------------------------------------------------------------------------
    def observe_lifecycle(self, action: str, count: int) -> None:
        """``count`` lifecycle actions of kind ``action`` (tierd.namespace.lifecycle)."""
        self.lifecycle.labels(action).inc(count)

    def observe_checkpoint(self, phase: str, seconds: float) -> None:
        """A checkpoint step finished ``phase`` (one of :data:`CHECKPOINT_PHASES`)."""
        self.checkpoint_seconds.labels(phase).observe(max(seconds, 0.0))

    # -- reading back (tierctl status through the admin API) ------------------------------
    def request_counts(self) -> dict[str, dict[str, dict[str, int]]]:
        """door -> operation -> status -> requests answered since start (only non-zero)."""
        return self.requests.request_counts()

    def door_totals(self) -> dict[str, int]:
        """door -> requests answered since start (every door, zeros included)."""
        totals = dict.fromkeys(DOORS, 0)
        for door, ops in self.request_counts().items():
            totals[door] = totals.get(door, 0) + sum(n for st in ops.values() for n in st.values())
        return totals

    # -- exposition -----------------------------------------------------------------------
    async def refresh(self) -> None:
        """Read what cannot be read on the loop (the persist queue) into the collector."""
        p = self.state.placement
        if p is not None:
            # the engine's own summary, unbounded: off the loop, every token is read
            q = await asyncio.to_thread(p.queue_summary, sys.maxsize)
            self.state.queue = QueueSnapshot(q["depth"], q["oldest_age_seconds"])

    async def render(self) -> bytes:
        """The text exposition of every metric (what ``GET /metrics`` answers).

        Only the state the loop owns is read on the loop: a few dictionaries, and a copy
        of the request figures; formatting takes ~10 ms with every operation seen, so it
        runs in a worker thread (prometheus_client's own metrics are thread-safe)."""
        await self.refresh()
        state = list(self.state.collect())
        requests = self.requests.frozen()
        return await asyncio.to_thread(generate_latest,
                                       _Frozen([requests, *self.events], state))


class _Frozen(Collector):
    """Live event metrics followed by state families already read on the loop."""

    def __init__(self, live: list[Collector], state: list[Metric]) -> None:
        self.live, self.state = live, state

    def collect(self) -> Iterable[Metric]:
        for c in self.live:
            yield from c.collect()
        yield from self.state


def _gauge(name: str, doc: str, labels: Iterable[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


def _counter(name: str, doc: str, labels: Iterable[str] = ()) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=list(labels))


class StateCollector(Collector):
    """Tier, placement, persister and pool state, read when scraped."""

    def __init__(self) -> None:
        self.placement: Placement | None = None
        self.pool: MemPool | None = None
        self.queue = QueueSnapshot()

    def describe(self) -> Iterable[Metric]:
        return []  # dynamic: nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        if self.placement is not None:
            yield from _placement_metrics(self.placement, self.queue)
        if self.pool is not None:
            yield from _pool_metrics(self.pool.stats())


def _placement_metrics(p: Placement, queue: QueueSnapshot) -> Iterator[Metric]:
    st = p.stats
    used = _gauge("tierd_tier_used_bytes", "Bytes resident on a local tier", ["tier"])
    cap = _gauge("tierd_tier_capacity_bytes", "Capacity of a local tier", ["tier"])
    mem = p.mem
    mst: dict[str, Any] = mem.describe() if mem is not None else {}
    if mem is not None:
        used.add_metric(["mem"], mst.get("used", 0))
        cap.add_metric(["mem"], mst.get("capacity", 0))
    for tc in p.tiers():
        used.add_metric([tc.name], tc.used)
        cap.add_metric([tc.name], tc.capacity)
    yield used
    yield cap

    hits = _counter("tierd_tier_hits", "Reads served by a tier without going further down "
                    "(hot: no cold fetch needed)", ["tier"])
    hits.add_metric(["hot"], st.hits)
    if mem is not None:
        hits.add_metric(["mem"], mst.get("hits", 0))
    yield hits
    misses = _counter("tierd_tier_misses", "Reads that had to fetch blocks from the cold "
                      "store", ["tier"])
    misses.add_metric(["hot"], st.misses)
    yield misses

    yield CounterMetricFamily("tierd_tier_promoted_blocks", "Warm blocks promoted to hot on "
                              "their second reference", value=st.promoted_blocks)
    filled = _counter("tierd_tier_filled_bytes", "Bytes brought onto a tier from a lower "
                      "one (reads, readahead, warmup)", ["tier", "source"])
    for (dst, src), v in sorted(st.filled.items()):
        filled.add_metric([dst, src], v)
    yield filled
    yield CounterMetricFamily("tierd_tier_demoted_bytes", "Bytes moved from hot to warm on "
                              "eviction", value=st.demoted_bytes)
    evicted = _counter("tierd_tier_evicted_bytes", "Bytes evicted from a tier", ["tier"])
    for tc in p.tiers():
        evicted.add_metric([tc.name], st.evicted_from[tc.name])
    if mem is not None:
        evicted.add_metric(["mem"], mst.get("evicted_bytes", 0))
    yield evicted
    if mem is not None:
        admitted = _counter("tierd_tier_admitted_bytes", "Bytes copied into the memory "
                            "tier", ["tier"])
        admitted.add_metric(["mem"], mst.get("admitted_bytes", 0))
        yield admitted

    yield GaugeMetricFamily("tierd_dirty_bytes", "Committed bytes the cold store does not "
                            "have yet", value=p.dirty_bytes)
    yield GaugeMetricFamily("tierd_dirty_limit_bytes", "dirty_limit: past it writers wait "
                            "(FUSE) or get 503 SlowDown (S3)", value=p.settings.dirty_limit)
    yield GaugeMetricFamily("tierd_dirty_files", "Files with bytes the cold store lacks",
                            value=len(p.dirty))
    yield GaugeMetricFamily("tierd_persist_queue_depth", "Files queued for the cold store "
                            "(deletes and renames included)", value=queue.depth)
    yield GaugeMetricFamily("tierd_persist_queue_oldest_age_seconds", "Age of the oldest queued "
                            "file (0 when the queue is empty)", value=queue.oldest_age)
    yield GaugeMetricFamily("tierd_persist_active", "Files being uploaded now",
                            value=len(getattr(p, "_active", ())))
    yield CounterMetricFamily("tierd_persisted_files", "Files brought in line with the cold "
                              "store", value=st.persisted)
    yield CounterMetricFamily("tierd_cold_uploaded_bytes", "Bytes uploaded to the cold store",
                              value=st.uploaded_bytes)
    yield GaugeMetricFamily("tierd_cold_store_up", "1 while the cold store answers, 0 while the "
                            "persister backs off",
                            value=0 if getattr(p, "cold_down", False) else 1)
    errors = _counter("tierd_cold_store_errors", "Failed cold-store calls: uploads (retried) "
                      "and reads", ["operation"])
    errors.add_metric(["persist"], st.persist_failures)
    errors.add_metric(["read"], st.cold_read_errors)
    yield errors
    yield CounterMetricFamily("tierd_dirty_limit_waits", "Writes that waited for dirty data to "
                              "drain below dirty_limit", value=st.write_waits)


def _pool_metrics(ps: dict[str, Any]) -> Iterator[Metric]:
    for key, name, doc in (
        ("capacity", "tierd_pool_capacity_bytes", "Size of the memory pool"),
        ("used", "tierd_pool_used_bytes", "Bytes of the memory pool allocated"),
        ("free", "tierd_pool_free_bytes", "Bytes of the memory pool free"),
        ("largest_free", "tierd_pool_largest_free_bytes", "Largest free extent"),
        ("fragmentation", "tierd_pool_fragmentation_ratio", "1 - largest free / free"),
        ("regions", "tierd_pool_regions", "Regions allocated"),
    ):
        yield GaugeMetricFamily(name, doc, value=float(ps.get(key, 0) or 0))
    tenants: dict[str, dict[str, int]] = ps.get("tenants", {})
    t_used = _gauge("tierd_pool_tenant_used_bytes", "Pool bytes allocated per tenant (uid)",
                    ["tenant"])
    t_quota = _gauge("tierd_pool_tenant_quota_bytes", "Pool quota per tenant (uid)",
                     ["tenant"])
    t_regions = _gauge("tierd_pool_tenant_regions", "Pool regions per tenant (uid)",
                       ["tenant"])
    for tenant, t in tenants.items():
        t_used.add_metric([tenant], t.get("used", 0))
        t_quota.add_metric([tenant], t.get("quota", 0))
        t_regions.add_metric([tenant], t.get("regions", 0))
    yield t_used
    yield t_quota
    yield t_regions
    for key, name, doc in (
        ("bytes_moved_in", "tierd_pool_far_moved_in_bytes", "Bytes copied into far memory"),
        ("bytes_moved_out", "tierd_pool_far_moved_out_bytes", "Bytes copied out of far "
         "memory"),
    ):
        yield CounterMetricFamily(name, doc, value=float(ps.get(key, 0) or 0))


# -- the HTTP doors' middleware ---------------------------------------------------------------

def admin_operation(request: web.Request) -> str:
    """An admin request's operation: method and route template (``GET /v1/users/{name}``),
    never the raw path (unbounded label values)."""
    op = request.get(OPERATION)
    if isinstance(op, str):
        return op
    resource = request.match_info.route.resource
    if resource is None:
        return f"{request.method} unmatched"
    return f"{request.method} {resource.canonical}"


def s3_operation(request: web.Request) -> str:
    """An S3 request's operation as its handler recorded it (``unknown`` when the request
    was refused before routing, e.g. a bad signature)."""
    op = request.get(OPERATION)
    return op if isinstance(op, str) else "unknown"


def request_middleware(metrics: Metrics | None, door: str,
                       operation: Callable[[web.Request], str],
                       header: str | None = None) -> Middleware:
    """An HTTP door's first middleware (only the S3 body watchdog runs before it): gives
    the request its id (on the request under :data:`~tierd.logs.REQUEST_ID` and in
    :data:`~tierd.logs.request_id_var` for the logs; echoed in ``header`` when given), and
    counts and times it in ``metrics``."""

    @web.middleware
    async def observe(request: web.Request, handler: Handler) -> web.StreamResponse:
        rid = new_request_id()
        request[REQUEST_ID] = rid
        token = request_id_var.set(rid)
        start = time.monotonic()
        status = 500
        stats = None if metrics is None else metrics.requests
        if stats is not None:
            stats.begin(door)
        try:
            resp = await handler(request)
            status = resp.status
            if header is not None and not resp.prepared:
                resp.headers[header] = rid
            return resp
        except web.HTTPException as e:
            status = e.status
            if header is not None:
                e.headers[header] = rid
            raise
        except (ConnectionError, asyncio.CancelledError):
            status = 499  # the client went away (nginx's code): not the daemon's failure
            raise
        finally:
            request_id_var.reset(token)
            if stats is not None:
                stats.end(door, operation(request), status_class(status),
                          time.monotonic() - start)

    return observe
