"""S3 access keys: lookup, the identity a key maps to, owners, and the root-key bootstrap.

Access keys are :class:`~tierd.meta.AccessKey` records in the metadata store.  At start the
daemon calls :func:`bootstrap_root_key`: it takes ``TIERD_ROOT_ACCESS_KEY`` and
``TIERD_ROOT_SECRET_KEY`` when both are set (as MinIO does with its root user), otherwise it
keeps the root key created at first start or creates one.  The credentials are written to
``<data_dir>/root-credentials`` (mode 0600) in the AWS shared-credentials format, so
``AWS_SHARED_CREDENTIALS_FILE=<data_dir>/root-credentials aws s3 ls ...`` works as it is.
The secret is never logged.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pwd
import secrets
import string
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tierd.acl.identity import Identity
from tierd.meta import AccessKey, MetaStore

log = logging.getLogger("tierd.acl")

ROOT_USER = "root"
CREDENTIALS_FILE = "root-credentials"
ENV_ACCESS = "TIERD_ROOT_ACCESS_KEY"
ENV_SECRET = "TIERD_ROOT_SECRET_KEY"
_KEY_ALPHABET = string.ascii_uppercase + string.digits
_SECRET_ALPHABET = string.ascii_letters + string.digits + "+/"


class CredentialsError(ValueError):
    """Bad bootstrap credentials (the daemon refuses to start with the message)."""


@dataclass(frozen=True, slots=True)
class Owner:
    """The S3 owner of buckets and objects: a stable canonical id and a display name."""

    id: str
    display_name: str


def canonical_user_id(uid: int) -> str:
    """A stable 64-hex-digit canonical user id (the shape AWS uses) for a POSIX uid: the
    same user gets the same id through every key, restart and node."""
    return hashlib.sha256(f"tierd-user:{uid}".encode()).hexdigest()


def identity_of(key: AccessKey) -> Identity:
    return Identity(key.uid, key.gid, frozenset(key.groups))


class KeyStore:
    """Access-key lookups for the S3 door (one lmdb read per request: microseconds)."""

    def __init__(self, meta: MetaStore) -> None:
        self.meta = meta
        self._names: dict[int, str] = {}

    def lookup(self, access_key: str) -> AccessKey | None:
        """The enabled key record, or None (unknown or disabled)."""
        if not access_key:
            return None
        with self.meta.snapshot() as tx:
            key = tx.get_access_key(access_key)
        if key is None or not key.enabled:
            return None
        if key.user:
            self._names.setdefault(key.uid, key.user)
        return key

    def owner(self, uid: int) -> Owner:
        """Owner of ``uid``: the user name of its access keys, else of the local passwd
        entry, else ``uid-N``."""
        name = self._names.get(uid)
        if name is None:
            name = self._name_from_keys(uid)
            if name is None:
                try:
                    name = pwd.getpwuid(uid).pw_name
                except KeyError:
                    name = f"uid-{uid}"
            self._names[uid] = name
        return Owner(canonical_user_id(uid), name)

    def _name_from_keys(self, uid: int) -> str | None:
        with self.meta.snapshot() as tx:
            for key in tx.list_access_keys():
                if key.uid == uid and key.user:
                    return key.user
        return None


def _check_pair(access: str, secret: str) -> None:
    if not 3 <= len(access) <= 128 or not access.isprintable() or any(
            c in access for c in " /:=,"):
        raise CredentialsError(f"{ENV_ACCESS} must be 3 to 128 printable characters "
                               "without spaces, '/', ':', '=' or ','")
    if not 8 <= len(secret) <= 128 or not secret.isprintable():
        raise CredentialsError(f"{ENV_SECRET} must be 8 to 128 printable characters")


def generate_pair() -> tuple[str, str]:
    access = "TIERD" + "".join(secrets.choice(_KEY_ALPHABET) for _ in range(15))
    secret = "".join(secrets.choice(_SECRET_ALPHABET) for _ in range(40))
    return access, secret


def _root_keys(meta: MetaStore) -> list[AccessKey]:
    with meta.snapshot() as tx:
        return [k for k in tx.list_access_keys()
                if k.admin and k.uid == 0 and k.user == ROOT_USER]


def write_credentials_file(path: Path, key: AccessKey) -> None:
    """Write the credentials atomically with mode 0600 (never readable by others)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        text = (
            "# tierd root S3 credentials (uid 0, admin).  Keep this file secret.\n"
            "# Use it directly: AWS_SHARED_CREDENTIALS_FILE=<this file> aws --endpoint-url ...\n"
            "[default]\n"
            f"aws_access_key_id = {key.access_key}\n"
            f"aws_secret_access_key = {key.secret}\n"
        )
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def bootstrap_root_key(meta: MetaStore, data_dir: Path,
                       env: Mapping[str, str] | None = None) -> AccessKey:
    """Make sure the root access key exists and its credentials file is current.

    With both environment variables set, that pair becomes the root key (replacing an
    earlier root key); with one of them only, :class:`CredentialsError`.  Otherwise the existing
    root key is kept, or a random one is created at first start.
    """
    env = os.environ if env is None else env
    access, secret = env.get(ENV_ACCESS, ""), env.get(ENV_SECRET, "")
    if bool(access) != bool(secret):
        raise CredentialsError(f"set both {ENV_ACCESS} and {ENV_SECRET}, or neither")
    existing = _root_keys(meta)
    path = data_dir / CREDENTIALS_FILE
    if access:
        _check_pair(access, secret)
        key = AccessKey(access_key=access, secret=secret, uid=0, gid=0, groups=[],
                        user=ROOT_USER, enabled=True, admin=True, created_ns=time.time_ns())
        with meta.write() as tx:
            other = tx.get_access_key(access)
            if other is not None and (other.uid != 0 or not other.admin):
                raise CredentialsError(f"{ENV_ACCESS} names an access key that belongs to another "
                                f"user (uid {other.uid})")
            for old in existing:
                if old.access_key != access:
                    tx.delete_access_key(old.access_key)
            if other is not None:
                key.created_ns = other.created_ns
            tx.put_access_key(key)
        meta.sync()
        source = "environment"
    elif existing:
        key = min(existing, key=lambda k: k.created_ns)
        source = "existing"
    else:
        access, secret = generate_pair()
        key = AccessKey(access_key=access, secret=secret, uid=0, gid=0, groups=[],
                        user=ROOT_USER, enabled=True, admin=True, created_ns=time.time_ns())
        with meta.write() as tx:
            tx.put_access_key(key)
        meta.sync()
        source = "generated"
    write_credentials_file(path, key)
    log.info("root S3 credentials (access key %s, source %s) are in %s",
             key.access_key, source, path)
    return key
