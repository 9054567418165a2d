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


def main() -> None:
    """Console-script entry point (``tierctl``)."""
    cli(prog_name="tierctl")


if __name__ == "__main__":
    main()
