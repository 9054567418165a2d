"""Placement commands: ``warmup``, ``evict``, ``pin``/``unpin``, ``policy``, ``du``, ``ls``,
``persist``, ``import``.  A prefix whose bucket does not exist is refused by the daemon
("no such bucket", exit 1), never answered with zero.

``warmup``, ``evict`` and ``persist`` run as jobs (``/v1/jobs``) when the daemon has them:
by default tierctl waits with a progress bar (Ctrl-C cancels the job), ``--detach`` prints
the job's id and returns.  Against a daemon without jobs they use the synchronous
endpoints (warmup's NDJSON progress stream).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote, urlencode

import click

from .cli_common import AdminClient, AdminError, echo_json, fail, human_bytes, print_table, progress
from .cli_jobs import detach, no_jobs_api, start_job, wait_job
from .cli_root import cli, json_option

WAIT_HELP = ("--wait (default): follow the job with a progress bar, Ctrl-C cancels it; "
             "--detach: print the job's id and return.")


def _warmup_stream(client: AdminClient, prefix: str, tier: str | None,
                   quiet: bool) -> dict[str, Any]:
    """A daemon without jobs: ``POST /v1/placement/warmup`` streams one progress document
    per line; the last is the result."""
    resp = client.send("POST", "/v1/placement/warmup", {"prefix": prefix, "tier": tier},
                       timeout=3600)
    last: dict[str, Any] = {"prefix": prefix, "done": 0, "total": 0, "files": 0}
    with resp, progress(f"warmup {prefix}", quiet) as report:
        for line in resp:
            doc = json.loads(line)
            if "error" in doc:
                fail(f"warmup {prefix}: {doc.get('message') or doc['error']}")
            last = doc
            report(int(doc.get("done", 0)), int(doc.get("total", 0)) or None,
                   doc.get("bytes_per_s"))
    return last


@cli.command()
@click.argument("prefix")
@click.option("--tier", type=click.Choice(["mem", "hot", "warm"]), default=None,
              help="Tier to warm (default: each file's policy tier, hot unless set).")
@click.option("--wait/--detach", default=True, help=WAIT_HELP)
@json_option
@click.pass_obj
def warmup(client: AdminClient, prefix: str, tier: str | None, wait: bool,
           as_json: bool) -> None:
    """Fetch everything under PREFIX (bucket/key-prefix) onto a local tier."""
    job = start_job(client, {"kind": "warmup", "prefix": prefix, "tier": tier})
    if job is None:
        if not wait:
            no_jobs_api()
        doc = _warmup_stream(client, prefix, tier, as_json)
        done, files = int(doc.get("done", 0)), doc.get("files", 0)
    elif not wait:
        detach(job, as_json)
        return
    else:
        doc = wait_job(client, job, as_json)
        done, files = int(doc.get("done") or 0), doc.get("files_done", 0)
    if as_json:
        echo_json(doc)
        return
    click.echo(f"warmed {human_bytes(done)} in {files} files under {prefix}")


@cli.command()
@click.argument("prefix")
@click.option("--tier", type=click.Choice(["all", "mem", "hot", "warm"]), default="all",
              show_default=True,
              help="hot: demote to warm (if any); warm: drop warm copies; mem: drop memory "
              "copies; all: drop every local copy.")
@click.option("--wait/--detach", default=True, help=WAIT_HELP)
@json_option
@click.pass_obj
def evict(client: AdminClient, prefix: str, tier: str, wait: bool, as_json: bool) -> None:
    """Evict clean, unpinned blocks under PREFIX from the local tiers (cold keeps them)."""
    job = start_job(client, {"kind": "evict", "prefix": prefix, "tier": tier})
    if job is None:
        if not wait:
            no_jobs_api()
        doc = client.call("POST", "/v1/placement/evict", {"prefix": prefix, "tier": tier})
        evicted = doc["evicted"]
    elif not wait:
        detach(job, as_json)
        return
    else:
        doc = wait_job(client, job, as_json)
        evicted = (doc.get("result") or {}).get("evicted", 0)
    if as_json:
        echo_json(doc)
        return
    click.echo(f"evicted {human_bytes(evicted)}")


@cli.command()
@click.argument("prefix", default="")
@click.option("--wait/--detach", default=True, help=WAIT_HELP)
@click.option("--wait-timeout", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Give up (exit 1) after this many seconds.")
@json_option
@click.pass_obj
def persist(client: AdminClient, prefix: str, wait: bool, wait_timeout: float | None,
            as_json: bool) -> None:
    """Wait until everything under PREFIX is in the cold store."""
    job = start_job(client, {"kind": "persist", "prefix": prefix, "timeout": wait_timeout})
    if job is None:
        if not wait:
            no_jobs_api()
        doc = client.call("POST", "/v1/placement/persist",
                          {"prefix": prefix, "timeout": wait_timeout},
                          timeout=(wait_timeout or 86400) + 10)
        if not doc["persisted"]:
            fail(f"{prefix or '(all)'}: not persisted within {wait_timeout:g} s (is the "
                 "cold store reachable? see tierctl status)")
    elif not wait:
        detach(job, as_json)
        return
    else:
        doc = wait_job(client, job, as_json)
    if as_json:
        echo_json(doc)
        return
    click.echo(f"{prefix or '(all)'}: persisted")


@cli.command()
@click.argument("prefix")
@json_option
@click.pass_obj
def pin(client: AdminClient, prefix: str, as_json: bool) -> None:
    """Keep PREFIX's blocks on their tier (never evicted)."""
    doc = client.call("POST", "/v1/placement/pin", {"prefix": prefix})
    if as_json:
        echo_json(doc)
        return
    click.echo(f"pinned {prefix}")


@cli.command()
@click.argument("prefix")
@json_option
@click.pass_obj
def unpin(client: AdminClient, prefix: str, as_json: bool) -> None:
    """Let PREFIX's blocks be evicted again."""
    doc = client.call("POST", "/v1/placement/unpin", {"prefix": prefix})
    if as_json:
        echo_json(doc)
        return
    click.echo(f"unpinned {prefix}")


def _policy_rows(policies: list[dict[str, Any]]) -> list[tuple[object, ...]]:
    return [(p["prefix"] or "(all)", p["mode"], "yes" if p["pin"] else "no", p["tier"])
            for p in policies]


@cli.group()
def policy() -> None:
    """Per-prefix placement policies (write-back, write-through, cache-only, pin, tier)."""


@policy.command("get")
@json_option
@click.pass_obj
def policy_get(client: AdminClient, as_json: bool) -> None:
    """List the policies."""
    doc = client.get_json("/v1/placement/policy")
    if as_json:
        echo_json(doc)
        return
    print_table(("PREFIX", "MODE", "PIN", "TIER"), _policy_rows(doc["policies"]))


@policy.command("set")
@click.argument("prefix")
@click.option("--mode", type=click.Choice(["write-back", "write-through", "cache-only"]))
@click.option("--pin/--no-pin", default=None)
@click.option("--tier", type=click.Choice(["mem", "hot", "warm"]), default=None,
              help="Where the prefix's data lives locally (warm needs warm_enabled).")
@json_option
@click.pass_obj
def policy_set(client: AdminClient, prefix: str, mode: str | None, pin: bool | None,
               tier: str | None, as_json: bool) -> None:
    """Set PREFIX's policy."""
    doc = client.call("PUT", "/v1/placement/policy",
                      {"prefix": prefix, "mode": mode, "pin": pin, "tier": tier})
    if as_json:
        echo_json(doc)
        return
    print_table(("PREFIX", "MODE", "PIN", "TIER"), _policy_rows([doc]))


@policy.command("rm")
@click.argument("prefix")
@json_option
@click.pass_obj
def policy_rm(client: AdminClient, prefix: str, as_json: bool) -> None:
    """Remove PREFIX's policy (its files follow the defaults, or a shorter prefix's policy)."""
    doc = client.call("DELETE", "/v1/placement/policy?" + urlencode({"prefix": prefix}))
    if as_json:
        echo_json(doc)
        return
    click.echo(f"removed the policy of {prefix or '(all)'}")


def _share(part: int, size: int) -> str:
    """How much of a file a tier holds: ``100%``, ``37%``, ``-`` (nothing)."""
    if part <= 0 or size <= 0:
        return "-"
    return f"{part * 100 // size}%" if part < size else "100%"


@cli.command("ls")
@click.argument("prefix")
@click.option("--limit", type=click.IntRange(1, 100_000), default=None,
              help="At most this many files (the daemon's default: 1000).")
@json_option
@click.pass_obj
def ls(client: AdminClient, prefix: str, limit: int | None, as_json: bool) -> None:
    """Files under PREFIX and where each is: the share on each tier, dirty or clean, pin."""
    query = {"prefix": prefix, **({"limit": str(limit)} if limit else {})}
    doc = client.get_json("/v1/placement/ls?" + urlencode(query))
    if as_json:
        echo_json(doc)
        return
    tiers = [t for t in doc["tiers"] if t in ("mem", "hot", "warm", "cold")]
    print_table(("KEY", "SIZE", "STATE", *(t.upper() for t in tiers), "PIN"), [
        (f["key"], human_bytes(f["size"]), f["state"],
         *(_share(f["tiers"].get(t, 0), f["size"]) for t in tiers),
         "yes" if f["policy"]["pin"] else "no") for f in doc["files"]])
    if doc["truncated"]:
        click.echo(f"(the first {doc['limit']} files: narrow the prefix or raise --limit)",
                   err=True)


@cli.command()
@click.argument("prefix", default="")
@json_option
@click.pass_obj
def du(client: AdminClient, prefix: str, as_json: bool) -> None:
    """Bytes under PREFIX per tier, and dirty bytes."""
    doc = client.get_json("/v1/placement/du?prefix=" + quote(prefix))
    if as_json:
        echo_json(doc)
        return
    t = doc["tiers"]
    names = [n for n in ("mem", "hot", "warm", "cold") if n in t]
    print_table(("PREFIX", "FILES", "BYTES", *(n.upper() for n in names), "DIRTY"), [
        (prefix or "(all)", doc["files"], human_bytes(doc["bytes"]),
         *(human_bytes(t[n]) for n in names), human_bytes(doc["dirty"]))])


@cli.command("import")
@click.argument("prefix")
@json_option
@click.pass_obj
def import_(client: AdminClient, prefix: str, as_json: bool) -> None:
    """Import every object under PREFIX in the cold store into the namespace now."""
    try:
        doc = client.call("POST", "/v1/placement/import", {"prefix": prefix}, timeout=3600)
    except AdminError as e:
        fail(f"import {prefix}: {e}")
    if as_json:
        echo_json(doc)
        return
    click.echo(f"imported {doc['imported']} entries")
