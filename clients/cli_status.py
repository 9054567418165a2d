"""``tierctl status``, ``health`` and ``completion``."""

from __future__ import annotations

import sys
from typing import Any

import click
from rich.text import Text

from .cli_common import (
    AdminClient,
    echo_json,
    fail,
    human_bytes,
    human_duration,
    print_fields,
    print_table,
    usage_bar,
)
from .cli_root import cli, json_option

TIER_ORDER = ("mem", "hot", "warm")


def _meta_line(st: dict[str, Any]) -> str:
    meta = dict(st.get("meta") or {})
    engine = meta.pop("engine", "?")
    bits = ", ".join(
        f"{k}={human_bytes(v) if k.endswith(('bytes', 'size')) else v}"
        for k, v in meta.items())
    return f"{engine}" + (f" ({bits})" if bits else "")


def _tier_rows(st: dict[str, Any]) -> list[tuple[object, ...]]:
    """mem, hot, warm with used/capacity bars, then cold (reachability, not a capacity)."""
    pl = st.get("placement") or {}
    tiers: dict[str, dict[str, int]] = dict(pl.get("tiers") or {})
    if "mem" not in tiers and st.get("mem_tier"):
        tiers["mem"] = st["mem_tier"]
    rows: list[tuple[object, ...]] = []
    for name in TIER_ORDER:
        t = tiers.get(name)
        if t is None:
            rows.append((name, "-", "-", Text("not configured", style="dim")))
            continue
        rows.append((name, human_bytes(t.get("used", 0)), human_bytes(t.get("capacity", 0)),
                     usage_bar(t.get("used", 0), t.get("capacity", 0))))
    cold = pl.get("cold")
    if cold is not None:
        state = (Text("reachable", style="green") if cold.get("reachable")
                 else Text("UNREACHABLE (persisting paused, dirty data stays local)",
                           style="bold red"))
        state.append(f"  {cold.get('url', '')}")
        if not cold.get("reachable") and cold.get("reason"):
            state.append(f"  ({cold['reason']})")
        rows.append(("cold", "-", "-", state))
    return rows


def _persist_line(st: dict[str, Any]) -> str:
    pl = st.get("placement") or {}
    dirty, queue = pl.get("dirty"), pl.get("queue")
    if dirty is None or queue is None:
        return "n/a (placement not running)"
    depth = f"{queue['depth']}{'+' if queue.get('truncated') else ''}"
    oldest = (f", oldest {human_duration(queue['oldest_age_seconds'])}" if queue["depth"]
              else "")
    return (f"{human_bytes(dirty['bytes'])} dirty in {dirty.get('files', 0)} files "
            f"(limit {human_bytes(dirty['limit'])}); persist queue {depth} files{oldest}")


def _unpersistable_lines(st: dict[str, Any]) -> list[tuple[str, object]]:
    """Files the cold store cannot take (a key over its limits...), each with the error,
    and the cold deletes still pending: shown only when there are any."""
    pl = st.get("placement") or {}
    queue, cold = pl.get("queue") or {}, pl.get("cold") or {}
    rows: list[tuple[str, object]] = []
    for f in queue.get("unpersistable_files") or []:
        rows.append(("unpersistable", Text(f"{f['key']}: {f['error']} "
                                           f"({f['failures']} tries)", style="red")))
    more = int(queue.get("unpersistable", 0)) - len(rows)
    if more > 0:
        rows.append(("unpersistable", f"... and {more} more files"))
    if cold.get("pending_deletes"):
        rows.append(("cold deletes", f"{cold['pending_deletes']} pending"))
    return rows


def _requests_line(st: dict[str, Any], rates: dict[str, float] | None) -> str:
    totals = st.get("requests")
    if not totals:
        return "n/a (this tierd does not count requests per door)"
    parts = []
    for door, n in totals.items():
        rate = "" if rates is None else f" ({rates.get(door, 0.0):.1f}/s)"
        parts.append(f"{door} {n}{rate}")
    return "  ".join(parts) + "  (total since start" + (", rate over 1 s)" if rates else ")")


def _reads_line(st: dict[str, Any]) -> str:
    """Hits and misses of the local tiers since start (a miss fetched from cold)."""
    stats = (st.get("placement") or {}).get("stats")
    if stats is None:
        return "n/a (placement not running)"
    hits, misses = int(stats.get("hits", 0)), int(stats.get("misses", 0))
    ratio = f" ({hits / (hits + misses):.0%} from local tiers)" if hits + misses else ""
    mem = st.get("mem_tier") or {}
    mem_hits = f", mem hits {mem.get('hits', 0)}" if mem else ""
    return f"hits {hits}, misses {misses}{ratio}{mem_hits}"


def _pool_line(st: dict[str, Any]) -> str:
    pool = st.get("pool")
    if not pool:
        return "n/a (no memory pool)"
    return (f"{human_bytes(pool.get('used', 0))} of {human_bytes(pool.get('capacity', 0))} "
            f"used, {pool.get('regions', 0)} regions, largest free "
            f"{human_bytes(pool.get('largest_free', 0))}")


def show_status(st: dict[str, Any], rates: dict[str, float] | None = None) -> None:
    """The human form of ``/v1/status``: who and where, then the tiers as a table with
    bars, then dirty data, requests and the pool."""
    listen = st.get("listen") or {}
    pool = st.get("pool")
    pool_bar: object = _pool_line(st)
    if pool:
        pool_bar = usage_bar(pool.get("used", 0), pool.get("capacity", 0))
        pool_bar.append(f"  {_pool_line(st)}")
    print_fields([
        ("tierd", f"{st.get('version', '?')}  pid {st.get('pid', '?')}  up "
                  f"{human_duration(float(st.get('uptime_seconds', 0)))}"),
        ("data dir", str(st.get("data_dir", "?"))),
        ("listen", "  ".join(f"{door} {addr}" for door, addr in listen.items()) or "-"),
        ("mount", st.get("mount") or "-"),
        ("namespace", f"{st.get('inodes', 0)} inodes, {human_bytes(st.get('bytes', 0))}, "
                      f"{st.get('buckets', 0)} buckets, {st.get('open_files', 0)} open files"),
        ("metadata", _meta_line(st)),
    ])
    click.echo()
    print_table(("TIER", "USED", "CAPACITY", "USE"), _tier_rows(st))
    click.echo()
    print_fields([
        ("dirty", _persist_line(st)),
        *_unpersistable_lines(st),
        ("requests", _requests_line(st, rates)),
        ("reads", _reads_line(st)),
        ("pool", pool_bar),
    ])


def _rates(client: AdminClient, first: dict[str, Any]) -> tuple[dict[str, Any],
                                                                  dict[str, float] | None]:
    """A second status one second later: requests per second per door."""
    import time

    t0 = time.monotonic()
    time.sleep(1.0)
    second = client.status()
    a, b = first.get("requests") or {}, second.get("requests") or {}
    if not b:
        return second, None
    dt = max(time.monotonic() - t0, 1e-3)
    # the second read itself is one admin request: not the operator's traffic
    return second, {door: max(0.0, (n - a.get(door, 0) - (door == "admin")) / dt)
                    for door, n in b.items()}


@cli.command()
@click.option("--rate", is_flag=True,
              help="Read the status twice, 1 s apart, and show requests per second per door.")
@json_option
@click.pass_obj
def status(client: AdminClient, rate: bool, as_json: bool) -> None:
    """Tiers (used/capacity), dirty data and persist queue, cold store, requests, pool."""
    st = client.status()
    rates = None
    if rate:
        st, rates = _rates(client, st)
    if as_json:
        echo_json(st)
        return
    show_status(st, rates)


@cli.command()
@json_option
@click.pass_obj
def health(client: AdminClient, as_json: bool) -> None:
    """Exit 0 and print 'ok' if tierd is healthy, else exit 1.  With --json:
    ``{"healthy": bool, "status": text}`` either way, and the same exit code."""
    ok, text = client.health()
    if as_json:
        echo_json({"healthy": ok, "status": text, "url": client.url})
        if not ok:
            sys.exit(1)
        return
    if not ok:
        fail(f"unhealthy: {text}")
    click.echo(text)


@cli.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
@click.pass_context
def completion(ctx: click.Context, shell: str) -> None:
    """Print the shell completion script for SHELL.

    \b
    bash:  eval "$(tierctl completion bash)"    (e.g. in ~/.bashrc)
    zsh:   eval "$(tierctl completion zsh)"     (e.g. in ~/.zshrc)
    fish:  tierctl completion fish > ~/.config/fish/completions/tierctl.fish
    """
    from click.shell_completion import get_completion_class

    cls = get_completion_class(shell)
    if cls is None:  # click knows the three choices; kept for a future click without one
        fail(f"no completion for {shell}")
    root = ctx.find_root().command
    click.echo(cls(root, {}, "tierctl", "_TIERCTL_COMPLETE").source())
