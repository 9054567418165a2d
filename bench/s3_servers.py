"""The servers an S3 benchmark talks to, each in its own process, and what is measured of a
process from outside: CPU seconds (user + sys, all threads) and resident memory.

* :func:`start_tierd` — ``tierd serve`` on a fresh data directory, root credentials known;
* :func:`start_moto` — moto's standalone server (``tests/moto_server.py``);
* :func:`start_static` — a plain aiohttp static-file server of a directory (GET, HEAD and
  ``Range`` with sendfile): the limit of serving bytes over HTTP from Python on this machine.
* :func:`start_null` — a server that does no work: it reads each request, discards the body
  and answers what an S3 client needs to go on (an ETag, an UploadId, the Complete XML).
  Nothing is stored, checked or made durable, so a client against it runs at the client's
  own ceiling on this machine: no server, tierd or any other, can be measured faster
  through the same client on the same cores.

``python bench/s3_servers.py static ROOT PORT`` / ``null PORT`` runs a server itself.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from moto_server import MotoServer  # noqa: E402

TIERD_KEY = "BENCHROOT"
TIERD_SECRET = "bench-root-secret-0123456789"
REGION = "us-east-1"
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _status(pid: int, name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(name)


def rss(pid: int) -> int:
    """Resident set size now, bytes."""
    return _status(pid, "VmRSS")


def peak_rss(pid: int) -> int:
    """The resident set's high-water mark (since start or :func:`reset_peak_rss`), bytes."""
    return _status(pid, "VmHWM")


def reset_peak_rss(pid: int) -> bool:
    """Reset the high-water mark to the current RSS (Linux ``clear_refs`` 5); False if the
    kernel does not allow it here."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """A running server process: its S3 endpoint and credentials."""

    name: str
    proc: subprocess.Popen[bytes] | None
    url: str
    key: str
    secret: str
    extra: dict[str, Any] = field(default_factory=dict)
    moto: MotoServer | None = None

    @property
    def pid(self) -> int:
        if self.moto is not None:
            assert self.moto._proc is not None
            return self.moto._proc.pid
        assert self.proc is not None
        return self.proc.pid

    def client(self, **cfg: Any) -> Any:
        import boto3
        from botocore.config import Config

        opts: dict[str, Any] = {"s3": {"addressing_style": "path"}, "signature_version": "s3v4",
                                "retries": {"max_attempts": 1}, "max_pool_connections": 32,
                                "connect_timeout": 10, "read_timeout": 120}
        opts.update(cfg)
        return boto3.client("s3", endpoint_url=self.url, aws_access_key_id=self.key,
                            aws_secret_access_key=self.secret, region_name=REGION,
                            config=Config(**opts))

    def stop(self) -> None:
        if self.moto is not None:
            self.moto.stop()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(15)


def start_tierd(data_dir: Path, *args: str, log: Path | None = None) -> Server:
    """``tierd serve`` on ``data_dir`` (created), S3 on a free loopback port."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
    env.update(TIERD_ROOT_ACCESS_KEY=TIERD_KEY, TIERD_ROOT_SECRET_KEY=TIERD_SECRET)
    data_dir.mkdir(parents=True, exist_ok=True)
    log = log or data_dir.parent / "tierd.log"
    cmd = [sys.executable, "-m", "tierd.cli", "serve", "--data-dir", str(data_dir),
           "--s3-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
           "--log-level", "warning", *args]
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                env=env, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"tierd exited with {proc.returncode}: {log.read_text()[-3000:]}")
        try:
            doc = json.loads((data_dir / "endpoints.json").read_text())
        except (FileNotFoundError, ValueError):
            doc = {}
        if doc.get("pid") == proc.pid:
            return Server("tierd", proc, doc["s3"]["url"], TIERD_KEY, TIERD_SECRET,
                          {"log": str(log)})
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"tierd did not start: {log.read_text()[-3000:]}")


def start_moto() -> Server:
    from moto_server import ACCESS_KEY, SECRET_KEY

    m = MotoServer().start()
    return Server("moto", None, m.url, ACCESS_KEY, SECRET_KEY, moto=m)


def start_static(root: Path) -> Server:
    """The aiohttp static-file server of ``root`` (``GET /bucket/key`` is the file
    ``root/bucket/key``).  It ignores signatures, so any credentials do."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "static", str(root), str(port)],
                            stdin=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the static server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=1):
                pass
            return Server("static", proc, url, "any", "any")
        except urllib.error.HTTPError:
            return Server("static", proc, url, "any", "any")
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the static server did not start")


def _serve_static(root: str, port: int) -> None:
    from aiohttp import web

    app = web.Application()
    app.router.add_static("/", root, follow_symlinks=False)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def start_null() -> Server:
    """The do-nothing server (:func:`_serve_null`); it ignores signatures."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "null", str(port)],
                            stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the null server exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return Server("null", proc, f"http://127.0.0.1:{port}", "any", "any")
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the null server did not start")


_NULL_ETAG = b'"d41d8cd98f00b204e9800998ecf8427e"'


def _null_reply(method: bytes, target: bytes) -> bytes:
    """The response to one request: a fixed ETag for PUTs and parts, the XML documents
    multipart clients parse, 200 with no body for the rest."""
    query = target.partition(b"?")[2]
    body = b""
    if method == b"POST" and query.startswith(b"uploads"):
        body = (b'<?xml version="1.0" encoding="UTF-8"?><InitiateMultipartUploadResult>'
                b"<Bucket>b</Bucket><Key>k</Key><UploadId>null-upload</UploadId>"
                b"</InitiateMultipartUploadResult>")
    elif method == b"POST" and b"uploadId=" in query:
        body = (b'<?xml version="1.0" encoding="UTF-8"?><CompleteMultipartUploadResult>'
                b"<Bucket>b</Bucket><Key>k</Key><ETag>&quot;0-1&quot;</ETag>"
                b"</CompleteMultipartUploadResult>")
    return (b"HTTP/1.1 200 OK\r\nServer: null\r\nETag: " + _NULL_ETAG +
            b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def _serve_null(port: int) -> None:
    """HTTP/1.1 with keep-alive, ``Content-Length`` bodies and ``Expect: 100-continue``
    (what boto3 sends over plain HTTP), as little Python per request as it takes."""
    import asyncio

    class Null(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.t = transport
            self.buf = b""
            self.left = 0  # body bytes still to discard
            self.reply = b""

        def data_received(self, data: bytes) -> None:
            while data:
                if self.left:
                    n = min(self.left, len(data))
                    self.left -= n
                    data = data[n:]
                    if not self.left:
                        self.t.write(self.reply)
                    continue
                self.buf += data
                data = b""
                head, sep, rest = self.buf.partition(b"\r\n\r\n")
                if not sep:
                    return
                self.buf = b""
                lines = head.split(b"\r\n")
                method, target, _ = lines[0].split(b" ", 2)
                length, expect = 0, False
                for line in lines[1:]:
                    name, _, value = line.partition(b":")
                    name = name.strip().lower()
                    if name == b"content-length":
                        length = int(value)
                    elif name == b"expect":
                        expect = True
                self.reply = _null_reply(method, target)
                if expect and length:
                    self.t.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                self.left = length
                if not length:
                    self.t.write(self.reply)
                data = rest

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Null, "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "static":
        _serve_static(sys.argv[2], int(sys.argv[3]))
    elif len(sys.argv) == 3 and sys.argv[1] == "null":
        _serve_null(int(sys.argv[2]))
    else:
        sys.exit("usage: s3_servers.py static ROOT PORT | null PORT")
