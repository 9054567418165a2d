"""Request counts, latencies and requests in flight, per door: what every request pays for.

Every FUSE request and every HTTP request is counted and timed (:mod:`tierd.metrics`:
``tierd_requests_total``, ``tierd_request_duration_seconds``, ``tierd_requests_in_flight``).
prometheus_client's metric objects are thread-safe: each ``inc``, ``dec`` and ``observe``
takes a lock, and a histogram observation looks its bucket up in Python; the four calls
cost a request about 2 us in a loop of their own, and the FUSE door answers five requests
per file created (~2% of the daemon's CPU per create: docs/fuse.md, "Compiled modules and
other event loops").  Every request is answered on the event loop, so nothing here needs a
lock: a request's accounting is a few dictionary updates and one ``bisect`` (~0.3 us).

A scrape must not format these on the loop (docs/observability.md): :meth:`RequestStats.frozen`
copies the dictionaries on the loop (a few hundred entries at most, bounded like the label
values) and the copy is formatted in a worker thread.  The exposition is prometheus_client's
for the same metrics: counters with ``_total`` and ``_created``, the histogram's cumulative
``_bucket`` series with ``_count``, ``_sum`` and ``_created``.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterable, Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

#: (door, operation, status) -> [requests, created]
Counts = dict[tuple[str, str, str], list[float]]
#: (door, operation) -> [requests per bucket (not cumulative; the last is +Inf), sum, created]
Timings = dict[tuple[str, str], list[float]]


class RequestStats(Collector):
    """The request metrics of one daemon; written on its event loop only."""

    def __init__(self, doors: Iterable[str], buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts: Counts = {}
        self.timings: Timings = {}
        #: door -> requests being handled now
        self.in_flight: dict[str, int] = dict.fromkeys(doors, 0)

    def begin(self, door: str) -> None:
        """A request of ``door`` arrived."""
        self.in_flight[door] += 1

    def end(self, door: str, operation: str, status: str, seconds: float) -> None:
        """The request :meth:`begin` counted was answered."""
        self.in_flight[door] -= 1
        self.observe(door, operation, status, seconds)

    def observe(self, door: str, operation: str, status: str, seconds: float) -> None:
        """One answered request (``status``: ``tierd.metrics.status_class`` or
        ``errno_status``), not counted in flight."""
        seconds = max(seconds, 0.0)
        count = self.counts.get((door, operation, status))
        if count is None:
            count = self.counts[(door, operation, status)] = [0, time.time()]
        count[0] += 1
        timing = self.timings.get((door, operation))
        if timing is None:
            n = len(self.buckets) + 1
            timing = self.timings[(door, operation)] = [0] * n + [0.0, time.time()]
        timing[bisect_left(self.buckets, seconds)] += 1
        timing[-2] += seconds

    def request_counts(self) -> dict[str, dict[str, dict[str, int]]]:
        """door -> operation -> status -> requests answered (only non-zero)."""
        out: dict[str, dict[str, dict[str, int]]] = {}
        for (door, op, status), (n, _) in self.counts.items():
            if n:
                out.setdefault(door, {}).setdefault(op, {})[status] = int(n)
        return out

    def frozen(self) -> FrozenRequests:
        """A copy of the figures now (on the loop), to be formatted elsewhere."""
        return FrozenRequests(self.buckets, {k: list(v) for k, v in self.counts.items()},
                              {k: list(v) for k, v in self.timings.items()},
                              dict(self.in_flight))

    def describe(self) -> Iterable[Metric]:
        return []  # dynamic: nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        """The families from the live figures (tests, and a registry read on the loop)."""
        return self.frozen().collect()


class FrozenRequests(Collector):
    """The request metrics as they were at one moment (:meth:`RequestStats.frozen`)."""

    def __init__(self, buckets: tuple[float, ...], counts: Counts, timings: Timings,
                 in_flight: dict[str, int]) -> None:
        self.buckets = buckets
        self.counts, self.timings, self.in_flight = counts, timings, in_flight

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "tierd_requests", "Requests answered, per door, operation and status class",
            labels=["door", "operation", "status"])
        for labels, (n, created) in self.counts.items():
            requests.add_metric(list(labels), n, created=created)
        yield requests
        seconds = HistogramMetricFamily(
            "tierd_request_duration_seconds",
            "Time from a request's arrival to its handler's return, per door and operation",
            labels=["door", "operation"])
        bounds = [repr(float(b)) for b in self.buckets] + ["+Inf"]  # (as prometheus_client)
        for (door, op), timing in self.timings.items():
            running, cumulative = 0.0, []
            for bound, n in zip(bounds, timing, strict=False):
                running += n
                cumulative.append((bound, running))
            seconds.add_metric([door, op], cumulative, timing[-2])
            seconds.samples.append(Sample("tierd_request_duration_seconds_created",
                                          {"door": door, "operation": op}, timing[-1]))
        yield seconds
        flight = GaugeMetricFamily(
            "tierd_requests_in_flight",
            "Requests being handled now, per door (door=fuse: outstanding FUSE requests)",
            labels=["door"])
        for door, n in self.in_flight.items():
            flight.add_metric([door], n)
        yield flight
