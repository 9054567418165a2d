"""The peer data door's throughput over loopback: one node reads a file another node holds.

A door (tierd/peer/door.py) on 127.0.0.1 serves a file of ``--mib`` MiB: ``file`` reads it
with ``os.pread`` in a worker thread and answers the bytes, ``sendfile`` answers an open
descriptor (a ``FileSlice``: sent by ``sendfile(2)``), ``memory`` answers slices of a
buffer; a client (tierd/peer/client.py) reads it whole in ``--chunk-mib`` requests, one at
a time and with ``--parallel`` requests in flight, and checks every byte.  The registry is
an in-memory metadata store (one lookup per node a second: not what is measured).
``MB_per_s`` is wall-clock throughput (it depends on how busy the machine is);
``MB_per_cpu_s`` divides by the CPU time this process spent (client and server together),
the figure that stays put on a shared machine.  Prints one JSON document; ``--out FILE``
writes it there too.

    .venv/bin/python bench/peer_door.py --mib 256 --chunk-mib 4 --out bench/results/peer_door.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from tierd.config_parsers import HostPort
from tierd.meta.store import MetaStore
from tierd.peer.client import PeerClient
from tierd.peer.door import PeerDoor
from tierd.peer.server import FileSlice, LocalReader

SECRET = "bench-secret-of-the-cluster"


async def _read_all(client: PeerClient, payload: bytes, chunk: int, parallel: int) -> None:
    """Read the whole file, ``parallel`` requests in flight, comparing every chunk with
    what the door serves (a memcmp: no copy, no hash inside the timed loop)."""
    view = memoryview(payload)
    offsets = list(range(0, len(payload), chunk))
    sem = asyncio.Semaphore(parallel)

    async def one(off: int) -> None:
        async with sem:
            data = await client.read("n1", 7, 1, off, chunk)
        if data != view[off:off + chunk]:
            raise SystemExit(f"peer read at {off} returned other bytes")

    await asyncio.gather(*(one(o) for o in offsets))


async def _run(size: int, chunk: int, parallel: int, source: str, rounds: int) -> dict[str, object]:
    payload = os.urandom(size)
    with tempfile.TemporaryDirectory(prefix="tierd-peer-bench-") as tmp:
        path = Path(tmp) / "hot"
        path.write_bytes(payload)
        fd = os.open(path, os.O_RDONLY)

        async def from_file(ino: int, version: int, offset: int, length: int) -> bytes:
            return await asyncio.to_thread(os.pread, fd, length, offset)

        async def from_memory(ino: int, version: int, offset: int, length: int) -> memoryview:
            return memoryview(payload)[offset:offset + length]

        async def by_sendfile(ino: int, version: int, offset: int, length: int) -> FileSlice:
            return FileSlice(os.open(path, os.O_RDONLY), offset,
                             max(0, min(length, size - offset)))

        readers: dict[str, LocalReader] = {"file": from_file, "memory": from_memory,
                                           "sendfile": by_sendfile}
        meta = MetaStore.open_memory()
        door = PeerDoor(node="n1", secret=SECRET, listen=HostPort("127.0.0.1", 0), meta=meta,
                        reader=readers[source])
        await door.start()
        client = PeerClient("n2", SECRET, meta)
        results: dict[str, object] = {}
        try:
            await client.read("n1", 7, 1, 0, 1)  # connect once
            for p in sorted({1, parallel}):
                best = best_cpu = 0.0
                for _ in range(rounds):
                    t0, c0 = time.perf_counter(), time.process_time()
                    await _read_all(client, payload, chunk, p)
                    dt, dc = time.perf_counter() - t0, time.process_time() - c0
                    best = max(best, size / dt / 1e6)
                    best_cpu = max(best_cpu, size / max(dc, 1e-9) / 1e6)
                results[f"MB_per_s_parallel_{p}"] = round(best, 1)
                # bytes per second of CPU (both ends are in this process): what the door
                # would move with a core each for client and server, whatever the load
                results[f"MB_per_cpu_s_parallel_{p}"] = round(best_cpu, 1)
        finally:
            await client.close()
            await door.stop()
            os.close(fd)
            meta.close()
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--chunk-mib", type=int, default=4)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3, help="best of this many reads")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    doc: dict[str, object] = {
        "what": f"read {a.mib} MiB through the peer door in {a.chunk_mib} MiB requests, "
                "127.0.0.1, best of rounds, bytes checked",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }
    for source in ("file", "sendfile", "memory"):
        doc[source] = asyncio.run(_run(a.mib << 20, a.chunk_mib << 20, a.parallel, source,
                                       a.rounds))
    text = json.dumps(doc, indent=2)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
