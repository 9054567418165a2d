"""S3 access keys: lookup, the identity a key maps to, owners, and the root-key bootstrap.

Access keys are :class:`~tierd.meta.AccessKey` records in the metadata store, each belonging
to a :class:`~tierd.meta.User` (see :mod:`tierd.acl.users`, which creates and deletes them).
Secrets are stored encrypted (:mod:`tierd.acl.secrets`); :class:`KeyStore` decrypts on
lookup and keeps a small cache, invalidated by every change made through this process.

At start the daemon calls :func:`migrate_keys` (plaintext secrets of older stores are
encrypted, users are created for keys that name one) and then :func:`bootstrap_root_key`:
it takes ``TIERD_ROOT_ACCESS_KEY`` and ``TIERD_ROOT_SECRET_KEY`` when both are set (as MinIO
does with its root user), otherwise it keeps the root key created at first start or creates
one.  The credentials are written to ``<data_dir>/root-credentials`` (mode 0600) in the AWS
shared-credentials format, so ``AWS_SHARED_CREDENTIALS_FILE=<data_dir>/root-credentials aws
s3 ls ...`` works as it is.  No secret is ever logged.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import pwd
import secrets
import string
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tierd.acl.identity import Identity
from tierd.acl.secrets import SecretBox, SecretError, holds, write_private
from tierd.meta import AccessKey, MetaStore, MetaTxn, User

log = logging.getLogger("tierd.acl")

ROOT_USER = "root"
CREDENTIALS_FILE = "root-credentials"
ENV_ACCESS = "TIERD_ROOT_ACCESS_KEY"
ENV_SECRET = "TIERD_ROOT_SECRET_KEY"
_KEY_ALPHABET = string.ascii_uppercase + string.digits
_SECRET_ALPHABET = string.ascii_letters + string.digits + "+/"
#: keys kept decrypted in memory; past this the cache starts again (a flood of distinct
#: valid keys costs one lmdb read and one decryption each, as without a cache)
_CACHE_MAX = 4096


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


def resolve(key: AccessKey, box: SecretBox) -> AccessKey:
    """The in-memory form of a stored key: the secret in clear.  The identity is the key's
    own copy of its user's (made when the key was created: users are never changed, only
    deleted with their keys), so a key written by an older version or a tool keeps exactly
    the identity it was given.  Raises :class:`SecretError` when the secret does not
    decrypt."""
    secret = box.open(key.secret_enc, key.access_key) if key.secret_enc else key.secret
    return dataclasses.replace(key, secret=secret, secret_enc=b"")


class KeyStore:
    """Access-key lookups for the S3 door and the admin API.

    Every signed request looks its key up, so resolved keys are cached in memory; whatever
    changes users or keys calls :meth:`invalidate` (:class:`tierd.acl.users.Directory` does).
    """

    def __init__(self, meta: MetaStore, box: SecretBox | None = None) -> None:
        self.meta = meta
        self.box = box if box is not None else SecretBox.ephemeral()
        self._names: dict[int, str] = {}
        self._cache: dict[str, AccessKey] = {}
        self._lock = threading.Lock()  # lookups may come from worker threads too
        self._warned: set[str] = set()
        #: bumped by :meth:`invalidate`: a lookup that read the store before a change does
        #: not cache what it read after the change was made
        self._generation = 0

    def invalidate(self) -> None:
        """Forget cached keys and owner names (after any user or key change)."""
        with self._lock:
            self._generation += 1
            self._cache.clear()
            self._names.clear()

    def lookup(self, access_key: str) -> AccessKey | None:
        """The enabled key (secret in clear), or None (unknown, disabled, or its secret does
        not decrypt)."""
        if not access_key:
            return None
        cached = self._cache.get(access_key)
        if cached is not None:
            return cached
        generation = self._generation
        with self.meta.snapshot() as tx:
            key = tx.get_access_key(access_key)
        if key is None or not key.enabled:
            return None
        try:
            resolved = resolve(key, self.box)
        except SecretError as e:
            if access_key not in self._warned:
                self._warned.add(access_key)
                log.warning("access key %s is unusable: %s", access_key, e)
            return None
        with self._lock:
            if generation == self._generation:
                if len(self._cache) >= _CACHE_MAX:
                    self._cache.clear()
                self._cache[access_key] = resolved
        return resolved

    def owner(self, uid: int) -> Owner:
        """Owner of ``uid``: the name of its user, else of its access keys, else of the
        local passwd entry, else ``uid-N``."""
        name = self._names.get(uid)
        if name is None:
            name = self._name_of(uid)
            if name is None:
                try:
                    name = pwd.getpwuid(uid).pw_name
                except KeyError:
                    name = f"uid-{uid}"
            self._names[uid] = name
        return Owner(canonical_user_id(uid), name)

    def _name_of(self, uid: int) -> str | None:
        with self.meta.snapshot() as tx:
            for user in tx.list_users():
                if user.uid == uid:
                    return user.name
            for key in tx.list_access_keys():
                if key.uid == uid and key.user:
                    return key.user
        return None


def check_pair(access: str, secret: str, what: tuple[str, str] = (ENV_ACCESS, ENV_SECRET)
               ) -> None:
    """Reject access keys and secrets a client could not send or a file could not hold."""
    if not 3 <= len(access) <= 128 or not access.isprintable() or any(
            c in access for c in " /:=,"):
        raise CredentialsError(f"{what[0]} must be 3 to 128 printable characters "
                               "without spaces, '/', ':', '=' or ','")
    if not 8 <= len(secret) <= 128 or not secret.isprintable():
        raise CredentialsError(f"{what[1]} must be 8 to 128 printable characters")


def generate_pair() -> tuple[str, str]:
    access = "TIERD" + "".join(secrets.choice(_KEY_ALPHABET) for _ in range(15))
    secret = "".join(secrets.choice(_SECRET_ALPHABET) for _ in range(40))
    return access, secret


def seal_key(key: AccessKey, box: SecretBox) -> AccessKey:
    """The record to store for ``key``: the secret encrypted, no plaintext."""
    return dataclasses.replace(key, secret="", secret_enc=box.seal(key.secret,
                                                                    key.access_key))


def migrate_keys(meta: MetaStore, box: SecretBox) -> tuple[int, int]:
    """Bring older stores up to date (idempotent): encrypt plaintext secrets, and create a
    :class:`User` for every key naming a user that has no record (with the key's uid, gid,
    groups and admin flag; skipped when another user already has that uid).  Returns
    (keys encrypted, users created)."""
    sealed = created = 0
    with meta.write() as tx:
        users = {u.name: u for u in tx.list_users()}
        uids = {u.uid: u.name for u in users.values()}
        for key in list(tx.list_access_keys()):
            if key.secret and not key.secret_enc:
                tx.put_access_key(seal_key(key, box))
                sealed += 1
            if key.user and key.user not in users and uids.get(key.uid, key.user) == key.user:
                user = User(key.user, key.uid, key.gid, list(key.groups), key.admin,
                            key.created_ns or time.time_ns())
                tx.put_user(user)
                users[user.name], uids[user.uid] = user, user.name
                created += 1
    if sealed or created:
        meta.sync()
        log.info("access keys migrated: %d secrets encrypted, %d users created",
                 sealed, created)
    return sealed, created


def _root_keys(tx: MetaTxn) -> list[AccessKey]:
    return [k for k in tx.list_access_keys()
            if k.admin and k.uid == 0 and k.user == ROOT_USER]


def write_credentials_file(path: Path, key: AccessKey) -> None:
    """Write the credentials atomically with mode 0600 (never readable by others), unless
    the file holds them already (start-up writes nothing that is there: it must work on a
    full disk)."""
    text = (
        "# tierd root S3 credentials (uid 0, admin).  Keep this file secret.\n"
        "# Use it directly: AWS_SHARED_CREDENTIALS_FILE=<this file> aws --endpoint-url ...\n"
        "[default]\n"
        f"aws_access_key_id = {key.access_key}\n"
        f"aws_secret_access_key = {key.secret}\n"
    )
    if not holds(path, text.encode()):
        write_private(path, text.encode())


def _same_key(stored: AccessKey | None, key: AccessKey, box: SecretBox) -> bool:
    """Whether ``stored`` already is ``key`` (same owner, flags and secret)."""
    if stored is None or not stored.enabled or stored.user != key.user:
        return False
    try:
        return resolve(stored, box).secret == key.secret
    except SecretError:
        return False


def _root_user(tx: MetaTxn) -> User:
    user = tx.get_user(ROOT_USER)
    if user is None or user.uid != 0 or not user.admin:
        user = User(ROOT_USER, 0, 0, [], True, user.created_ns if user else time.time_ns())
        tx.put_user(user)
    return user


def bootstrap_root_key(meta: MetaStore, data_dir: Path,
                       env: Mapping[str, str] | None = None,
                       box: SecretBox | None = None) -> AccessKey:
    """Make sure the root user and its access key exist and the credentials file is current.

    With both environment variables set, that pair becomes the root key (replacing an
    earlier root key); with one of them only, :class:`CredentialsError`.  Otherwise the existing
    root key is kept, or a random one is created at first start (also when the existing one
    cannot be decrypted: the secrets key file was lost).  Returns the key, secret in clear.
    """
    env = os.environ if env is None else env
    box = box if box is not None else SecretBox.from_data_dir(data_dir)
    access, secret = env.get(ENV_ACCESS, ""), env.get(ENV_SECRET, "")
    if bool(access) != bool(secret):
        raise CredentialsError(f"set both {ENV_ACCESS} and {ENV_SECRET}, or neither")
    path = data_dir / CREDENTIALS_FILE
    if access:
        check_pair(access, secret)
    key: AccessKey | None = None
    with meta.write() as tx:
        existing = sorted(_root_keys(tx), key=lambda k: k.created_ns)
        _root_user(tx)
        if access:
            key = AccessKey(access_key=access, secret=secret, uid=0, gid=0, groups=[],
                            user=ROOT_USER, enabled=True, admin=True,
                            created_ns=time.time_ns())
            other = tx.get_access_key(access)
            if other is not None and (other.uid != 0 or not other.admin):
                raise CredentialsError(f"{ENV_ACCESS} names an access key that belongs to "
                                       f"another user (uid {other.uid})")
            for old in existing:
                if old.access_key != access:
                    tx.delete_access_key(old.access_key)
            if other is not None:
                key.created_ns = other.created_ns
            if not _same_key(other, key, box):  # (no write at each start: a full disk)
                tx.put_access_key(seal_key(key, box))
            source = "environment"
        else:
            for old in existing:
                try:
                    key = resolve(old, box)
                    break
                except SecretError as e:
                    log.warning("root access key %s is unusable (%s); replacing it",
                                old.access_key, e)
                    tx.delete_access_key(old.access_key)
            source = "existing"
            if key is None:
                access, secret = generate_pair()
                key = AccessKey(access_key=access, secret=secret, uid=0, gid=0, groups=[],
                                user=ROOT_USER, enabled=True, admin=True,
                                created_ns=time.time_ns())
                tx.put_access_key(seal_key(key, box))
                source = "generated"
    meta.sync()
    write_credentials_file(path, key)
    log.info("root S3 credentials (access key %s, source %s) are in %s",
             key.access_key, source, path)
    return key
