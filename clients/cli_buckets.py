"""``tierctl bucket ...`` (buckets and their S3 policies) and ``tierctl mount ...`` (the
daemon's FUSE mount, attached while it runs).

Buckets: ``/v1/buckets`` -- the same namespace calls as S3's CreateBucket/DeleteBucket and
the same policy store as PutBucketPolicy, so what tierctl does here the S3 door and the
mount see at once.  Mounts: ``/v1/mounts`` -- a running daemon holds its data directory, so
``tierd serve --mount`` beside it is refused; ``tierctl mount add DIR`` asks that daemon to
mount its namespace instead.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import click

from .cli_common import AdminClient, echo_json, fail, print_table
from .cli_root import cli, json_option


def _bucket_path(name: str, suffix: str = "") -> str:
    return "/v1/buckets/" + quote(name, safe="") + suffix


@cli.group()
def bucket() -> None:
    """Buckets (the top-level directories of the mount) and their S3 bucket policies."""


@bucket.command("list")
@json_option
@click.pass_obj
def bucket_list(client: AdminClient, as_json: bool) -> None:
    """List buckets: owner, creation time, policy."""
    doc = client.get_json("/v1/buckets")
    if as_json:
        echo_json(doc)
        return
    if not doc["buckets"]:
        click.echo("no buckets (tierctl bucket create NAME makes one)")
        return
    print_table(("NAME", "OWNER", "CREATED", "ACL", "POLICY"), [
        (b["name"], b["owner"] or f"uid {b['owner_uid']}", b["created"], b["acl"],
         ("public" if b["public"] else "yes") if b["policy"] else "-")
        for b in doc["buckets"]])


@bucket.command("create")
@click.argument("name")
@click.option("--owner", metavar="USER", default=None,
              help="The tierd user who owns it (default: root).")
@json_option
@click.pass_obj
def bucket_create(client: AdminClient, name: str, owner: str | None, as_json: bool) -> None:
    """Create bucket NAME (S3 naming rules: 3-63 lowercase letters, digits, '.', '-')."""
    body: dict[str, Any] = {"name": name}
    if owner is not None:
        body["owner"] = owner
    doc = client.call("POST", "/v1/buckets", body)
    if as_json:
        echo_json(doc)
        return
    click.echo(f"created bucket {doc['name']} (owner {doc['owner'] or doc['owner_uid']})")


@bucket.command("rm")
@click.argument("name")
@json_option
@click.pass_obj
def bucket_rm(client: AdminClient, name: str, as_json: bool) -> None:
    """Remove bucket NAME, which must be empty."""
    doc = client.call("DELETE", _bucket_path(name))
    if as_json:
        echo_json(doc)
        return
    click.echo(f"removed bucket {name}")


@bucket.group("policy")
def bucket_policy() -> None:
    """A bucket's S3 policy (the IAM subset of docs/permissions.md)."""


@bucket_policy.command("get")
@click.argument("name")
@json_option
@click.pass_obj
def bucket_policy_get(client: AdminClient, name: str, as_json: bool) -> None:
    """Print NAME's policy document (JSON)."""
    doc = client.get_json(_bucket_path(name, "/policy"))
    echo_json(doc if as_json else doc["policy"])


@bucket_policy.command("set")
@click.argument("name")
@click.argument("policy_file", metavar="FILE", type=click.File("rb"))
@json_option
@click.pass_obj
def bucket_policy_set(client: AdminClient, name: str, policy_file: Any,
                      as_json: bool) -> None:
    """Set NAME's policy from FILE ('-': standard input), checked as S3 PutBucketPolicy
    checks it."""
    raw = policy_file.read()
    try:
        policy = json.loads(raw)
    except ValueError as e:
        fail(f"{policy_file.name}: not a JSON document: {e}", 2)
    doc = client.call("PUT", _bucket_path(name, "/policy"), policy)
    if as_json:
        echo_json(doc)
        return
    click.echo(f"set the policy of {name}" + (" (public: it allows everyone something)"
                                               if doc["public"] else ""))


@bucket_policy.command("rm")
@click.argument("name")
@json_option
@click.pass_obj
def bucket_policy_rm(client: AdminClient, name: str, as_json: bool) -> None:
    """Remove NAME's policy."""
    doc = client.call("DELETE", _bucket_path(name, "/policy"))
    if as_json:
        echo_json(doc)
        return
    click.echo(f"removed the policy of {name}" if doc["deleted"]
               else f"{name} had no policy")


# -- mounts ------------------------------------------------------------------------------------

def _local(client: AdminClient) -> bool:
    """Whether the daemon is on this machine (its admin URL is a loopback address)."""
    host = urlsplit(client.url).hostname or ""
    return host in ("localhost", "::1") or host.startswith("127.")


@cli.group()
def mount() -> None:
    """The daemon's FUSE mount: attach it to the running daemon, remove it, list it."""


@mount.command("list")
@json_option
@click.pass_obj
def mount_list(client: AdminClient, as_json: bool) -> None:
    """The daemon's mount (one per daemon), if any."""
    doc = client.get_json("/v1/mounts")
    if as_json:
        echo_json(doc)
        return
    if not doc["mounts"]:
        click.echo("no mount (tierctl mount add DIR attaches one)")
        return
    print_table(("MOUNTPOINT", "DOOR", "SOURCE"),
                [(m["mountpoint"], m["door"], m.get("source", "/")) for m in doc["mounts"]])


@mount.command("add")
@click.argument("directory", type=click.Path(file_okay=False))
@json_option
@click.pass_obj
def mount_add(client: AdminClient, directory: str, as_json: bool) -> None:
    """Mount the namespace at DIRECTORY (an empty directory; created when the daemon is on
    this machine).  Buckets are its top-level directories."""
    path = os.path.abspath(directory)
    if _local(client) and not os.path.exists(path):
        try:
            os.makedirs(path)
        except OSError as e:  # the daemon's answer then says what to do
            print(f"tierctl: note: cannot create {path}: {e.strerror}", file=sys.stderr)
    doc = client.call("POST", "/v1/mounts", {"mountpoint": path}, timeout=60)
    if as_json:
        echo_json(doc)
        return
    click.echo(f"mounted at {doc['mountpoint']} (tierctl mount rm {doc['mountpoint']} "
               "removes it)")


@mount.command("rm")
@click.argument("directory", type=click.Path(file_okay=False))
@json_option
@click.pass_obj
def mount_rm(client: AdminClient, directory: str, as_json: bool) -> None:
    """Unmount DIRECTORY (processes with files open on it get ENOTCONN)."""
    path = os.path.abspath(directory)
    doc = client.call("DELETE", "/v1/mounts?" + urlencode({"mountpoint": path}), timeout=60)
    if as_json:
        echo_json(doc)
        return
    click.echo(f"unmounted {doc['mountpoint']}")
