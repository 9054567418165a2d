"""The status page (``GET /`` on the admin listener) in a real headless Chromium.

A daemon with a cold store on its own moto server gets a bucket and an object through S3,
a warmup job through the admin API and a checkpoint through the SDK.  Chromium, driven over
the DevTools protocol, logs in with ``/?token=READ_TOKEN``, and the page must show what
``/v1/status`` says (buckets, inodes, requests per door, the hot tier's fill, cold
reachable), the job and the checkpoint run; the session cookie is HttpOnly and
SameSite=Strict and cannot change anything.  A screenshot is checked where it matters: the
cold-store line is drawn in green and the hot tier's bar in blue.  Then the cold store is
stopped: after a failed upload the page says UNREACHABLE, in red.

Chromium comes from Debian's ``chromium`` package (``./dev.sh test`` installs it); the
browser tests skip, saying so, only where it is not installed.  The token rules without a
browser (read-only token, cookie, login form) are checked over plain HTTP.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from moto_server import MotoServer

from .conftest import Admin, start_admin

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (Debian package 'chromium'; "
    "./dev.sh test installs it)")
#: the flags a browser needs on a machine without a display or outside network
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-port=0", "about:blank"]
#: the page's colours (tierd/admin/page.py): ok text, bad text, a bar's fill
GREEN, RED, BLUE = (0x1F, 0x8A, 0x4C), (0xC5, 0x30, 0x30), (0x3B, 0x6F, 0xD8)
BUCKET, OBJECT_SIZE = "page-data", 24 << 20


# -- the daemon -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, own_moto: MotoServer
           ) -> Iterator[Admin]:
    own_moto.client().create_bucket(Bucket="cold")
    a = start_admin(tmp_path_factory.mktemp("page") / "data", *own_moto.tierd_args("s3://cold/t"),
                    "--cold-s3-max-attempts", "1", "--persist-delay", "0",
                    "--hot-capacity", "64MiB", "--pool-capacity", "64MiB")
    yield a
    a.d.stop()
    assert "Traceback" not in a.log(), a.log()[-5000:]


def read_token(a: Admin) -> str:
    return (a.data / "read-token").read_text().strip()


def wait_for(what: str, check: Any, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return value


@pytest.fixture(scope="module")
def busy(daemon: Admin) -> Admin:
    """A bucket and an object written through S3 and persisted, a finished warmup job, a
    checkpoint run with one step."""
    s3 = daemon.d.client()
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key="shard-0", Body=os.urandom(OBJECT_SIZE))
    status, job = daemon.call("POST", "/v1/jobs", {"kind": "warmup", "prefix": f"{BUCKET}/"})
    assert status == 202, job
    wait_for("the job", lambda: daemon.call("GET", f"/v1/jobs/{job['id']}")[1]["state"]
             == "done")
    save = ("import torch\nfrom tierd_client.checkpoint import Checkpointer\n"
            "with Checkpointer() as ck:\n"
            "    ck.save('page-run', 3, {'w': torch.ones(1024)})\n"
            "    ck.wait_persisted('page-run', 3, timeout=60)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
    done = subprocess.run([sys.executable, "-c", save], env={**env, "TIERD_DATA_DIR": str(
        daemon.data)}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    wait_for("persistence", lambda: daemon.call("GET", "/v1/status")[1]["placement"]
             ["dirty"]["bytes"] == 0)
    return daemon


# -- Chromium over the DevTools protocol ---------------------------------------------------

class Page:
    """One tab of a headless Chromium, driven over the DevTools protocol (a websocket)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws, self.next_id = ws, 0

    async def call(self, method: str, **params: Any) -> Any:
        self.next_id += 1
        await self.ws.send_json({"id": self.next_id, "method": method, "params": params})
        while True:  # events arrive in between; they are not needed here
            msg = await asyncio.wait_for(self.ws.receive_json(), 30)
            if msg.get("id") == self.next_id:
                assert "error" not in msg, f"{method}: {msg['error']}"
                return msg["result"]

    async def js(self, expression: str) -> Any:
        res = await self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                              awaitPromise=True)
        assert "exceptionDetails" not in res, res["exceptionDetails"]
        return res["result"].get("value")

    async def until(self, expression: str, timeout: float = 30) -> Any:
        deadline = time.monotonic() + timeout
        while not (value := await self.js(expression)):
            assert time.monotonic() < deadline, f"never true in the page: {expression}"
            await asyncio.sleep(0.2)
        return value

    async def screenshot(self) -> bytes:
        res = await self.call("Page.captureScreenshot", format="png")
        return base64.b64decode(res["data"])


@contextlib.asynccontextmanager
async def chromium() -> AsyncIterator[Page]:
    assert CHROMIUM is not None
    with tempfile.TemporaryDirectory(prefix="tierd-chromium-",
                                     ignore_cleanup_errors=True) as profile:
        proc = await asyncio.create_subprocess_exec(
            CHROMIUM, f"--user-data-dir={profile}", *FLAGS, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            port_file = Path(profile) / "DevToolsActivePort"
            deadline = time.monotonic() + 60
            while not port_file.exists() or not port_file.read_text().strip():
                assert proc.returncode is None, "chromium exited at start"
                assert time.monotonic() < deadline, "chromium did not open its DevTools port"
                await asyncio.sleep(0.1)
            port = port_file.read_text().split()[0]
            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{port}/json/list") as r:
                    tabs = await r.json()
                url = next(t["webSocketDebuggerUrl"] for t in tabs if t["type"] == "page")
                async with http.ws_connect(url, max_msg_size=64 << 20) as ws:
                    page = Page(ws)
                    await page.call("Page.enable")
                    await page.call("Network.enable")
                    await page.call("Emulation.setDeviceMetricsOverride", width=1280,
                                    height=1100, deviceScaleFactor=1, mobile=False)
                    yield page
        finally:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


# -- PNG reading (no imaging library needed) ------------------------------------------------

def png_pixels(data: bytes) -> tuple[int, int, list[bytes], int]:
    """(width, height, rows of raw pixels, bytes per pixel) of an 8-bit RGB/RGBA PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, ihdr = 8, b"", b""
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            ihdr = chunk
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + n
    width, height, depth, color = struct.unpack(">IIBB", ihdr[:10])
    assert depth == 8 and color in (2, 6), (depth, color)
    bpp = 3 if color == 2 else 4
    raw, stride, rows = zlib.decompress(idat), width * bpp, []
    prev = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + b) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)
                           ) & 0xFF
        rows.append(bytes(line))
        prev = line
    return width, height, rows, bpp


def colours_in(png: bytes, box: dict[str, float]) -> set[tuple[int, int, int]]:
    """The colours of the screenshot's pixels inside a CSS-pixel box (device scale 1)."""
    _, height, rows, bpp = png_pixels(png)
    out: set[tuple[int, int, int]] = set()
    for y in range(int(box["top"]), min(height, int(box["bottom"]))):
        row = rows[y]
        for x in range(int(box["left"]), int(box["right"])):
            r, g, b = row[x * bpp:x * bpp + 3]
            out.add((r, g, b))
    return out


def near(colours: set[tuple[int, int, int]], want: tuple[int, int, int], tol: int = 24
         ) -> bool:
    return any(all(abs(c - w) <= tol for c, w in zip(got, want, strict=True))
               for got in colours)


BOX = ("(() => {{ const r = document.querySelector({sel!r}).getBoundingClientRect(); "
       "return {{left: r.left, top: r.top, right: r.right, bottom: r.bottom}}; }})()")
TEXTS = """(() => {
  const t = (sel) => { const e = document.querySelector(sel); return e && e.textContent; };
  return {buckets: t('#buckets'), inodes: t('#inodes'), version: t('#version'),
          cold: t('#cold-state'), coldUrl: t('#cold-url'),
          hot: [...document.querySelectorAll('#tiers tr[data-tier="hot"] td')]
                 .map((td) => td.textContent),
          hotFill: document.querySelector('#tiers tr[data-tier="hot"] .bar').dataset.fraction,
          doors: Object.fromEntries([...document.querySelectorAll('#requests tr')].map(
                 (tr) => [tr.dataset.door, Number(tr.children[1].textContent)])),
          jobs: [...document.querySelectorAll('#jobs tr')].map((tr) => tr.textContent),
          ckpts: [...document.querySelectorAll('#ckpts tr')].map((tr) => tr.textContent),
          queue: t('#queue-depth'), pool: t('#pool'), path: location.pathname + location.search,
          cookie: document.cookie};
})()"""
READY = "document.body && document.body.dataset.state === 'ready'"


# -- the tests ------------------------------------------------------------------------------

@needs_chromium
async def test_page_shows_the_daemon_and_changes_nothing(busy: Admin, tmp_path: Path) -> None:
    token = read_token(busy)
    async with chromium() as page:
        await page.call("Page.navigate", url=f"{busy.url}/?token={token}")
        await page.until(READY)
        shown = await page.js(TEXTS)
        status = busy.call("GET", "/v1/status")[1]
        # the redirect took the token out of the address bar; the cookie is not script's
        assert shown["path"] == "/" and shown["cookie"] == ""
        assert shown["version"] == status["version"]
        assert shown["buckets"] == str(status["buckets"]) == "2"  # page-data, checkpoints
        assert int(shown["inodes"]) >= 4
        assert shown["cold"] == "reachable" and shown["coldUrl"].startswith("s3://cold/t")
        assert shown["hot"][0] == "hot" and shown["hot"][2] == "64.0 MiB"
        assert 0.3 < float(shown["hotFill"]) < 0.8  # the 24 MiB object on a 64 MiB tier
        assert shown["doors"]["s3"] >= 2 and shown["doors"]["admin"] >= 3
        assert shown["queue"] == "0 files"
        assert "of 64.0 MiB used" in shown["pool"]
        assert len(shown["jobs"]) == 1 and "warmup" in shown["jobs"][0]
        assert f"{BUCKET}/" in shown["jobs"][0] and "done" in shown["jobs"][0]
        assert shown["ckpts"] and "checkpoints/page-run" in shown["ckpts"][0]
        assert "persisted" in shown["ckpts"][0]

        cookies = (await page.call("Network.getCookies", urls=[busy.url]))["cookies"]
        [cookie] = [c for c in cookies if c["name"] == "tierd_read"]
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert cookie["value"] == token  # the read-only token, never the admin one
        # the session may read, never change: a mutation from the page's own origin
        refused = await page.js("fetch('/v1/jobs', {method: 'POST', body: JSON.stringify("
                                "{kind: 'evict', prefix: 'page-data/'})}).then((r) => r.status)")
        assert refused == 403
        assert await page.js("fetch('/v1/users').then((r) => r.status)") == 403
        assert busy.call("GET", "/v1/jobs")[1]["jobs"][0]["kind"] == "warmup"

        # the page redraws itself every few seconds: a screenshot counts only when the boxes
        # measured before and after it agree (no redraw moved them in between)
        sels = ("#cold-state", '#tiers tr[data-tier="hot"] .bar')
        for _ in range(5):
            boxes = [await page.js(BOX.format(sel=sel)) for sel in sels]
            png = await page.screenshot()
            if boxes == [await page.js(BOX.format(sel=sel)) for sel in sels]:
                break
        (tmp_path / "status-page.png").write_bytes(png)
        width, height, rows, _ = png_pixels(png)
        assert (width, height) == (1280, 1100)
        assert len(set(rows)) > 100, "the screenshot is (nearly) blank"
        green = colours_in(png, boxes[0])
        assert near(green, GREEN) and not near(green, RED)
        bar = colours_in(png, boxes[1])
        assert near(bar, BLUE)
        header = colours_in(png, {"left": 0, "top": 0, "right": 1280, "bottom": 4})
        assert header == {(0x1D, 0x23, 0x30)}


@needs_chromium
async def test_page_shows_the_cold_store_unreachable(busy: Admin, own_moto: MotoServer) -> None:
    async with chromium() as page:
        await page.call("Page.navigate", url=f"{busy.url}/?token={read_token(busy)}")
        await page.until(READY)
        assert await page.js("document.querySelector('#cold-state').textContent") == "reachable"
        own_moto.stop()
        busy.d.client().put_object(Bucket=BUCKET, Key="while-down", Body=b"x" * 1000)
        # the page redraws by itself every 5 s
        await page.until("document.querySelector('#cold-state').textContent"
                         ".startsWith('UNREACHABLE')", timeout=60)
        assert busy.call("GET", "/v1/status")[1]["placement"]["cold"]["reachable"] is False
        png = await page.screenshot()
        red = colours_in(png, await page.js(BOX.format(sel="#cold-state")))
        assert near(red, RED) and not near(red, GREEN)
        assert await page.js("document.querySelector('#queue-depth').textContent") != "0 files"


@needs_chromium
async def test_login_form_in_the_browser(daemon: Admin) -> None:
    """Without a session the page is the login form; the admin token typed into it gives a
    read-only session (the cookie holds the read-only token)."""
    async with chromium() as page:
        await page.call("Page.navigate", url=daemon.url + "/")
        await page.until("document.readyState === 'complete' && document.forms.length === 1")
        assert await page.js("document.body.dataset.state") == "loading"
        assert await page.js("document.querySelector('#tiers')") is None
        await page.js(f"document.querySelector('input[name=token]').value = {daemon.token!r};"
                      " document.forms[0].submit(); true")
        await page.until(READY)
        cookies = (await page.call("Network.getCookies", urls=[daemon.url]))["cookies"]
        assert [c["value"] for c in cookies if c["name"] == "tierd_read"] == [
            read_token(daemon)]
        assert await page.js("fetch('/v1/keys').then((r) => r.status)") == 403


def http(a: Admin, method: str, path: str, *, headers: dict[str, str] | None = None,
         body: bytes | None = None) -> tuple[int, dict[str, str], str]:
    """(status, headers, body) without following redirects."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any) -> None:
            return None

    req = urllib.request.Request(a.url + path, method=method, data=body,
                                 headers=headers or {})
    try:
        with urllib.request.build_opener(NoRedirect).open(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def test_read_token_reads_and_never_changes(daemon: Admin) -> None:
    token = read_token(daemon)
    assert (daemon.data / "read-token").stat().st_mode & 0o777 == 0o600
    assert token != daemon.token and len(token) >= 32
    for how in ({"Authorization": f"Bearer {token}"}, {"Cookie": f"tierd_read={token}"}):
        for path in ("/v1/status", "/v1/tiers", "/v1/jobs", "/v1/ckpt", "/v1/pool",
                     "/metrics", "/"):
            assert http(daemon, "GET", path, headers=how)[0] == 200, (how, path)
        for method, path in (("GET", "/v1/users"), ("GET", "/v1/keys"),
                             ("GET", "/v1/buckets"), ("GET", "/v1/openapi.json"),
                             ("POST", "/v1/jobs"), ("PUT", "/v1/placement/policy"),
                             ("POST", "/v1/placement/evict"), ("DELETE", "/v1/jobs/x"),
                             ("PUT", "/v1/pool/quota/0"), ("POST", "/v1/users")):
            status, _, body = http(daemon, method, path, headers=how, body=b"{}")
            assert status == 403 and json.loads(body)["error"] == "forbidden", (how, path)
    # a cookie holding the admin token is no session: cookies are read-only by design
    assert http(daemon, "GET", "/v1/status",
                headers={"Cookie": f"tierd_read={daemon.token}"})[0] == 401


def test_login_routes(daemon: Admin) -> None:
    token = read_token(daemon)
    status, hdrs, body = http(daemon, "GET", "/")
    assert status == 401 and 'action="/login"' in body and "read-token" in body
    assert hdrs["Content-Type"].startswith("text/html")
    assert "script-src 'sha256-" in hdrs["Content-Security-Policy"]
    # the read-only token in a link: a redirect to / with the session cookie
    status, hdrs, _ = http(daemon, "GET", f"/?token={token}")
    assert status == 303 and hdrs["Location"] == "/"
    assert hdrs["Set-Cookie"].startswith(f"tierd_read={token};")
    assert "HttpOnly" in hdrs["Set-Cookie"] and "SameSite=Strict" in hdrs["Set-Cookie"]
    # the admin token is never taken from a URL, and no cookie comes back for it
    status, hdrs, body = http(daemon, "GET", f"/?token={daemon.token}")
    assert status == 400 and "Set-Cookie" not in hdrs and "never taken from a URL" in body
    status, hdrs, body = http(daemon, "GET", "/?token=wrong-token-wrong-token")
    assert status == 401 and "Set-Cookie" not in hdrs and "wrong" in body
    # the form: either token gives the read-only session; a wrong one the form again
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    for given in (token, daemon.token):
        status, hdrs, _ = http(daemon, "POST", "/login", headers=form,
                               body=f"token={given}".encode())
        assert status == 303 and hdrs["Set-Cookie"].startswith(f"tierd_read={token};")
    status, hdrs, body = http(daemon, "POST", "/login", headers=form, body=b"token=nope")
    assert status == 401 and "Set-Cookie" not in hdrs and 'action="/login"' in body
    # with the admin token as a header, GET / is the page itself
    status, _, body = http(daemon, "GET", "/",
                           headers={"Authorization": f"Bearer {daemon.token}"})
    assert status == 200 and 'id="tiers"' in body
    # neither token is logged; the refusals are
    log = daemon.log()
    assert token not in log and daemon.token not in log
    assert "status page login refused" in log


def test_read_token_survives_a_restart(tmp_path: Path) -> None:
    a = start_admin(tmp_path / "data")
    try:
        first = read_token(a)
    finally:
        a.d.stop()
    (tmp_path / "data" / "read-token").chmod(0o644)
    b = start_admin(tmp_path / "data")
    try:
        assert read_token(b) == first
        assert (b.data / "read-token").stat().st_mode & 0o777 == 0o600  # mode repaired
        assert http(b, "GET", "/v1/status",
                    headers={"Authorization": f"Bearer {first}"})[0] == 200
    finally:
        b.d.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_read_token_mode_is_repaired_on_a_full_disk(tmp_path: Path) -> None:
    """Start-up on a full disk (a real full tmpfs): the read-only token's mode is repaired
    by a chmod, as the admin token's is, not by a rewrite that fails with ENOSPC."""
    from tierd.admin.auth import bootstrap_read_token

    where = tmp_path / "full"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(where)],
                   check=True)
    try:
        token = "r" * 43
        (where / "read-token").write_text(token + "\n")
        (where / "read-token").chmod(0o644)
        with open(where / "filler", "wb", buffering=0) as f, contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 4096)
        with pytest.raises(OSError):  # the disk is really full
            (where / "probe").write_bytes(b"x" * 4096)
        assert bootstrap_read_token(where) == token
        assert (where / "read-token").stat().st_mode & 0o777 == 0o600
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
