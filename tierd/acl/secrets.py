"""Secrets at rest: S3 secret keys encrypted with a key kept in the data directory.

SigV4 verification needs the plaintext secret (the server recomputes the HMAC), so secrets
cannot be hashed like passwords; they are encrypted instead.  The encryption key is 32 random
bytes in ``<data_dir>/secrets.key`` (mode 0600, created at first start), separate from the
metadata store: a copy of the lmdb files alone (a backup, a shared metadata engine) does not
reveal any secret.  The nodes of a cluster share one database, so they derive the key from
the ``cluster_secret`` they share instead (:meth:`SecretBox.from_cluster_secret`).

The cipher is AES-256-GCM from ``cryptography``.  A sealed secret is
``version byte (1) | 12-byte random nonce | ciphertext+tag``, and the access key id is the
associated data, so a ciphertext moved onto another key's record fails to open instead of
granting that key the other's secret.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from tierd.tiers.fileio import fsync_dir, pwrite_all

KEY_FILE = "secrets.key"
_VERSION = b"\x01"
_NONCE = 12
_KEY_BYTES = 32


class SecretError(Exception):
    """A sealed secret that cannot be opened (wrong key file, damaged record)."""


class SecretBox:
    """Seals and opens secrets with one AES-256-GCM key."""

    def __init__(self, key: bytes) -> None:
        if len(key) != _KEY_BYTES:
            raise SecretError(f"the secrets key must be {_KEY_BYTES} bytes, not {len(key)}")
        self._aead = AESGCM(key)

    @classmethod
    def ephemeral(cls) -> SecretBox:
        """A box with a random key that lives as long as the process (tests, tools)."""
        return cls(AESGCM.generate_key(bit_length=_KEY_BYTES * 8))

    @classmethod
    def from_data_dir(cls, data_dir: Path) -> SecretBox:
        """The daemon's box: ``<data_dir>/secrets.key``, created (0600) when missing."""
        return cls(load_or_create_key(data_dir / KEY_FILE))

    @classmethod
    def from_cluster_secret(cls, cluster_secret: str) -> SecretBox:
        """The box of a node of a cluster: every node must open the keys any node sealed
        (they share one metadata database), so the key is derived (HKDF-SHA256) from the
        secret the nodes share rather than kept in one node's data directory."""
        key = HKDF(algorithm=hashes.SHA256(), length=_KEY_BYTES, salt=None,
                   info=b"tierd secrets at rest").derive(cluster_secret.encode())
        return cls(key)

    def seal(self, secret: str, bound_to: str) -> bytes:
        """``secret`` encrypted and bound to ``bound_to`` (the access key id)."""
        nonce = os.urandom(_NONCE)
        return _VERSION + nonce + self._aead.encrypt(nonce, secret.encode(), bound_to.encode())

    def open(self, sealed: bytes, bound_to: str) -> str:
        """The plaintext of :meth:`seal`'s output; :class:`SecretError` when it does not
        open with this key and ``bound_to``."""
        if len(sealed) < 1 + _NONCE + 16 or sealed[:1] != _VERSION:
            raise SecretError("not a sealed secret of a known version")
        nonce, body = sealed[1:1 + _NONCE], sealed[1 + _NONCE:]
        try:
            plain = self._aead.decrypt(nonce, body, bound_to.encode())
        except InvalidTag:
            raise SecretError("the secret does not open with this data directory's "
                              f"{KEY_FILE} (wrong key file or damaged record)") from None
        return plain.decode()


def load_or_create_key(path: Path) -> bytes:
    """The key in ``path``; a new random one (written atomically, mode 0600) when the file
    does not exist.  A file readable by others is tightened to 0600."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        key = AESGCM.generate_key(bit_length=_KEY_BYTES * 8)
        write_private(path, key)
        return key
    try:
        if os.fstat(fd).st_mode & 0o077:
            os.fchmod(fd, 0o600)
        key = os.read(fd, _KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(key) != _KEY_BYTES:
        raise SecretError(f"{path} must hold exactly {_KEY_BYTES} bytes (it is the key the "
                          "S3 secrets are encrypted with; restore it from a backup)")
    return key


def write_private(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` atomically with ``mode`` (by default 0600: never
    readable by others, not even for a moment: the temporary file is created so), fsynced
    and its name made durable.  On failure (a full disk) the temporary file is removed
    and ``path`` is left as it was."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        try:
            os.fchmod(fd, mode)
            pwrite_all(fd, data, 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def holds(path: Path, data: bytes, mode: int = 0o600) -> bool:
    """Whether ``path`` already holds exactly ``data``; a file holding it with another
    mode gets ``mode`` (a chmod needs no space, a rewrite might: start-up must work on a
    full disk)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        st = os.fstat(fd)
        if st.st_size != len(data) or os.read(fd, len(data) + 1) != data:
            return False
        if st.st_mode & 0o777 != mode:
            os.fchmod(fd, mode)
    finally:
        os.close(fd)
    return True
