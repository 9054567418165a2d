"""``tierctl pool ...`` (the memory pool) and ``tierctl ckpt ...`` (checkpoints)."""

from __future__ import annotations

from urllib.parse import urlencode

import click

from .cli_common import (
    SIZE,
    AdminClient,
    echo_json,
    human_bytes,
    print_fields,
    print_table,
    usage_bar,
)
from .cli_root import cli, json_option


@cli.group()
def pool() -> None:
    """The memory pool: status, tenant quotas, forced frees."""


@pool.command("status")
@json_option
@click.pass_obj
def pool_status(client: AdminClient, as_json: bool) -> None:
    """Capacity, use per tenant, fragmentation, bytes moved, regions."""
    doc = client.get_json("/v1/pool")
    if as_json:
        echo_json(doc)
        return
    use = usage_bar(doc["used"], doc["capacity"])
    use.append(f"  {human_bytes(doc['used'])} of {human_bytes(doc['capacity'])}")
    print_fields([
        ("used", use),
        ("free", f"{human_bytes(doc['free'])} (largest {human_bytes(doc['largest_free'])}, "
                 f"fragmentation {doc['fragmentation']:.2f})"),
        ("regions", doc["regions"]),
        ("moved", f"in {human_bytes(doc['bytes_moved_in'])}, out "
                  f"{human_bytes(doc['bytes_moved_out'])}"),
        ("socket", doc["socket"]),
    ])
    if doc["tenants"]:
        click.echo()
        print_table(("TENANT", "USED", "QUOTA", "REGIONS"), [
            (tenant, human_bytes(t["used"]), human_bytes(t["quota"]), t["regions"])
            for tenant, t in doc["tenants"].items()])
    if doc["region_list"]:
        click.echo()
        print_table(("REGION", "TENANT", "SIZE", "PERSISTENT", "NAME"), [
            (r["id"], r["tenant"], human_bytes(r["size"]),
             "yes" if r["persistent"] else "no", r["name"] or "-")
            for r in doc["region_list"]])


@pool.group("quota")
def pool_quota() -> None:
    """Tenant quotas."""


@pool_quota.command("set")
@click.argument("tenant", type=click.IntRange(min=0))
@click.argument("nbytes", metavar="BYTES", type=SIZE)
@json_option
@click.pass_obj
def pool_quota_set(client: AdminClient, tenant: int, nbytes: int, as_json: bool) -> None:
    """Limit TENANT (a uid) to BYTES of pool memory (e.g. 8GiB; 0: back to the default)."""
    doc = client.call("PUT", f"/v1/pool/quota/{tenant}", {"bytes": nbytes})
    if as_json:
        echo_json(doc)
        return
    click.echo(f"tenant {tenant}: quota {human_bytes(doc['quota'])}, "
               f"using {human_bytes(doc['used'])}")


@pool.command("free")
@click.argument("region", type=click.IntRange(min=1))
@json_option
@click.pass_obj
def pool_free(client: AdminClient, region: int, as_json: bool) -> None:
    """Free REGION now, whoever holds it."""
    doc = client.call("DELETE", f"/v1/pool/regions/{region}")
    if as_json:
        echo_json(doc)
        return
    click.echo(f"freed region {doc['freed']} ({human_bytes(doc['size'])} of tenant "
               f"{doc['tenant']})")


@cli.group()
def ckpt() -> None:
    """Checkpoints."""


@ckpt.command("list")
@click.argument("run", required=False)
@click.option("--bucket", default=None,
              help="The runs' bucket [default: checkpoints; without RUN and --bucket, also "
              "every run the daemon has seen since it started].")
@json_option
@click.pass_obj
def ckpt_list(client: AdminClient, run: str | None, bucket: str | None,
              as_json: bool) -> None:
    """Steps of RUN and where each is: committed (pool only), local (hot), persisted.
    Without RUN: every run, with its newest step."""
    if run is None:
        doc = client.get_json("/v1/ckpt" + ("?" + urlencode({"bucket": bucket})
                                            if bucket else ""))
        if as_json:
            echo_json(doc)
            return
        if not doc["runs"]:
            click.echo(f"no checkpoint runs in {bucket or 'checkpoints'}")
            return
        rows = []
        for r in doc["runs"]:
            last = r["steps"][-1] if r["steps"] else None
            rows.append((f"{r['bucket']}/{r['run']}", len(r["steps"]),
                         "-" if last is None else last["step"],
                         "-" if last is None else last["state"],
                         "-" if last is None or last["size"] is None
                         else human_bytes(last["size"])))
        print_table(("RUN", "STEPS", "NEWEST", "STATE", "SIZE"), rows)
        return
    bucket = bucket or "checkpoints"
    doc = client.get_json("/v1/ckpt?" + urlencode({"run": run, "bucket": bucket}))
    if as_json:
        echo_json(doc)
        return
    if not doc["steps"]:
        click.echo(f"{bucket}/{run}: no checkpoints")
        return
    print_table(("STEP", "STATE", "SIZE", "IN POOL"), [
        (s["step"], s["state"], human_bytes(s["size"]) if s["size"] is not None else "?",
         "yes" if s["in_pool"] else "no") for s in doc["steps"]])


@ckpt.command("rm")
@click.argument("run")
@click.argument("steps", metavar="STEP...", nargs=-1, required=True,
                type=click.IntRange(min=0))
@click.option("--bucket", default="checkpoints", show_default=True)
@json_option
@click.pass_obj
def ckpt_rm(client: AdminClient, run: str, steps: tuple[int, ...], bucket: str,
            as_json: bool) -> None:
    """Remove checkpoint STEP(s) of RUN (from the pool, hot and cold)."""
    docs = [client.call("DELETE", "/v1/ckpt?" + urlencode(
        {"bucket": bucket, "run": run, "step": str(n)})) for n in steps]
    if as_json:
        echo_json(docs[0] if len(docs) == 1 else {"deleted": docs})
        return
    for d in docs:
        click.echo(f"removed step {d['deleted']} of {bucket}/{run}")
