"""Cold-store faults against a real daemon: the store killed, hung (SIGSTOP), throttling
(503 SlowDown) and slow -- the last two through :class:`~durability.coldlib.FaultProxy`, a
reverse proxy in front of moto.  In each: acknowledged data is never lost, nothing is
dropped from the namespace, local data stays readable, and persistence resumes by itself.
(A store that comes back empty: ``test_cold_loss.py``.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from moto_server import MotoServer

from .coldlib import COLD_BUCKET, Cold, FaultProxy, Tierd, running, wait_for

BUCKET = "cflt"
FAST = {"TIERD_COLD_TIMEOUT": "2", "TIERD_COLD_PROBE_INTERVAL": "1",
        "TIERD_COLD_S3_READ_TIMEOUT": "1", "TIERD_COLD_S3_CONNECT_TIMEOUT": "1",
        "TIERD_IMPORT_TTL": "1"}


@pytest.fixture
def server() -> Iterator[MotoServer]:
    """A moto server of the test's own (it is stopped, killed or restarted)."""
    s = MotoServer().start()
    try:
        s.client().create_bucket(Bucket=COLD_BUCKET)
        yield s
    finally:
        with_cont(s)
        s.close()


def with_cont(s: MotoServer) -> None:
    proc = s._proc
    if proc is not None and proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)


@contextlib.contextmanager
def _persisted(tmp_path: Path, server: MotoServer, n: int) -> Iterator[
        tuple[Tierd, dict[str, bytes]]]:
    """A daemon over ``server`` with ``n`` objects written and persisted."""
    t = Tierd(tmp_path, Cold("s3", tmp_path, server), **FAST)
    with running(t):
        t.s3().create_bucket(Bucket=BUCKET)
        data = {f"o{i}": os.urandom(40_000 + i) for i in range(n)}
        _put(t, data)
        assert t.persist_wait(BUCKET + "/")["persisted"]
        assert t.cold_tier()["reachable"] is True
        yield t, data


def _put(t: Tierd, data: dict[str, bytes]) -> None:
    s3 = t.s3()
    for k, v in data.items():
        s3.put_object(Bucket=BUCKET, Key=k, Body=v)


def _all_there(t: Tierd, data: dict[str, bytes]) -> None:
    """Every acknowledged object through the S3 door, and -- once persisted -- in cold."""
    s3 = t.s3()
    assert t.listing(BUCKET) == set(data)
    for k, v in data.items():
        assert s3.get_object(Bucket=BUCKET, Key=k)["Body"].read() == v
    doc = t.persist_wait(BUCKET + "/", timeout=120)
    assert doc["persisted"], doc
    assert {k for k in t.cold.objects() if k.startswith(BUCKET + "/")} == {
        f"{BUCKET}/{k}" for k in data}
    for k, v in data.items():
        assert t.cold.get(f"{BUCKET}/{k}") == v
    assert "dropped from the namespace" not in t.log


def test_cold_hung_is_detected_and_recovers(server: MotoServer, tmp_path: Path) -> None:
    """SIGSTOP the store for longer than the timeout: status says unreachable (with a
    reason), the log says so, client reads of hot data and writes keep working; after
    SIGCONT it is reachable again and everything written meanwhile reaches cold."""
    with _persisted(tmp_path, server, 4) as (t, data):
        assert server._proc is not None
        os.kill(server._proc.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            wait_for(lambda: t.cold_tier()["reachable"] is False, 20, "unreachable status")
            detected = time.monotonic() - stopped
            cold = t.status()["placement"]["cold"]
            assert cold["reachable"] is False and cold["reason"], cold
            assert "unreachable" in t.log
            s3 = t.s3()
            t0 = time.monotonic()
            for k, v in data.items():  # hot data: served without asking cold
                assert s3.get_object(Bucket=BUCKET, Key=k)["Body"].read() == v
            assert t.listing(BUCKET) == set(data)  # the local view, not a hung listing
            assert time.monotonic() - t0 < 5
            data["during"] = os.urandom(70_000)
            _put(t, {"during": data["during"]})  # writes go on (dirty, on hot)
            time.sleep(max(0.0, 4 - (time.monotonic() - stopped)))  # > the 2 s timeout
        finally:
            os.kill(server._proc.pid, signal.SIGCONT)
        wait_for(lambda: t.cold_tier()["reachable"] is True, 40, "reachable again")
        _all_there(t, data)
    print(f"hung store detected after {detected:.1f} s")


def test_cold_killed_then_back(server: MotoServer, tmp_path: Path) -> None:
    """The store killed (connections refused): unreachable, local data readable, writes
    go on; it comes back (empty: moto keeps nothing) and everything is in cold again."""
    with _persisted(tmp_path, server, 3) as (t, data):
        server.stop(kill=True)
        wait_for(lambda: t.cold_tier()["reachable"] is False, 20, "unreachable status")
        s3 = t.s3()
        for k, v in data.items():
            assert s3.get_object(Bucket=BUCKET, Key=k)["Body"].read() == v
        data["while-down"] = os.urandom(60_000)
        _put(t, {"while-down": data["while-down"]})
        server.restart()
        server.client().create_bucket(Bucket=COLD_BUCKET)
        wait_for(lambda: t.cold_tier()["reachable"] is True, 40, "reachable again")
        _all_there(t, data)


def test_cold_throttling_then_recovers(moto: MotoServer, tmp_path: Path) -> None:
    """The store answers every write, then most writes, with 503 SlowDown: files back off
    one by one (the store stays reachable: reads and listings of it work), nothing is
    lost, and once the throttling stops everything is persisted.  (While most writes were
    refused, the 8 files could all get through by chance before the check that they had
    not -- a 1-in-hundreds failure -- so that check runs while every write is refused.)"""
    with FaultProxy(moto.url) as proxy:
        t = Tierd(tmp_path, Cold("s3", tmp_path, moto, endpoint=proxy.url), **FAST)
        with running(t):
            t.s3().create_bucket(Bucket=BUCKET)
            proxy.slowdown, proxy.only = 1.0, {"PUT", "POST"}
            data = {f"t{i}": os.urandom(30_000 + i) for i in range(8)}
            _put(t, data)
            wait_for(lambda: proxy.refused >= 8, 30, "throttled uploads")
            assert t.persist_wait(BUCKET + "/", timeout=1)["persisted"] is False
            assert t.cold_tier()["reachable"] is True  # throttled is not down
            assert t.listing(BUCKET) == set(data)
            refused, proxy.slowdown = proxy.refused, 0.8  # some get through now
            wait_for(lambda: proxy.refused >= refused + 8  # (or all got through by chance)
                     or t.persist_wait(BUCKET + "/", timeout=0.1)["persisted"],
                     30, "throttled again")
            proxy.slowdown = 0.0
            _all_there(t, data)
            assert "Traceback" not in t.log


def test_cold_throttling_every_head_is_not_down(moto: MotoServer, tmp_path: Path) -> None:
    """The store answers every HEAD with 503 (a HEAD's answer has no body: no code says
    SlowDown): the idle store's probes still find it up, files written meanwhile persist,
    and the status never says it is unreachable."""
    with FaultProxy(moto.url) as proxy:
        t = Tierd(tmp_path, Cold("s3", tmp_path, moto, endpoint=proxy.url), **FAST)
        with running(t):
            t.s3().create_bucket(Bucket=BUCKET)
            proxy.slowdown, proxy.only = 1.0, {"HEAD"}
            seen = []
            deadline = time.monotonic() + 4  # probes every second while idle
            while time.monotonic() < deadline:
                seen.append(t.cold_tier()["reachable"])
                time.sleep(0.2)
            assert proxy.refused >= 2, "no probe reached the store"
            data = {f"h{i}": os.urandom(20_000 + i) for i in range(4)}
            _put(t, data)
            _all_there(t, data)
            seen.append(t.cold_tier()["reachable"])
            assert all(seen), seen
            assert "Traceback" not in t.log


def test_cold_slow_store(moto: MotoServer, tmp_path: Path) -> None:
    """Every request to the store takes 0.4 s more: slower, never wrong."""
    with FaultProxy(moto.url) as proxy:
        t = Tierd(tmp_path, Cold("s3", tmp_path, moto, endpoint=proxy.url),
                  TIERD_COLD_TIMEOUT="5")
        with running(t):
            t.s3().create_bucket(Bucket=BUCKET)
            proxy.delay = 0.4
            data = {f"s{i}": os.urandom(200_000) for i in range(5)}
            _put(t, data)
            _all_there(t, data)
            assert t.cold_tier()["reachable"] is True
