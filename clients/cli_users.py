"""``tierctl user ...`` and ``tierctl key ...``: users and their S3 access keys."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlencode

import click

from .cli_common import AdminClient, echo_json, fail, print_table, when
from .cli_root import cli, json_option


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
@json_option
@click.pass_obj
def user_add(client: AdminClient, name: str, uid: int, gid: int | None, groups: str,
             admin: bool, as_json: bool) -> None:
    """Add user NAME."""
    try:
        gids = [int(g) for g in groups.replace(" ", "").split(",") if g]
    except ValueError:
        fail(f"--groups must be comma-separated numbers, not {groups!r}", 2)
    doc = client.call("POST", "/v1/users", {
        "name": name, "uid": uid, "gid": gid, "groups": gids, "admin": admin})
    if as_json:
        echo_json(doc)
        return
    click.echo(f"added user {doc['name']} (uid {doc['uid']}, gid {doc['gid']}"
               f"{', admin' if doc['admin'] else ''})")


@user.command("list")
@json_option
@click.pass_obj
def user_list(client: AdminClient, as_json: bool) -> None:
    """List users."""
    doc = client.get_json("/v1/users")
    if as_json:
        echo_json(doc)
        return
    print_table(("NAME", "UID", "GID", "GROUPS", "ADMIN", "KEYS", "CREATED"), [
        (u["name"], u["uid"], u["gid"], ",".join(map(str, u["groups"])) or "-",
         "yes" if u["admin"] else "no", u.get("keys", 0), when(u["created_ns"]))
        for u in doc["users"]])


@user.command("rm")
@click.argument("name")
@json_option
@click.pass_obj
def user_rm(client: AdminClient, name: str, as_json: bool) -> None:
    """Delete user NAME and its access keys (its files stay, owned by its uid)."""
    doc = client.call("DELETE", "/v1/users/" + quote(name, safe=""), {})
    if as_json:
        echo_json(doc)
        return
    removed = doc["keys_removed"]
    click.echo(f"deleted user {name}" + (f" and its keys {', '.join(removed)}" if removed
                                         else ""))


@cli.group()
def key() -> None:
    """S3 access keys of users (the secret is shown once, at creation)."""


@key.command("add")
@click.argument("user_name", metavar="USER")
@json_option
@click.pass_obj
def key_add(client: AdminClient, user_name: str, as_json: bool) -> None:
    """Create an access key for USER and print its secret (shown only this once)."""
    doc = client.call("POST", "/v1/keys", {"user": user_name})
    if as_json:
        echo_json(doc)
        return
    click.echo(f"access key  {doc['access_key']}\nsecret      {doc['secret']}\n"
               "(the secret is not shown again: store it now)")


@key.command("list")
@click.option("--user", "user_name", default=None, help="Only this user's keys.")
@json_option
@click.pass_obj
def key_list(client: AdminClient, user_name: str | None, as_json: bool) -> None:
    """List access keys (never their secrets)."""
    path = "/v1/keys" + ("?" + urlencode({"user": user_name}) if user_name else "")
    doc = client.get_json(path)
    if as_json:
        echo_json(doc)
        return
    print_table(("ACCESS KEY", "USER", "STATUS", "CREATED"), [
        (k["access_key"], k["user"] or "-", "enabled" if k["enabled"] else "disabled",
         when(k["created_ns"])) for k in doc["keys"]])


def _key_action(client: AdminClient, access_key: str, method: str,
                suffix: str) -> dict[str, Any]:
    return client.call(method, "/v1/keys/" + quote(access_key, safe="") + suffix, {})


@key.command("disable")
@click.argument("access_key")
@json_option
@click.pass_obj
def key_disable(client: AdminClient, access_key: str, as_json: bool) -> None:
    """Disable ACCESS_KEY (requests signed with it are refused until enabled)."""
    doc = _key_action(client, access_key, "POST", "/disable")
    echo_json(doc) if as_json else click.echo(f"disabled {access_key}")


@key.command("enable")
@click.argument("access_key")
@json_option
@click.pass_obj
def key_enable(client: AdminClient, access_key: str, as_json: bool) -> None:
    """Enable ACCESS_KEY again."""
    doc = _key_action(client, access_key, "POST", "/enable")
    echo_json(doc) if as_json else click.echo(f"enabled {access_key}")


@key.command("rm")
@click.argument("access_key")
@json_option
@click.pass_obj
def key_rm(client: AdminClient, access_key: str, as_json: bool) -> None:
    """Delete ACCESS_KEY."""
    doc = _key_action(client, access_key, "DELETE", "")
    echo_json(doc) if as_json else click.echo(f"deleted {access_key}")
