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
@click.argument("run")
@click.option("--bucket", default="checkpoints", show_default=True)
@json_option
@click.pass_obj
def ckpt_list(client: AdminClient, run: str, bucket: str, as_json: bool) -> None:
    """Steps of RUN and where each is: committed (pool only), local (hot), persisted."""
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
