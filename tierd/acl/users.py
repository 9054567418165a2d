"""The user directory: users and their S3 access keys, managed through the admin API.

A :class:`~tierd.meta.User` is a name with a POSIX identity (uid, gid, supplementary groups)
and an admin flag (may call the admin API with a SigV4 signature).  Each user has any number
of access keys, each enabled or disabled; a key's secret is shown once, when it is created,
and stored encrypted (:mod:`tierd.acl.secrets`).

Deleting a user removes the user's keys (no request can act as the user any more) but never
touches files: they keep their uid and stay reachable by root and by whoever the modes allow,
and a new user given the same uid owns them again.

Every method runs one short metadata transaction and then invalidates the key cache of
:class:`~tierd.acl.keys.KeyStore`; callers on the event loop make the change durable with
``await meta.flush()``.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from tierd.acl.keys import (
    ROOT_USER,
    CredentialsError,
    KeyStore,
    check_pair,
    generate_pair,
    seal_key,
)
from tierd.meta import AccessKey, User

#: user names: what ``useradd`` accepts by default, and safe in logs, URLs and file names
_NAME = re.compile(r"[a-z_][a-z0-9_.-]{0,63}", re.IGNORECASE)
MAX_ID = 2**32 - 2  # (uid_t)-1 means "no change" to chown: never a real id
MAX_GROUPS = 64
MAX_KEYS_PER_USER = 100


class DirectoryError(ValueError):
    """A refused change: ``code`` is ``invalid``, ``not_found`` or ``conflict``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class NewKey:
    """A created key: the only time its secret leaves the daemon."""

    key: AccessKey
    secret: str


def _check_id(what: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ID:
        raise DirectoryError("invalid", f"{what} must be an integer from 0 to {MAX_ID}")
    return value


def check_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise DirectoryError("invalid", "a user name is 1 to 64 characters: letters, digits, "
                             "'_', '.', '-', not starting with a digit, '.' or '-'")
    return name


def user_doc(user: User, keys: int | None = None) -> dict[str, object]:
    doc: dict[str, object] = {"name": user.name, "uid": user.uid, "gid": user.gid,
                              "groups": list(user.groups), "admin": user.admin,
                              "created_ns": user.created_ns}
    if keys is not None:
        doc["keys"] = keys
    return doc


def key_doc(key: AccessKey) -> dict[str, object]:
    """What may be shown of a key: never the secret."""
    return {"access_key": key.access_key, "user": key.user, "enabled": key.enabled,
            "created_ns": key.created_ns}


class Directory:
    """Users and access keys (the admin API's backend for them)."""

    def __init__(self, keys: KeyStore) -> None:
        self.keys = keys
        self.meta = keys.meta

    # -- users -------------------------------------------------------------------------------
    def add_user(self, name: object, uid: object, gid: object = None,
                 groups: object = (), admin: object = False) -> User:
        name = check_name(name)
        uid = _check_id("uid", uid)
        gid = uid if gid is None else _check_id("gid", gid)
        if not isinstance(groups, list | tuple) or len(groups) > MAX_GROUPS:
            raise DirectoryError("invalid", f"groups must be a list of at most {MAX_GROUPS} "
                                 "group ids")
        group_ids = sorted({_check_id("group id", g) for g in groups})
        if not isinstance(admin, bool):
            raise DirectoryError("invalid", "admin must be true or false")
        user = User(name, uid, gid, group_ids, admin, time.time_ns())
        with self.meta.write() as tx:
            if tx.get_user(name) is not None:
                raise DirectoryError("conflict", f"user {name!r} already exists")
            for other in tx.list_users():
                if other.uid == uid:
                    raise DirectoryError("conflict", f"uid {uid} already belongs to user "
                                         f"{other.name!r}")
            tx.put_user(user)
        self.keys.invalidate()
        return user

    def get_user(self, name: str) -> User:
        with self.meta.snapshot() as tx:
            user = tx.get_user(name)
        if user is None:
            raise DirectoryError("not_found", f"no user {name!r}")
        return user

    def list_users(self) -> list[tuple[User, int]]:
        """Every user with its number of keys, by name."""
        with self.meta.snapshot() as tx:
            users = list(tx.list_users())
            counts: dict[str, int] = {}
            for k in tx.list_access_keys():
                counts[k.user] = counts.get(k.user, 0) + 1
        return [(u, counts.get(u.name, 0)) for u in users]

    def delete_user(self, name: str) -> list[str]:
        """Delete ``name`` and its keys (never its files); the removed key ids."""
        if name == ROOT_USER:
            raise DirectoryError("conflict", "the root user cannot be deleted (it owns the "
                                 "bootstrap credentials); disable or delete its keys instead")
        with self.meta.write() as tx:
            if not tx.delete_user(name):
                raise DirectoryError("not_found", f"no user {name!r}")
            removed = [k.access_key for k in tx.list_access_keys() if k.user == name]
            for ak in removed:
                tx.delete_access_key(ak)
        self.keys.invalidate()
        return removed

    # -- keys --------------------------------------------------------------------------------
    def add_key(self, user_name: str, access_key: object = None,
                secret: object = None) -> NewKey:
        """A new key for ``user_name``: generated, or the given pair (importing credentials
        from elsewhere)."""
        if access_key is None and secret is None:
            access, plain = generate_pair()
        elif isinstance(access_key, str) and isinstance(secret, str):
            try:
                check_pair(access_key, secret, ("access_key", "secret"))
            except CredentialsError as e:
                raise DirectoryError("invalid", str(e)) from None
            access, plain = access_key, secret
        else:
            raise DirectoryError("invalid", "give both access_key and secret (strings), or "
                                 "neither to have them generated")
        with self.meta.write() as tx:
            user = tx.get_user(user_name)
            if user is None:
                raise DirectoryError("not_found", f"no user {user_name!r}")
            if tx.get_access_key(access) is not None:
                raise DirectoryError("conflict", f"access key {access} already exists")
            owned = sum(1 for k in tx.list_access_keys() if k.user == user_name)
            if owned >= MAX_KEYS_PER_USER:
                raise DirectoryError("conflict", f"user {user_name!r} already has "
                                     f"{MAX_KEYS_PER_USER} keys; delete some first")
            stored = seal_key(AccessKey(access, plain, user.uid, user.gid, list(user.groups),
                                        user.name, True, user.admin, time.time_ns()),
                              self.keys.box)
            tx.put_access_key(stored)
        self.keys.invalidate()
        return NewKey(stored, plain)

    def list_keys(self, user_name: str | None = None) -> list[AccessKey]:
        """Keys (of one user, or all), as stored: secrets stay sealed."""
        with self.meta.snapshot() as tx:
            if user_name is not None and tx.get_user(user_name) is None:
                raise DirectoryError("not_found", f"no user {user_name!r}")
            return [k for k in tx.list_access_keys()
                    if user_name is None or k.user == user_name]

    def set_enabled(self, access_key: str, enabled: bool) -> AccessKey:
        with self.meta.write() as tx:
            key = tx.get_access_key(access_key)
            if key is None:
                raise DirectoryError("not_found", f"no access key {access_key}")
            key.enabled = enabled
            tx.put_access_key(key)
        self.keys.invalidate()
        return key

    def delete_key(self, access_key: str) -> AccessKey:
        with self.meta.write() as tx:
            key = tx.get_access_key(access_key)
            if key is None or not tx.delete_access_key(access_key):
                raise DirectoryError("not_found", f"no access key {access_key}")
        self.keys.invalidate()
        return key
