"""``tierctl``: the operator's command line for a running tierd, over the admin API.

Status and health, placement (warmup/evict/pin/policy/du/persist/import), the memory pool
and checkpoints, users and access keys (``tierctl user ...``, ``tierctl key ...``).

Finding the daemon: ``--admin-url``/``TIERD_ADMIN_URL``, else the admin URL in the daemon's
``endpoints.json`` (in ``--data-dir``/``TIERD_DATA_DIR``, by default the daemon's own default
data directory), else ``http://127.0.0.1:9001``.  The admin token: ``--token``/
``TIERD_ADMIN_TOKEN``, else the ``admin-token`` file in that data directory (readable by the
daemon's user only).

It depends only on the standard library and click (not on the daemon package), so it can be
installed on machines that only administer tierd.  Plain blocking ``urllib`` is right here:
a CLI makes one request and exits.

Exit codes: 0 success, 1 tierd unreachable or unhealthy / an API error, 2 bad usage.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, NoReturn

import click

DEFAULT_ADMIN_URL = "http://127.0.0.1:9001"
TOKEN_FILE = "admin-token"
ENDPOINTS_FILE = "endpoints.json"


class AdminError(Exception):
    """The admin API could not be reached or answered with an error."""


class AdminClient:
    """Minimal client of tierd's admin API."""

    def __init__(self, url: str, timeout: float = 10.0, token: str | None = None,
                 token_hint: str = "") -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.token = token
        #: what to tell the operator when the API answers 401 (where a token would be found)
        self.token_hint = token_hint

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def _status_error(self, path: str, status: int, message: str) -> AdminError:
        if status == 401:
            message = (f"{message} -- {self.token_hint}" if self.token_hint else message)
        return AdminError(f"{self.url}{path}: HTTP {status}: {message}")

    def get(self, path: str) -> tuple[int, bytes]:
        """GET ``path``; returns (status, body).  HTTP errors are returned, not raised."""
        req = urllib.request.Request(self.url + path, headers=self._headers())
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return int(resp.status), bytes(resp.read())
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", e)
            raise AdminError(
                f"cannot reach the tierd admin API at {self.url}: {reason} "
                "(is `tierd serve` running? set --admin-url or TIERD_ADMIN_URL)"
            ) from None

    def get_json(self, path: str) -> dict[str, Any]:
        status, body = self.get(path)
        try:
            doc = json.loads(body)
        except ValueError:
            raise AdminError(
                f"{self.url}{path}: HTTP {status}, not a JSON answer (is this tierd's admin "
                "listener and not the S3 one?)"
            ) from None
        if status != 200 or not isinstance(doc, dict):
            message = doc.get("message") if isinstance(doc, dict) else None
            text = message or body.decode(errors="replace").strip()
            raise self._status_error(path, status, text)
        return doc

    def send(self, method: str, path: str, doc: dict[str, Any],
             timeout: float | None = None) -> Any:
        """``method path`` with a JSON body; the response, still open (for streaming)."""
        req = urllib.request.Request(self.url + path, data=json.dumps(doc).encode(),
                                     method=method,
                                     headers={"Content-Type": "application/json",
                                              **self._headers()})
        try:
            return urllib.request.urlopen(req, timeout=timeout or self.timeout)
        except urllib.error.HTTPError as e:
            try:
                message = json.loads(e.read()).get("message", "")
            except ValueError:
                message = ""
            raise self._status_error(path, e.code, message) from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise AdminError(f"cannot reach the tierd admin API at {self.url}: "
                             f"{getattr(e, 'reason', e)}") from None

    def call(self, method: str, path: str, doc: dict[str, Any],
             timeout: float | None = None) -> dict[str, Any]:
        with self.send(method, path, doc, timeout) as resp:
            out: dict[str, Any] = json.loads(resp.read())
        return out

    def health(self) -> tuple[bool, str]:
        status, body = self.get("/healthz")
        return status == 200, body.decode(errors="replace").strip() or f"HTTP {status}"

    def status(self) -> dict[str, Any]:
        return self.get_json("/v1/status")


def _fail(message: str) -> NoReturn:
    click.echo(f"tierctl: {message}", err=True)
    sys.exit(1)


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def human_duration(seconds: float) -> str:
    """3725 -> '1h 2m 5s'."""
    s = int(seconds)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    parts = [f"{d}d"] * bool(d) + [f"{h}h"] * bool(h) + [f"{m}m"] * bool(m) + [f"{s}s"]
    return " ".join(parts[:3])


def format_status(st: dict[str, Any]) -> str:
    """The human form of ``/v1/status``."""
    listen = st.get("listen", {})
    meta = dict(st.get("meta", {}))
    engine = meta.pop("engine", "?")
    meta_bits = ", ".join(
        f"{k}={human_bytes(v) if k.endswith('bytes') or k.endswith('size') else v}"
        for k, v in meta.items()
    )
    rows = [
        ("tierd", f"{st.get('version', '?')}  pid {st.get('pid', '?')}"),
        ("uptime", human_duration(float(st.get("uptime_seconds", 0)))),
        ("data dir", str(st.get("data_dir", "?"))),
        ("listen", "  ".join(f"{door} {addr}" for door, addr in listen.items())),
        (
            "namespace",
            f"{st.get('inodes', 0)} inodes, {human_bytes(st.get('bytes', 0))}, "
            f"{st.get('buckets', 0)} buckets, {st.get('open_files', 0)} open files",
        ),
        ("metadata", f"{engine}" + (f" ({meta_bits})" if meta_bits else "")),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def default_data_dir() -> Path:
    """The daemon's default data directory (its ``data_dir`` setting's default)."""
    import platformdirs

    return Path(platformdirs.user_data_dir("tierd"))


def find_admin(admin_url: str | None, token: str | None, data_dir: Path | None,
               timeout: float) -> AdminClient:
    """The client for the daemon named by the options (see the module docstring)."""
    data = data_dir if data_dir is not None else default_data_dir()
    if not admin_url:
        try:
            admin_url = str(json.loads((data / ENDPOINTS_FILE).read_text())["admin"]["url"])
        except (OSError, ValueError, KeyError, TypeError):
            admin_url = DEFAULT_ADMIN_URL
    hint = ""
    if not token:
        path = data / TOKEN_FILE
        try:
            token = path.read_text().strip() or None
        except FileNotFoundError:
            hint = (f"no admin token: pass --token or set TIERD_ADMIN_TOKEN (the daemon "
                    f"writes it to DATA_DIR/{TOKEN_FILE}; {path} does not exist: "
                    "use --data-dir)")
        except OSError as e:
            hint = (f"no admin token: cannot read {path} ({e.strerror}); run as the "
                    "daemon's user, or pass --token / set TIERD_ADMIN_TOKEN")
        if token:
            hint = f"the token in {path} was refused (another daemon's data directory?)"
    else:
        hint = "the token given by --token / TIERD_ADMIN_TOKEN was refused"
    return AdminClient(admin_url, timeout, token, hint)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--admin-url",
    envvar="TIERD_ADMIN_URL",
    default=None,
    help="Base URL of tierd's admin API [env: TIERD_ADMIN_URL; default: from the data "
    f"directory's {ENDPOINTS_FILE}, else {DEFAULT_ADMIN_URL}].",
)
@click.option("--token", envvar="TIERD_ADMIN_TOKEN", default=None,
              help=f"Admin API token [env: TIERD_ADMIN_TOKEN; default: DATA_DIR/{TOKEN_FILE}].")
@click.option("--data-dir", envvar="TIERD_DATA_DIR", default=None,
              type=click.Path(file_okay=False, path_type=Path),
              help="The daemon's data directory, where its admin token and endpoints are "
              "found [env: TIERD_DATA_DIR; default: the daemon's default].")
@click.option("--timeout", default=10.0, show_default=True, help="Seconds to wait for tierd.")
@click.pass_context
def cli(ctx: click.Context, admin_url: str | None, token: str | None,
        data_dir: Path | None, timeout: float) -> None:
    """Administer a running tierd through its admin API."""
    ctx.obj = find_admin(admin_url, token, data_dir, timeout)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON document.")
@click.pass_obj
def status(client: AdminClient, as_json: bool) -> None:
    """Show version, uptime, namespace counts and listen addresses."""
    try:
        st = client.status()
    except AdminError as e:
        _fail(str(e))
    click.echo(json.dumps(st, indent=2, sort_keys=True) if as_json else format_status(st))


@cli.command()
@click.pass_obj
def health(client: AdminClient) -> None:
    """Exit 0 and print 'ok' if tierd is healthy, else exit 1."""
    try:
        ok, text = client.health()
    except AdminError as e:
        _fail(str(e))
    if not ok:
        _fail(f"unhealthy: {text}")
    click.echo(text)


def _run(fn: Any) -> dict[str, Any]:
    try:
        out: dict[str, Any] = fn()
    except AdminError as e:
        _fail(str(e))
    return out


@cli.command()
@click.argument("prefix")
@click.option("--tier", type=click.Choice(["hot", "warm"]), default=None,
              help="Tier to warm (default: each file's policy tier, hot unless set).")
@click.pass_obj
def warmup(client: AdminClient, prefix: str, tier: str | None) -> None:
    """Fetch everything under PREFIX (bucket/key-prefix) onto a local tier."""
    try:
        resp = client.send("POST", "/v1/placement/warmup", {"prefix": prefix, "tier": tier},
                           timeout=3600)
    except AdminError as e:
        _fail(str(e))
    with resp, click.progressbar(length=1, label=f"warming {prefix}", show_pos=False,
                                 item_show_func=lambda s: s) as bar:
        last = 0
        for line in resp:
            doc = json.loads(line)
            if "error" in doc:
                _fail(doc.get("message", "warmup failed"))
            bar.length = max(int(doc.get("total", 0)), 1)
            bar.update(int(doc["done"]) - last,
                       f"{human_bytes(doc['done'])} / {human_bytes(doc['total'])} "
                       f"{human_bytes(doc.get('bytes_per_s', 0))}/s")
            last = int(doc["done"])


@cli.command()
@click.argument("prefix")
@click.option("--tier", type=click.Choice(["all", "hot", "warm"]), default="all",
              show_default=True,
              help="hot: demote to warm (if any); warm: drop warm copies; all: drop both.")
@click.pass_obj
def evict(client: AdminClient, prefix: str, tier: str) -> None:
    """Evict clean, unpinned blocks under PREFIX from the local tiers (cold keeps them)."""
    doc = _run(lambda: client.call("POST", "/v1/placement/evict",
                                   {"prefix": prefix, "tier": tier}))
    click.echo(f"evicted {human_bytes(doc['evicted'])}")


@cli.command()
@click.argument("prefix")
@click.pass_obj
def pin(client: AdminClient, prefix: str) -> None:
    """Keep PREFIX's blocks on their tier (never evicted)."""
    _run(lambda: client.call("POST", "/v1/placement/pin", {"prefix": prefix}))
    click.echo(f"pinned {prefix}")


@cli.command()
@click.argument("prefix")
@click.pass_obj
def unpin(client: AdminClient, prefix: str) -> None:
    """Let PREFIX's blocks be evicted again."""
    _run(lambda: client.call("POST", "/v1/placement/unpin", {"prefix": prefix}))
    click.echo(f"unpinned {prefix}")


@cli.group()
def policy() -> None:
    """Per-prefix placement policies (write-back, write-through, cache-only, pin, tier)."""


@policy.command("get")
@click.pass_obj
def policy_get(client: AdminClient) -> None:
    """List the policies."""
    doc = _run(lambda: client.get_json("/v1/placement/policy"))
    for p in doc["policies"]:
        click.echo(f"{p['prefix'] or '(all)'}\t{p['mode']}\tpin={p['pin']}\ttier={p['tier']}")


@policy.command("set")
@click.argument("prefix")
@click.option("--mode", type=click.Choice(["write-back", "write-through", "cache-only"]))
@click.option("--pin/--no-pin", default=None)
@click.option("--tier", type=click.Choice(["hot", "warm"]), default=None,
              help="Where the prefix's data lives locally (warm needs warm_enabled).")
@click.pass_obj
def policy_set(client: AdminClient, prefix: str, mode: str | None, pin: bool | None,
               tier: str | None) -> None:
    """Set PREFIX's policy."""
    doc = _run(lambda: client.call("PUT", "/v1/placement/policy",
                                   {"prefix": prefix, "mode": mode, "pin": pin, "tier": tier}))
    click.echo(json.dumps(doc))


@cli.command()
@click.argument("prefix", default="")
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON document.")
@click.pass_obj
def du(client: AdminClient, prefix: str, as_json: bool) -> None:
    """Bytes under PREFIX per tier, and dirty bytes."""
    from urllib.parse import quote

    doc = _run(lambda: client.get_json("/v1/placement/du?prefix=" + quote(prefix)))
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    t = doc["tiers"]
    click.echo(f"{doc['files']} files, {human_bytes(doc['bytes'])}: "
               f"hot {human_bytes(t['hot'])}, warm {human_bytes(t.get('warm', 0))}, "
               f"cold {human_bytes(t['cold'])}, dirty {human_bytes(doc['dirty'])}")


@cli.command()
@click.argument("prefix", default="")
@click.option("--wait", is_flag=True, required=True, help="Wait until persisted.")
@click.option("--wait-timeout", type=float, default=None, help="Give up after this many s.")
@click.pass_obj
def persist(client: AdminClient, prefix: str, wait: bool, wait_timeout: float | None) -> None:
    """Wait until everything under PREFIX is in the cold store."""
    doc = _run(lambda: client.call("POST", "/v1/placement/persist",
                                   {"prefix": prefix, "timeout": wait_timeout},
                                   timeout=(wait_timeout or 86400) + 10))
    if not doc["persisted"]:
        _fail(f"{prefix}: not persisted within {wait_timeout}s")
    click.echo(f"{prefix or '(all)'}: persisted")


@cli.command("import")
@click.argument("prefix")
@click.pass_obj
def import_(client: AdminClient, prefix: str) -> None:
    """Import every object under PREFIX in the cold store into the namespace now."""
    doc = _run(lambda: client.call("POST", "/v1/placement/import", {"prefix": prefix},
                                   timeout=3600))
    click.echo(f"imported {doc['imported']} entries")


@cli.group()
def pool() -> None:
    """The memory pool: status, tenant quotas, forced frees."""


@pool.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON document.")
@click.pass_obj
def pool_status(client: AdminClient, as_json: bool) -> None:
    """Capacity, use per tenant, fragmentation, bytes moved, regions."""
    doc = _run(lambda: client.get_json("/v1/pool"))
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(f"capacity {human_bytes(doc['capacity'])}, used {human_bytes(doc['used'])}, "
               f"free {human_bytes(doc['free'])} (largest {human_bytes(doc['largest_free'])}"
               f", fragmentation {doc['fragmentation']:.2f}), {doc['regions']} regions")
    click.echo(f"moved in {human_bytes(doc['bytes_moved_in'])}, out "
               f"{human_bytes(doc['bytes_moved_out'])}; socket {doc['socket']}")
    for tenant, t in doc["tenants"].items():
        click.echo(f"  tenant {tenant}: {human_bytes(t['used'])} of "
                   f"{human_bytes(t['quota'])} in {t['regions']} regions")
    for r in doc["region_list"]:
        click.echo(f"  region {r['id']}: tenant {r['tenant']}, {human_bytes(r['size'])}"
                   f"{', persistent' if r['persistent'] else ''} {r['name']}")


@pool.group("quota")
def pool_quota() -> None:
    """Tenant quotas."""


@pool_quota.command("set")
@click.argument("tenant", type=click.IntRange(min=0))
@click.argument("nbytes", metavar="BYTES")
@click.pass_obj
def pool_quota_set(client: AdminClient, tenant: int, nbytes: str) -> None:
    """Limit TENANT (a uid) to BYTES of pool memory (e.g. 8GiB; 0: back to the default)."""
    from tierd.config_parsers import ParseContext, parse_size

    try:
        n = parse_size(nbytes, ParseContext(Path.cwd()))
    except ValueError as e:
        _fail(str(e))
    doc = _run(lambda: client.call("PUT", f"/v1/pool/quota/{tenant}", {"bytes": n}))
    click.echo(f"tenant {tenant}: quota {human_bytes(doc['quota'])}, "
               f"using {human_bytes(doc['used'])}")


@pool.command("free")
@click.argument("region", type=click.IntRange(min=1))
@click.pass_obj
def pool_free(client: AdminClient, region: int) -> None:
    """Free REGION now, whoever holds it."""
    doc = _run(lambda: client.call("DELETE", f"/v1/pool/regions/{region}", {}))
    click.echo(f"freed region {doc['freed']} ({human_bytes(doc['size'])} of tenant "
               f"{doc['tenant']})")


@cli.group()
def ckpt() -> None:
    """Checkpoints."""


@ckpt.command("list")
@click.argument("run")
@click.option("--bucket", default="checkpoints", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON document.")
@click.pass_obj
def ckpt_list(client: AdminClient, run: str, bucket: str, as_json: bool) -> None:
    """Steps of RUN and where each is: committed (pool only), local (hot), persisted."""
    from urllib.parse import urlencode

    doc = _run(lambda: client.get_json("/v1/ckpt?" + urlencode({"run": run,
                                                                 "bucket": bucket})))
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    if not doc["steps"]:
        click.echo(f"{bucket}/{run}: no checkpoints")
    for s in doc["steps"]:
        size = human_bytes(s["size"]) if s["size"] is not None else "?"
        click.echo(f"step {s['step']}\t{s['state']}\t{size}"
                   f"{chr(9) + 'in pool' if s['in_pool'] else ''}")


# -- users and access keys ------------------------------------------------------------------

def table(headers: tuple[str, ...], rows: list[tuple[object, ...]]) -> str:
    """Left-aligned columns for people (scripts use --json)."""
    cells = [tuple(str(c) for c in headers)] + [tuple(str(c) for c in r) for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in cells)


def _when(ns: int) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ns / 1e9)) if ns else "-"


def _echo_json(doc: Any) -> None:
    click.echo(json.dumps(doc, indent=2, sort_keys=True))


@cli.group()
def user() -> None:
    """Users: a name with a uid, gid, groups and an admin flag; S3 keys map to them."""


@user.command("add")
@click.argument("name")
@click.option("--uid", type=click.IntRange(0, 2**32 - 2), required=True,
              help="The user's uid (files it creates are owned by it).")
@click.option("--gid", type=click.IntRange(0, 2**32 - 2), default=None,
              help="Primary group (default: the uid).")
@click.option("--groups", default="", metavar="GID,GID...", help="Supplementary groups.")
@click.option("--admin", is_flag=True, help="May call the admin API with a signed request.")
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON document.")
@click.pass_obj
def user_add(client: AdminClient, name: str, uid: int, gid: int | None, groups: str,
             admin: bool, as_json: bool) -> None:
    """Add user NAME."""
    try:
        gids = [int(g) for g in groups.replace(" ", "").split(",") if g]
    except ValueError:
        _fail(f"--groups must be comma-separated numbers, not {groups!r}")
    doc = _run(lambda: client.call("POST", "/v1/users", {
        "name": name, "uid": uid, "gid": gid, "groups": gids, "admin": admin}))
    if as_json:
        _echo_json(doc)
        return
    click.echo(f"added user {doc['name']} (uid {doc['uid']}, gid {doc['gid']}"
               f"{', admin' if doc['admin'] else ''})")


@user.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON document.")
@click.pass_obj
def user_list(client: AdminClient, as_json: bool) -> None:
    """List users."""
    doc = _run(lambda: client.get_json("/v1/users"))
    if as_json:
        _echo_json(doc)
        return
    click.echo(table(("NAME", "UID", "GID", "GROUPS", "ADMIN", "KEYS", "CREATED"), [
        (u["name"], u["uid"], u["gid"], ",".join(map(str, u["groups"])) or "-",
         "yes" if u["admin"] else "no", u.get("keys", 0), _when(u["created_ns"]))
        for u in doc["users"]]))


@user.command("rm")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON document.")
@click.pass_obj
def user_rm(client: AdminClient, name: str, as_json: bool) -> None:
    """Delete user NAME and its access keys (its files stay, owned by its uid)."""
    from urllib.parse import quote

    doc = _run(lambda: client.call("DELETE", "/v1/users/" + quote(name, safe=""), {}))
    if as_json:
        _echo_json(doc)
        return
    removed = doc["keys_removed"]
    click.echo(f"deleted user {name}" + (f" and its keys {', '.join(removed)}" if removed
                                         else ""))


@cli.group()
def key() -> None:
    """S3 access keys of users (the secret is shown once, at creation)."""


@key.command("add")
@click.argument("user_name", metavar="USER")
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON document.")
@click.pass_obj
def key_add(client: AdminClient, user_name: str, as_json: bool) -> None:
    """Create an access key for USER and print its secret (shown only this once)."""
    doc = _run(lambda: client.call("POST", "/v1/keys", {"user": user_name}))
    if as_json:
        _echo_json(doc)
        return
    click.echo(f"access key  {doc['access_key']}\nsecret      {doc['secret']}\n"
               "(the secret is not shown again: store it now)")


@key.command("list")
@click.option("--user", "user_name", default=None, help="Only this user's keys.")
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON document.")
@click.pass_obj
def key_list(client: AdminClient, user_name: str | None, as_json: bool) -> None:
    """List access keys (never their secrets)."""
    from urllib.parse import urlencode

    path = "/v1/keys" + ("?" + urlencode({"user": user_name}) if user_name else "")
    doc = _run(lambda: client.get_json(path))
    if as_json:
        _echo_json(doc)
        return
    click.echo(table(("ACCESS KEY", "USER", "STATUS", "CREATED"), [
        (k["access_key"], k["user"] or "-", "enabled" if k["enabled"] else "disabled",
         _when(k["created_ns"])) for k in doc["keys"]]))


def _key_action(client: AdminClient, access_key: str, method: str, suffix: str) -> Any:
    from urllib.parse import quote

    return _run(lambda: client.call(method, "/v1/keys/" + quote(access_key, safe="") + suffix,
                                    {}))


@key.command("disable")
@click.argument("access_key")
@click.pass_obj
def key_disable(client: AdminClient, access_key: str) -> None:
    """Disable ACCESS_KEY (requests signed with it are refused until enabled)."""
    _key_action(client, access_key, "POST", "/disable")
    click.echo(f"disabled {access_key}")


@key.command("enable")
@click.argument("access_key")
@click.pass_obj
def key_enable(client: AdminClient, access_key: str) -> None:
    """Enable ACCESS_KEY again."""
    _key_action(client, access_key, "POST", "/enable")
    click.echo(f"enabled {access_key}")


@key.command("rm")
@click.argument("access_key")
@click.pass_obj
def key_rm(client: AdminClient, access_key: str) -> None:
    """Delete ACCESS_KEY."""
    _key_action(client, access_key, "DELETE", "")
    click.echo(f"deleted {access_key}")


def main() -> None:
    """Console-script entry point (``tierctl``)."""
    cli(prog_name="tierctl")


if __name__ == "__main__":
    main()
