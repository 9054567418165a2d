"""Metadata engines head to head: lmdb (embedded) against PostgreSQL (a real local server).

What the namespace needs to know before it calls an engine from the event loop (it does so
synchronously with lmdb today; the loop's budget is ~1 ms per call):

* ``put_commit``: single-key write transactions (begin, put, commit) per second;
* ``get``: point reads per second inside one open read transaction, and ``read_txn``: whole
  read transactions (begin, get, end) per second -- what one namespace lookup costs;
* ``scan_1000``: scans of a 1000-key range per second;
* ``get_latency_us`` / ``read_txn_latency_us``: median and 99th percentile of one get (every
  key read once before: a warm cache) and of one read transaction, in microseconds;
* ``write_txn_latency_us``: one read-modify-write transaction (begin, get, put, commit);
* ``feed_latency_us`` (pg only): from a commit's return on one node to the change feed's
  callback on another (two stores on the database, as two nodes).

Engines: ``lmdb`` (durable commits: an fdatasync each), ``group-lmdb`` (the lmdb default),
``pg`` (every commit a durable PostgreSQL commit, fsync on, over TCP to 127.0.0.1; the node's
read cache on, the daemon's setup) and ``pg-cold`` (the same with a cache of 0 entries: every
get a round trip, what a cache miss costs).  The server is started here
(tests/meta/pg_server.py: initdb in a temporary directory).  Prints one JSON document;
``--out FILE`` writes it there too.

    .venv/bin/python bench/meta_engines.py --seconds 2 --out bench/results/meta_engines.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "meta"))
sys.path.insert(0, str(REPO / "tests"))  # pg_server imports moto_server

from pg_server import PgServer, find_bindir  # noqa: E402

from tierd.meta.group_engine import GroupCommitStore  # noqa: E402
from tierd.meta.kv import KVStore  # noqa: E402
from tierd.meta.lmdb_engine import LmdbStore  # noqa: E402
from tierd.meta.pg_engine import PgStore  # noqa: E402

NKEYS = 10_000


def key(i: int) -> bytes:
    return b"I%08d" % i


def rate(fn: Callable[[int], object], seconds: float) -> tuple[float, list[float]]:
    """Calls of ``fn`` per second over ``seconds``, and each call's duration."""
    times: list[float] = []
    start = time.perf_counter()
    i = 0
    while True:
        t0 = time.perf_counter()
        fn(i)
        t1 = time.perf_counter()
        times.append(t1 - t0)
        i += 1
        if t1 - start >= seconds:
            return i / (t1 - start), times


def pct(times: list[float]) -> dict[str, float]:
    us = sorted(t * 1e6 for t in times)
    return {"p50": round(statistics.median(us), 1), "p99": round(us[int(len(us) * 0.99)], 1)}


def measure(engine: KVStore, seconds: float) -> dict[str, Any]:
    with engine.begin(write=True) as tx:
        for i in range(NKEYS):
            tx.put(key(i), b"v" * 100)
    engine.sync()

    def put_commit(i: int) -> None:
        with engine.begin(write=True) as tx:
            tx.put(b"W%08d" % i, b"x" * 100)

    def write_txn(i: int) -> None:
        with engine.begin(write=True) as tx:
            n = int(tx.get(b"Cn") or b"0")
            tx.put(b"Cn", b"%d" % (n + 1))

    out: dict[str, Any] = {}
    out["put_commit_per_s"], _ = rate(put_commit, seconds)
    out["write_txn_per_s"], times = rate(write_txn, seconds)
    out["write_txn_latency_us"] = pct(times)
    engine.sync()
    tx = engine.begin()
    try:
        for i in range(NKEYS):  # every key read once: the cache (if any) is warm
            tx.get(key(i))
        out["get_per_s"], times = rate(lambda i: tx.get(key(i % NKEYS)), seconds)
        out["get_latency_us"] = pct(times)
        out["scan_1000_per_s"], _ = rate(
            lambda i: sum(1 for _ in tx.scan(key(i % 9000), key(i % 9000 + 1000))), seconds)
    finally:
        tx.abort()

    def read_txn(i: int) -> None:
        t = engine.begin()
        try:
            t.get(key(i % NKEYS))
        finally:
            t.abort()

    out["read_txn_per_s"], times = rate(read_txn, seconds)
    out["read_txn_latency_us"] = pct(times)
    return {k: round(v) if isinstance(v, float) else v for k, v in out.items()}


def feed_latency(url: str, commits: int = 200) -> dict[str, float]:
    """Microseconds from a commit's return on node a to node b's feed callback."""
    a, b = PgStore(url, node="a"), PgStore(url, node="b")
    seen: dict[int, float] = {}
    done = threading.Event()

    def heard(seq: int, keys: list[bytes] | None) -> None:
        seen[seq] = time.perf_counter()
        if len(seen) >= commits:
            done.set()

    try:
        stop = b.watch(heard)
        while not b._feeds[0].ready.is_set():
            time.sleep(0.01)
        sent: dict[int, float] = {}
        for i in range(commits):
            with a.begin(write=True) as tx:
                tx.put(b"F%d" % i, b"x")
                seq = tx.seq + 1  # type: ignore[attr-defined]
            sent[seq] = time.perf_counter()
            time.sleep(0.002)
        done.wait(30)
        stop()
        return pct([seen[s] - t for s, t in sent.items() if s in seen])
    finally:
        a.close()
        b.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    bindir = find_bindir()
    if bindir is None:
        sys.exit("PostgreSQL is not installed (initdb not found): ./dev.sh setup installs it")
    server = PgServer(bindir, fsync=True)
    results: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="meta-bench-") as tmp:
            opens: dict[str, Callable[[], KVStore]] = {
                "lmdb": lambda: LmdbStore(Path(tmp) / "lmdb"),
                "group-lmdb": lambda: GroupCommitStore(
                    LmdbStore(Path(tmp) / "glmdb", metasync=True)),
                "pg": lambda: PgStore(server.url("pg")),
                "pg-cold": lambda: PgStore(server.url("pgcold"), cache_entries=0),
            }
            for name, open_engine in opens.items():
                engine = open_engine()
                try:
                    results[name] = measure(engine, args.seconds)
                finally:
                    engine.close()
                print(name, results[name], file=sys.stderr)
            results["pg"]["feed_latency_us"] = feed_latency(server.url("feed"))
    finally:
        server.stop()
    doc = {"bench": "meta_engines", "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
           "machine": platform.node(), "seconds": args.seconds,
           "postgresql": str(bindir), "results": results}
    text = json.dumps(doc, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
