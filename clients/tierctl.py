"""``tierctl``: the operator's command line for a running tierd, over the admin API.

A skeleton for now: ``tierctl status`` and ``tierctl health``.  Later issues add buckets,
users, pins, checkpoints...

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


class AdminError(Exception):
    """The admin API could not be reached or answered with an error."""


class AdminClient:
    """Minimal client of tierd's admin API."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def get(self, path: str) -> tuple[int, bytes]:
        """GET ``path``; returns (status, body).  HTTP errors are returned, not raised."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=self.timeout) as resp:
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
            raise AdminError(f"{self.url}{path}: HTTP {status}: {text}")
        return doc

    def send(self, method: str, path: str, doc: dict[str, Any],
             timeout: float | None = None) -> Any:
        """``method path`` with a JSON body; the response, still open (for streaming)."""
        req = urllib.request.Request(self.url + path, data=json.dumps(doc).encode(),
                                     method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            return urllib.request.urlopen(req, timeout=timeout or self.timeout)
        except urllib.error.HTTPError as e:
            try:
                message = json.loads(e.read()).get("message", "")
            except ValueError:
                message = ""
            raise AdminError(f"{self.url}{path}: HTTP {e.code}: {message}") from None
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


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--admin-url",
    envvar="TIERD_ADMIN_URL",
    default=DEFAULT_ADMIN_URL,
    show_default=True,
    help="Base URL of tierd's admin API [env: TIERD_ADMIN_URL].",
)
@click.option("--timeout", default=10.0, show_default=True, help="Seconds to wait for tierd.")
@click.pass_context
def cli(ctx: click.Context, admin_url: str, timeout: float) -> None:
    """Administer a running tierd through its admin API."""
    ctx.obj = AdminClient(admin_url, timeout)


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


def main() -> None:
    """Console-script entry point (``tierctl``)."""
    cli(prog_name="tierctl")


if __name__ == "__main__":
    main()
