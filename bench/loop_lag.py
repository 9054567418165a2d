"""How long the daemon's event loop stalls while its namespace works over PostgreSQL.

A namespace (the daemon's: a placement over a hot directory, ``tests/nsplacement.py``) over a
real PostgreSQL server (``tests/meta/pg_server.py``, fsync on) runs a mixed workload on one
event loop, the way the doors drive it: ``--writers`` coroutines PUT small objects (S3
put_object), ``--readers`` coroutines HEAD, GET and list existing objects and look names up
(FUSE lookup and getattr).  Beside it a thread plays another node: a session of its own that
takes the writers' lock (``SELECT ... FOR UPDATE`` on ``meta_schema``) every
``--other-every`` seconds for ``--other-hold`` seconds, as another node's write transaction
does.  A ticker coroutine sleeps 1 ms at a time and records how late it wakes: the loop's lag.

With ``--census`` it also counts what still waits on the network on the loop's thread: the
transactions begun synchronously there (``PgStore.begin``) and the queries of transaction
bodies (cache misses, scans), by the tierd function that made them.

Phases: ``mixed`` (all of the above) and ``puts`` (``--writers`` concurrent PUTs alone, no
other node: the throughput of concurrent PUTs over PostgreSQL).  Prints one JSON document
(``--out FILE`` writes it there too): per phase the lag's p50, p99 and max in ms and the
operations per second.

    .venv/bin/python bench/loop_lag.py --seconds 5 --out bench/results/loop_lag.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "meta"))
sys.path.insert(0, str(REPO / "tests"))

import psycopg  # noqa: E402
from nsplacement import close_namespace, open_namespace  # noqa: E402
from pg_server import PgServer, find_bindir  # noqa: E402

from tierd.acl import Identity  # noqa: E402
from tierd.errors import FsError  # noqa: E402
from tierd.meta import MetaStore  # noqa: E402
from tierd.meta.pg_engine import PgStore, PgTxn  # noqa: E402
from tierd.namespace import ROOT_INO, Namespace  # noqa: E402

ROOT = Identity.ROOT
BUCKET = "lag"
BODY = os.urandom(4096)


async def _body() -> Any:
    yield BODY


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


class Other(threading.Thread):
    """Another node's write transactions: the writers' lock held ``hold`` s every ``every`` s."""

    def __init__(self, url: str, every: float, hold: float) -> None:
        super().__init__(daemon=True)
        self.url, self.every, self.hold = url, every, hold
        self.stop = threading.Event()
        self.held = 0

    def run(self) -> None:
        with psycopg.connect(self.url) as conn:
            while not self.stop.wait(self.every):
                conn.execute("SELECT seq FROM meta_schema FOR UPDATE")
                time.sleep(self.hold)
                conn.rollback()
                self.held += 1


async def _phase(ns: Namespace, seconds: float, writers: int, readers: int,
                 prefix: str) -> dict[str, Any]:
    stop = asyncio.Event()
    lags: list[float] = []
    counts = {"put": 0, "head": 0, "get": 0, "list": 0, "lookup": 0, "getattr": 0,
              "errors": 0}
    bucket_ino = (await ns.lookup(ROOT, ROOT_INO, BUCKET.encode())).ino

    async def ticker() -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append(max(0.0, time.perf_counter() - t0 - 0.001))

    async def writer(w: int) -> None:
        i = 0
        while not stop.is_set():
            await ns.put_object(ROOT, BUCKET, f"{prefix}/w{w}/{i}", _body())
            counts["put"] += 1
            i += 1

    async def reader(r: int) -> None:
        i = 0
        while not stop.is_set():
            key = f"seed/{(r * 7 + i) % 50}"
            try:
                await ns.head_object(ROOT, BUCKET, key)
                counts["head"] += 1
                reader_ = await ns.get_object(ROOT, BUCKET, key)
                await reader_.close()
                counts["get"] += 1
                if i % 5 == 0:
                    await ns.list_objects(ROOT, BUCKET, prefix="seed/", limit=20)
                    counts["list"] += 1
                with contextlib.suppress(FsError):
                    await ns.lookup(ROOT, bucket_ino, f"absent-{r}-{i}".encode())
                counts["lookup"] += 1
                await ns.getattr(ROOT, bucket_ino)
                counts["getattr"] += 1
            except FsError:
                counts["errors"] += 1
            i += 1
            await asyncio.sleep(0)  # a door yields between requests (its socket)

    tasks = [asyncio.create_task(ticker())]
    tasks += [asyncio.create_task(writer(w)) for w in range(writers)]
    tasks += [asyncio.create_task(reader(r)) for r in range(readers)]
    t0 = time.perf_counter()
    await asyncio.sleep(seconds)
    stop.set()
    await asyncio.gather(*tasks)
    wall = time.perf_counter() - t0
    ms = [x * 1000 for x in lags]
    return {
        "seconds": round(wall, 2),
        "lag_ms": {"p50": round(_pct(ms, 0.5), 3), "p99": round(_pct(ms, 0.99), 3),
                   "max": round(max(ms, default=0.0), 3),
                   "mean": round(statistics.fmean(ms), 3) if ms else 0.0, "ticks": len(ms)},
        "ops_per_s": {k: round(v / wall, 1) for k, v in counts.items() if k != "errors"},
        "errors": counts["errors"],
    }


class Census:
    """Network waits on the loop's thread, by caller (see the module doc)."""

    def __init__(self) -> None:
        self.begins: Counter[str] = Counter()
        self.queries: Counter[str] = Counter()
        self.loop_thread = threading.main_thread()

    @staticmethod
    def _caller() -> str:
        """The innermost tierd function outside tierd/meta that made the call, after the
        one that called it (``outer > inner``): which body, and where in it."""
        found: list[str] = []
        for f in reversed(traceback.extract_stack()[:-3]):
            if "/tierd/" in f.filename and "/tierd/meta/" not in f.filename:
                found.append(f"{f.filename.rsplit('/tierd/', 1)[1]}:{f.name}")
                if len(found) == 2:
                    break
        return " > ".join(reversed(found)) or "?"

    def install(self) -> None:
        begin, query = PgStore.begin, PgTxn._query
        census = self

        def counted_begin(store: PgStore, write: bool = False) -> Any:
            if threading.current_thread() is census.loop_thread:
                census.begins[("write " if write else "read ") + census._caller()] += 1
            return begin(store, write)

        def counted_query(txn: PgTxn, *a: Any, **kw: Any) -> Any:
            if threading.current_thread() is census.loop_thread:
                census.queries[census._caller()] += 1
            return query(txn, *a, **kw)

        PgStore.begin = counted_begin  # type: ignore[method-assign,assignment]
        PgTxn._query = counted_query  # type: ignore[method-assign,assignment]

    def report(self) -> dict[str, Any]:
        return {"sync_begins_on_loop": dict(self.begins.most_common()),
                "body_queries_on_loop": dict(self.queries.most_common())}


async def _run(url: str, args: argparse.Namespace, base: Path) -> dict[str, Any]:
    meta = MetaStore.open_pg(url, node="n1")
    ns = await open_namespace(meta, base)
    try:
        await ns.create_bucket(ROOT, BUCKET)
        for i in range(50):
            await ns.put_object(ROOT, BUCKET, f"seed/{i}", _body())
        out: dict[str, Any] = {}
        other = Other(url, args.other_every, args.other_hold)
        other.start()
        try:
            out["mixed"] = await _phase(ns, args.seconds, args.writers, args.readers, "mixed")
        finally:
            other.stop.set()
            other.join()
        out["mixed"]["other_node_lock_holds"] = other.held
        if args.census is not None:
            out["mixed"]["census"] = args.census.report()
            args.census.begins.clear()
            args.census.queries.clear()
        out["puts"] = await _phase(ns, args.seconds, args.writers, 0, "puts")
        if args.census is not None:
            out["puts"]["census"] = args.census.report()
        st = meta.engine.stat()
        out["engine"] = {k: st[k] for k in ("async_readers_max", "async_readers_peak",
                                            "begin_threads", "cache_hits", "cache_misses",
                                            "write_groups", "write_group_members")
                         if k in st}
        out["engine"]["remote"] = meta.engine.remote
        return out
    finally:
        await close_namespace(ns)
        meta.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--writers", type=int, default=8)
    ap.add_argument("--readers", type=int, default=8)
    ap.add_argument("--other-every", type=float, default=0.1)
    ap.add_argument("--other-hold", type=float, default=0.02)
    ap.add_argument("--census", action="store_true",
                    help="count what still waits on the network on the loop's thread")
    ap.add_argument("--sync", action="store_true",
                    help="begin and commit on the loop, as before tierd/meta/pg_async.py (the "
                         "baseline: PgStore.remote off)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.sync:
        PgStore.remote = False
    census = Census() if args.census else None
    if census is not None:
        census.install()
    bindir = find_bindir()
    if bindir is None:
        sys.exit("PostgreSQL is not installed")
    server = PgServer(bindir, fsync=True)
    try:
        with tempfile.TemporaryDirectory(prefix="tierd-lag-") as tmp:
            phases = asyncio.run(_run(server.url(tmp), argparse.Namespace(
                **{**vars(args), "census": census}), Path(tmp)))
    finally:
        server.stop()
    doc = {"bench": "loop_lag", "host": platform.node(), "cpus": os.cpu_count(),
           "load_avg": os.getloadavg(), "args": {k: str(v) for k, v in vars(args).items()},
           **phases}
    text = json.dumps(doc, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
