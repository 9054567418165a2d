"""Bodies stream end to end: eight concurrent large PUTs, then eight concurrent GETs of
them, keep the daemon's resident memory under the issue's 300 MiB.

Each PUT is one request whose body is sent from a file as fast as the socket takes it
(presigned URL, ``UNSIGNED-PAYLOAD``), each GET one stream read into a reused buffer, so
the client adds no pacing of its own: whatever the daemon buffered would show.  The peak is
the kernel's high-water mark of the daemon's RSS (reset just before each phase), sampled
too in case the kernel does not allow the reset.  The objects are 256 MiB here (the buffers
do not grow with the object: a body is received, hashed and written piece by piece); the
benchmark (bench/s3_bench.py, ``rss``) measures the same with 1 GiB objects.
"""

from __future__ import annotations

import http.client
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from .conftest import Daemon, add_user_key, start_daemon

MiB = 1 << 20
STREAMS = 8
SIZE = 256 * MiB
LIMIT = 300 * MiB


def _status(pid: int, name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(name)


def _conn(url: str) -> tuple[http.client.HTTPConnection, str]:
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname or "", u.port, timeout=120,
                                      blocksize=MiB)
    return conn, f"{u.path}?{u.query}"


def _put(url: str, path: Path) -> None:
    conn, target = _conn(url)
    try:
        with open(path, "rb") as f:
            conn.request("PUT", target, body=f, headers={"Content-Length": str(SIZE)})
        r = conn.getresponse()
        assert r.status == 200, r.read()[:500]
        r.read()
    finally:
        conn.close()


def _get(url: str) -> None:
    conn, target = _conn(url)
    buf = bytearray(MiB)
    got = 0
    try:
        conn.request("GET", target)
        r = conn.getresponse()
        assert r.status == 200, r.read()[:500]
        while n := r.readinto(buf):
            got += n
    finally:
        conn.close()
    assert got == SIZE


def _peak_during(pid: int, work: Callable[[], None]) -> int:
    """The daemon's peak RSS while ``work`` runs."""
    reset = True
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        reset = False
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(_status(pid, "VmRSS"))
            time.sleep(0.01)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        work()
    finally:
        stop.set()
        t.join()
    peak = max([*samples, _status(pid, "VmRSS")])
    return max(peak, _status(pid, "VmHWM")) if reset else peak


def _parallel(fn: Callable[[int], None]) -> None:
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            fn(i)
        except BaseException as e:
            errors.append(e)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(STREAMS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon of its own, so nothing else it did counts in its memory."""
    data_dir = tmp_path_factory.mktemp("s3mem") / "data"
    add_user_key(data_dir, "UNUSED", "unused-secret-0123456789", 1000, "unused")
    d = start_daemon(data_dir)
    yield d
    d.stop()


def test_concurrent_large_puts_and_gets_stay_under_300_mib(fresh: Daemon,
                                                            tmp_path: Path) -> None:
    s3: Any = fresh.client()
    s3.create_bucket(Bucket="mem")
    src = tmp_path / "src.bin"
    with open(src, "wb") as f:
        block = os.urandom(16 * MiB)
        for _ in range(SIZE // len(block)):
            f.write(block)
    put_urls = [s3.generate_presigned_url("put_object", Params={"Bucket": "mem", "Key": f"o{i}"},
                                          ExpiresIn=600) for i in range(STREAMS)]
    get_urls = [s3.generate_presigned_url("get_object", Params={"Bucket": "mem", "Key": f"o{i}"},
                                          ExpiresIn=600) for i in range(STREAMS)]
    pid = fresh.proc.pid
    before = _status(pid, "VmRSS")
    put_peak = _peak_during(pid, lambda: _parallel(lambda i: _put(put_urls[i], src)))
    sizes = {s3.head_object(Bucket="mem", Key=f"o{i}")["ContentLength"] for i in range(STREAMS)}
    assert sizes == {SIZE}
    get_peak = _peak_during(pid, lambda: _parallel(lambda i: _get(get_urls[i])))
    report = (f"RSS before {before / MiB:.0f} MiB, peak during {STREAMS} PUTs "
              f"{put_peak / MiB:.0f} MiB, during {STREAMS} GETs {get_peak / MiB:.0f} MiB")
    print(report)
    assert put_peak < LIMIT and get_peak < LIMIT, report
