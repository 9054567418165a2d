"""tierd.metrics in process: the exposition the daemon renders off the loop holds every
family of the registry, label values stay bounded, and read-back for tierctl status."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tierd.metrics import Metrics, errno_status, status_class


def names(text: bytes) -> set[str]:
    return {f.name for f in text_string_to_metric_families(text.decode())}


def test_render_has_every_registered_family() -> None:
    m = Metrics()
    m.requests.observe("s3", "GetObject", "2xx", 0.01)
    m.observe_checkpoint("stall", 0.2)
    rendered = asyncio.run(m.render())
    assert names(rendered) == names(generate_latest(m.registry))
    assert {"tierd_requests", "tierd_request_duration_seconds", "tierd_requests_in_flight",
            "tierd_checkpoint_duration_seconds"} <= names(rendered)


def test_two_daemons_do_not_share_a_registry() -> None:
    a, b = Metrics(), Metrics()
    a.requests.observe("admin", "GET /v1/status", "2xx", 0.001)
    assert a.request_counts() == {"admin": {"GET /v1/status": {"2xx": 1}}}
    assert b.request_counts() == {}
    assert b.door_totals() == {"s3": 0, "admin": 0, "fuse": 0}


def test_counts_read_back_per_door() -> None:
    m = Metrics()
    for status in ("2xx", "2xx", "4xx"):
        m.requests.observe("s3", "PutObject", status, 0.01)
    m.requests.observe("fuse", "lookup", errno_status(2), 0.0001)
    m.requests.observe("fuse", "lookup", errno_status(0), 0.0001)
    assert m.request_counts()["s3"] == {"PutObject": {"2xx": 2, "4xx": 1}}
    assert m.request_counts()["fuse"] == {"lookup": {"ENOENT": 1, "ok": 1}}
    assert m.door_totals() == {"s3": 3, "admin": 0, "fuse": 2}


def test_status_labels() -> None:
    assert [status_class(c) for c in (200, 204, 304, 404, 499, 503)] == \
        ["2xx", "2xx", "3xx", "4xx", "4xx", "5xx"]
    assert status_class(42) == "other"
    assert errno_status(None) == "ok" and errno_status(13) == "EACCES"
    assert errno_status(100000) == "EOTHER"


def test_request_histogram_buckets_and_in_flight() -> None:
    """The loop-only request figures (tierd.reqstats) expose what prometheus_client's
    Counter, Histogram and Gauge did: ``le`` buckets are cumulative and inclusive, a time
    past the last bound counts only in +Inf, a negative one as 0, and a scrape's copy does
    not move with later requests."""
    m = Metrics()
    for seconds in (0.0005, 0.0004, 0.003, 100.0, -1.0):
        m.requests.begin("fuse")
        m.requests.end("fuse", "create", "ok", seconds)
    m.requests.begin("s3")  # still being handled
    frozen = m.requests.frozen()
    m.requests.observe("fuse", "create", "ok", 0.0001)  # after the copy
    fams = {f.name: f for f in text_string_to_metric_families(
        generate_latest(frozen).decode())}
    buckets = {s.labels["le"]: s.value for s in fams["tierd_request_duration_seconds"].samples
               if s.name.endswith("_bucket")}
    assert buckets["0.0005"] == 3  # 0.0005 itself, 0.0004 and the negative one
    assert buckets["0.0025"] == 3 and buckets["0.005"] == 4
    assert buckets["60.0"] == 4 and buckets["+Inf"] == 5
    total = [s.value for s in fams["tierd_request_duration_seconds"].samples
             if s.name.endswith("_sum")]
    assert total == [pytest.approx(100.0039)]
    assert [s.value for s in fams["tierd_requests"].samples if s.name.endswith("_total")] == [5]
    flight = {s.labels["door"]: s.value for s in fams["tierd_requests_in_flight"].samples}
    assert flight == {"s3": 1, "admin": 0, "fuse": 0}
    assert m.request_counts()["fuse"] == {"create": {"ok": 6}}
