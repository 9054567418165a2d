"""The status page: ``GET /`` on the admin listener, for people with a browser.

One HTML document with its CSS and script inline (no build step, nothing fetched from
elsewhere): the script reads the admin API's own JSON documents -- ``/v1/status``,
``/v1/tiers``, ``/v1/jobs``, ``/v1/ckpt`` -- and redraws every 5 seconds.  The page shows
what ``tierctl status`` shows (tiers and their fill, dirty bytes and the persist queue,
cold-store reachability, requests per door, the memory pool) plus recent jobs and
checkpoint runs.  It changes nothing: it only issues GETs.

**Who may look** (:mod:`tierd.admin.auth`): a request with the admin token or the
read-only token (``DATA_DIR/read-token``) as ``Authorization: Bearer``, or a browser
holding the session cookie.  A browser gets the cookie by logging in: the form at ``/``
posts a token to ``POST /login`` (the body is never logged), or ``/?token=READ_TOKEN``
once (a link to hand out; answered by a redirect to ``/`` so the token leaves the address
bar).  Either way the cookie holds the **read-only** token -- HttpOnly (page scripts cannot
read it), SameSite=Strict (other sites cannot make the browser send it) -- so a browser
session can never change anything, even after logging in with the admin token.  The admin
token is refused in a URL: URLs end up in proxy logs and browser history.

The read-only token is loaded (or created) from the data directory when the admin
listener starts, in a worker thread; until then, or if it cannot be written, a random one
held in memory serves the sessions.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import html
from pathlib import Path

from aiohttp import web

from tierd.admin.auth import (
    IDENTITY,
    READ_COOKIE,
    READ_TOKEN_FILE,
    AdminAuth,
    bootstrap_read_token,
)
from tierd.admin.backend import AUTH, BACKEND
from tierd.logs import get_logger, kv

log = get_logger("admin")

#: the page's routes (HTML for browsers, not part of the JSON API's OpenAPI document)
PAGE_PATHS = frozenset({"/", "/login"})
#: seconds between two redraws of the page
REFRESH_S = 5

_STYLE = """
:root { --fg: #1d2330; --dim: #6b7385; --bg: #f4f5f8; --card: #fff; --line: #e1e4ea;
        --ok: #1f8a4c; --warn: #b7791f; --bad: #c53030; --bar: #3b6fd8; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif;
       color: var(--fg); background: var(--bg); }
header { display: flex; flex-wrap: wrap; gap: 4px 24px; align-items: baseline;
         padding: 14px 24px; background: #1d2330; color: #fff; }
header h1 { margin: 0; font-size: 20px; }
header span { color: #c5cad6; }
main { display: grid; grid-template-columns: repeat(auto-fit, minmax(420px, 1fr));
       gap: 16px; padding: 16px 24px; }
section { background: var(--card); border: 1px solid var(--line); border-radius: 8px;
          padding: 12px 16px; }
section.wide { grid-column: 1 / -1; }
h2 { margin: 0 0 8px; font-size: 15px; }
table { width: 100%; border-collapse: collapse; }
th, td { text-align: left; padding: 4px 8px 4px 0; border-bottom: 1px solid var(--line);
         vertical-align: middle; white-space: nowrap; }
th { color: var(--dim); font-weight: 600; font-size: 12px; }
td.num { font-variant-numeric: tabular-nums; }
.bar { position: relative; width: 160px; height: 12px; background: var(--line);
       border-radius: 6px; overflow: hidden; display: inline-block; vertical-align: middle; }
.bar > i { position: absolute; left: 0; top: 0; bottom: 0; background: var(--bar); }
.bar.warn > i { background: var(--warn); } .bar.bad > i { background: var(--bad); }
.ok { color: var(--ok); font-weight: 600; } .bad { color: var(--bad); font-weight: 700; }
.warn { color: var(--warn); font-weight: 600; } .dim { color: var(--dim); }
dl.below { margin-top: 8px; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px; margin: 0; }
dt { color: var(--dim); } dd { margin: 0; font-variant-numeric: tabular-nums; }
#banner { display: none; margin: 16px 24px 0; padding: 8px 12px; border-radius: 6px;
          background: #fde8e8; color: var(--bad); }
footer { padding: 0 24px 16px; color: var(--dim); font-size: 12px; }
form { display: flex; gap: 8px; margin-top: 12px; }
input[type=password] { flex: 1; padding: 6px 8px; font: inherit; }
"""

_SCRIPT = """
"use strict";
const REFRESH = @REFRESH@ * 1000;
const $ = (id) => document.getElementById(id);
function bytes(n) {
  if (n === null || n === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return i === 0 ? n.toFixed(0) + " B" : n.toFixed(1) + " " + units[i];
}
function dur(s) {
  s = Math.floor(s); const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600);
  const m = Math.floor(s % 3600 / 60), parts = [];
  if (d) parts.push(d + "d"); if (h) parts.push(h + "h"); if (m) parts.push(m + "m");
  parts.push(s % 60 + "s"); return parts.slice(0, 3).join(" ");
}
function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}
function bar(used, cap) {
  const frac = cap > 0 ? Math.min(1, used / cap) : 0;
  const b = el("span", null, "bar" + (frac >= 0.95 ? " bad" : frac >= 0.8 ? " warn" : ""));
  const i = el("i"); i.style.width = (frac * 100).toFixed(1) + "%"; b.appendChild(i);
  b.title = (frac * 100).toFixed(1) + "%"; b.dataset.fraction = frac.toFixed(4);
  return b;
}
function row(cells, attrs) {
  const tr = document.createElement("tr");
  for (const c of cells) {
    const td = document.createElement("td");
    if (c instanceof Node) td.appendChild(c);
    else if (c && typeof c === "object") { td.textContent = c.text; td.className = c.cls; }
    else td.textContent = c === null || c === undefined ? "-" : String(c);
    tr.appendChild(td);
  }
  for (const [k, v] of Object.entries(attrs || {})) tr.dataset[k] = v;
  return tr;
}
function fill(id, rows, empty) {
  const body = $(id); body.replaceChildren(...rows);
  if (!rows.length) body.appendChild(row([{text: empty, cls: "dim"}]));
}
function set(id, text, cls) { const e = $(id); e.textContent = text; e.className = cls || ""; }
async function get(path) {
  const r = await fetch(path, {credentials: "same-origin", cache: "no-store",
                               headers: {Accept: "application/json"}});
  if (r.status === 401) throw new Error("the session ended: reload the page to log in again");
  if (r.status === 503 || r.status === 404) return null;  // that part is not running
  if (!r.ok) throw new Error(path + ": HTTP " + r.status);
  return r.json();
}
let last = null;
function rates(st) {
  const now = performance.now(), out = {};
  if (last) {
    const dt = (now - last.t) / 1000;
    for (const [door, n] of Object.entries(st.requests || {}))
      out[door] = dt > 0 ? Math.max(0, (n - (last.req[door] || 0)) / dt) : 0;
  }
  last = {t: now, req: Object.assign({}, st.requests || {})};
  return out;
}
function drawHeader(st) {
  set("version", st.version); set("pid", st.pid); set("uptime", dur(st.uptime_seconds));
  set("data-dir", st.data_dir); set("mount", st.mount || "no mount");
  set("listen", Object.entries(st.listen || {}).map(([d, a]) => d + " " + a).join("  "));
}
function drawTiers(tiers) {
  const rows = [];
  for (const t of (tiers && tiers.tiers) || []) {
    if (t.name === "cold") continue;
    rows.push(row([t.name, bytes(t.used), bytes(t.capacity), bar(t.used, t.capacity),
                   {text: t.files, cls: "num"}, bytes(t.dirty),
                   t.hit_ratio === null || t.hit_ratio === undefined ? "-" :
                     (t.hit_ratio * 100).toFixed(0) + "%"], {tier: t.name}));
  }
  fill("tiers", rows, "placement is not running");
  const cold = ((tiers && tiers.tiers) || []).find((t) => t.name === "cold");
  if (cold) {
    set("cold-state", cold.reachable ? "reachable" :
        "UNREACHABLE (persisting paused, dirty data stays local)", cold.reachable ? "ok" : "bad");
    set("cold-url", cold.url || "-");
    set("cold-io", bytes(cold.uploaded_bytes) + " uploaded, " + bytes(cold.fetched_bytes) +
        " fetched since start");
  } else set("cold-state", "n/a", "dim");
}
function drawWriteBack(pl) {
  if (!pl) { set("dirty", "n/a (placement not running)", "dim"); return; }
  const d = pl.dirty, q = pl.queue, frac = d.limit > 0 ? d.bytes / d.limit : 0;
  set("dirty", bytes(d.bytes) + " in " + d.files + " files, limit " + bytes(d.limit),
      frac >= 0.8 ? "bad" : frac >= 0.5 ? "warn" : "");
  $("dirty-bar").replaceChildren(bar(d.bytes, d.limit));
  set("queue-depth", q.depth + (q.truncated ? "+" : "") + " files");
  set("queue-age", q.depth ? dur(q.oldest_age_seconds) : "-",
      q.oldest_age_seconds > 300 ? "bad" : q.oldest_age_seconds > 60 ? "warn" : "");
  const s = pl.stats || {}, h = s.hits || 0, m = s.misses || 0;
  set("reads", "hits " + h + ", misses " + m +
      (h + m ? " (" + (100 * h / (h + m)).toFixed(0) + "% from local tiers)" : ""));
}
function drawRequests(st) {
  const r = rates(st), rows = [];
  for (const [door, n] of Object.entries(st.requests || {}))
    rows.push(row([door, {text: n, cls: "num"},
                   {text: door in r ? r[door].toFixed(1) + "/s" : "…", cls: "num"}],
                  {door: door}));
  fill("requests", rows, "not counted");
}
function drawNamespace(st) {
  set("buckets", st.buckets); set("inodes", st.inodes); set("bytes", bytes(st.bytes));
  set("open-files", st.open_files);
  const meta = Object.assign({}, st.meta || {}), engine = meta.engine || "?";
  delete meta.engine;
  set("meta", engine + " " + Object.entries(meta).map(([k, v]) =>
      k + "=" + (/(bytes|size)$/.test(k) ? bytes(v) : v)).join(", "));
}
function drawPool(p) {
  if (!p) { set("pool", "no memory pool", "dim"); $("pool-bar").replaceChildren(); return; }
  set("pool", bytes(p.used) + " of " + bytes(p.capacity) + " used, " + p.regions +
      " regions, largest free " + bytes(p.largest_free));
  $("pool-bar").replaceChildren(bar(p.used, p.capacity));
}
function drawJobs(doc) {
  const rows = ((doc && doc.jobs) || []).slice(0, 10).map((j) => row([
    j.id, j.kind, j.prefix, {text: j.state, cls: j.state === "failed" ? "bad" :
                             j.state === "done" ? "ok" : ""},
    j.total ? bytes(j.done) + " / " + bytes(j.total) : bytes(j.done),
    dur(j.elapsed_s || 0), j.error || ""], {job: j.id}));
  fill("jobs", rows, "no jobs since the daemon started");
}
function drawCkpt(doc) {
  const rows = ((doc && doc.runs) || []).map((run) => {
    const steps = run.steps || [], latest = steps[steps.length - 1] || {};
    const states = {};
    for (const s of steps) states[s.state] = (states[s.state] || 0) + 1;
    return row([run.bucket + "/" + run.run, {text: steps.length, cls: "num"},
                latest.step === undefined ? "-" : latest.step, latest.state || "-",
                Object.entries(states).map(([k, v]) => v + " " + k).join(", ")],
               {run: run.bucket + "/" + run.run});
  });
  fill("ckpts", rows, "no checkpoint runs");
}
async function refresh() {
  try {
    const [st, tiers, jobs, ckpt] = await Promise.all(
      [get("/v1/status"), get("/v1/tiers"), get("/v1/jobs"), get("/v1/ckpt")]);
    drawHeader(st); drawTiers(tiers); drawWriteBack(st.placement); drawRequests(st);
    drawNamespace(st); drawPool(st.pool); drawJobs(jobs); drawCkpt(ckpt);
    $("banner").style.display = "none";
    set("updated", new Date().toLocaleTimeString());
    document.body.dataset.state = "ready";
  } catch (e) {
    const b = $("banner"); b.textContent = "cannot refresh: " + e.message;
    b.style.display = "block"; document.body.dataset.state = "error";
  }
}
refresh();
setInterval(refresh, REFRESH);
""".replace("@REFRESH@", str(REFRESH_S))

_BODY = """<header><h1>tierd</h1><span id="version">…</span>
<span>pid <b id="pid">…</b></span><span>up <b id="uptime">…</b></span>
<span id="listen"></span><span>data <b id="data-dir">…</b></span>
<span>mount <b id="mount">…</b></span></header>
<div id="banner" role="alert"></div>
<main>
<section class="wide"><h2>Tiers</h2><table><thead><tr><th>TIER</th><th>USED</th>
<th>CAPACITY</th><th>FILL</th><th>FILES</th><th>DIRTY</th><th>HITS</th></tr></thead>
<tbody id="tiers"></tbody></table>
<dl class="below"><dt>cold store</dt><dd><span id="cold-state">…</span>
<span class="dim" id="cold-url"></span></dd><dt>cold traffic</dt><dd id="cold-io">…</dd></dl>
</section>
<section><h2>Write-back</h2><dl><dt>dirty</dt><dd><span id="dirty">…</span>
<span id="dirty-bar"></span></dd><dt>persist queue</dt><dd id="queue-depth">…</dd>
<dt>oldest queued</dt><dd id="queue-age">…</dd><dt>reads</dt><dd id="reads">…</dd></dl>
</section>
<section><h2>Requests per door</h2><table><thead><tr><th>DOOR</th><th>SINCE START</th>
<th>RATE</th></tr></thead><tbody id="requests"></tbody></table></section>
<section><h2>Namespace</h2><dl><dt>buckets</dt><dd id="buckets">…</dd><dt>inodes</dt>
<dd id="inodes">…</dd><dt>bytes</dt><dd id="bytes">…</dd><dt>open files</dt>
<dd id="open-files">…</dd><dt>metadata</dt><dd id="meta">…</dd></dl></section>
<section><h2>Memory pool</h2><dl><dt>use</dt><dd><span id="pool-bar"></span>
<span id="pool">…</span></dd></dl></section>
<section class="wide"><h2>Recent jobs</h2><table><thead><tr><th>ID</th><th>KIND</th>
<th>PREFIX</th><th>STATE</th><th>PROGRESS</th><th>ELAPSED</th><th>ERROR</th></tr></thead>
<tbody id="jobs"></tbody></table></section>
<section class="wide"><h2>Checkpoints</h2><table><thead><tr><th>RUN</th><th>STEPS</th>
<th>LATEST</th><th>STATE</th><th>ALL STEPS</th></tr></thead><tbody id="ckpts"></tbody>
</table></section>
</main>
<footer>Read-only. Updated <span id="updated">never</span>; redrawn every @REFRESH@ s.
Operators change things with <code>tierctl</code>.</footer>
""".replace("@REFRESH@", str(REFRESH_S))

_LOGIN = """<header><h1>tierd</h1><span>status page</span></header>
<main><section><h2>Log in</h2>
<p>Paste the read-only token, from the file <code>%(file)s</code> in the daemon's data
directory (<code>cat ~/.local/share/tierd/%(file)s</code> by default), or the admin
token. Either way this browser gets a read-only session.</p>%(error)s
<form method="post" action="/login"><input type="password" name="token" required
autocomplete="current-password" placeholder="token" aria-label="token">
<button type="submit">Log in</button></form></section></main>
"""


def _sha256(text: str) -> str:
    return base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


#: only the page's own inline style and script run; it talks to nothing but this listener
_CSP = ("default-src 'none'; connect-src 'self'; img-src 'self'; form-action 'self'; "
        f"style-src 'sha256-{_sha256(_STYLE)}'; script-src 'sha256-{_sha256(_SCRIPT)}'; "
        "frame-ancestors 'none'; base-uri 'none'")
_HEADERS = {"Content-Security-Policy": _CSP, "Cache-Control": "no-store",
            "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
            "X-Frame-Options": "DENY"}


def _document(title: str, body: str, script: bool) -> str:
    js = f"<script>{_SCRIPT}</script>" if script else ""
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{title}</title><style>{_STYLE}</style></head>"
            f'<body data-state="loading">{body}{js}</body></html>')


def _html(text: str, status: int = 200, headers: dict[str, str] | None = None
          ) -> web.Response:
    return web.Response(text=text, status=status, content_type="text/html",
                        headers={**_HEADERS, **(headers or {})})


def login_page(status: int, error: str = "") -> web.Response:
    """The login form (``status`` 401 until a token is accepted; 400 for a refused one)."""
    err = f'<p class="bad" id="login-error">{html.escape(error)}</p>' if error else ""
    body = _LOGIN % {"file": READ_TOKEN_FILE, "error": err}
    return _html(_document("tierd: log in", body, script=False), status)


def status_page() -> web.Response:
    return _html(_document("tierd status", _BODY, script=True))


def _session(request: web.Request, auth: AdminAuth) -> web.Response:
    """Logged in: back to ``/`` (a redirect, so the form or the token leaves the address bar
    and history) with the read-only session cookie."""
    resp = web.Response(status=303, headers={**_HEADERS, "Location": "/"})
    resp.set_cookie(READ_COOKIE, auth.read_token, httponly=True, samesite="Strict",
                    path="/", secure=request.secure)
    return resp


routes = web.RouteTableDef()


async def load_read_token(app: web.Application) -> None:
    """At start-up: the read-only token of the daemon's data directory (made on first
    start), which the status page's links carry."""
    data_dir = Path(app[BACKEND].config.data_dir)
    auth = app[AUTH]
    try:
        auth.read_token = await asyncio.to_thread(bootstrap_read_token, data_dir)
    except OSError as e:  # a convenience, not a reason to refuse to start
        log.warning("cannot read or write the read-only token; the status page takes "
                    "the admin token until the next start", extra=kv(
                        file=str(data_dir / READ_TOKEN_FILE), error=e.strerror or str(e)))


def _refused(request: web.Request, why: str) -> None:
    log.info("status page login refused", extra=kv(remote=request.remote, why=why))


@routes.get("/")
async def page(request: web.Request) -> web.Response:
    """``GET /``: the status page for browsers (a login form until a token is given)."""
    auth = request.app[AUTH]
    token = request.query.get("token")
    if token is not None:
        kind = auth.token_kind(token)
        if kind == "read":
            return _session(request, auth)
        if kind == "admin":
            _refused(request, "admin token in a URL")
            return login_page(400, "The admin token is never taken from a URL (URLs end "
                              "up in logs and history). Paste it below, or use the "
                              "read-only token in the link.")
        _refused(request, "wrong token in the URL")
        return login_page(401, "That token is wrong.")
    if IDENTITY in request:
        return status_page()
    return login_page(401)


@routes.post("/login")
async def login(request: web.Request) -> web.Response:
    auth = request.app[AUTH]
    form = await request.post()
    token = form.get("token")
    if isinstance(token, str) and auth.token_kind(token) is not None:
        log.info("status page login", extra=kv(remote=request.remote))
        return _session(request, auth)
    _refused(request, "wrong token")
    return login_page(401, "That token is wrong.")
