"""The parts under the admin API, without a daemon: the secret box, the migration of old key
records, the user directory's rules, the key cache, the root-key bootstrap and the token."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import msgpack
import pytest

from tierd.acl.keys import KeyStore, bootstrap_root_key, migrate_keys, seal_key
from tierd.acl.secrets import KEY_FILE, SecretBox, SecretError, load_or_create_key
from tierd.acl.users import Directory, DirectoryError
from tierd.admin.auth import TOKEN_FILE, TokenError, bootstrap_admin_token
from tierd.meta import AccessKey, MetaStore


def test_secret_box(tmp_path: Path) -> None:
    box = SecretBox.from_data_dir(tmp_path)
    path = tmp_path / KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(path.read_bytes()) == 32
    sealed = box.seal("s3cr3t-value", "AKID")
    assert b"s3cr3t" not in sealed
    assert box.seal("s3cr3t-value", "AKID") != sealed  # a fresh nonce each time
    assert box.open(sealed, "AKID") == "s3cr3t-value"
    with pytest.raises(SecretError):
        box.open(sealed, "OTHERKEY")  # bound to its access key
    with pytest.raises(SecretError):
        SecretBox.ephemeral().open(sealed, "AKID")  # another data directory's key
    for damaged in (b"", b"\x01" + b"x" * 10, b"\x02" + sealed[1:],
                    sealed[:-1] + bytes([sealed[-1] ^ 1])):
        with pytest.raises(SecretError):
            box.open(damaged, "AKID")
    # the same file gives the same key; a loose mode is tightened; a bad file is refused
    os.chmod(path, 0o644)
    assert SecretBox.from_data_dir(tmp_path).open(sealed, "AKID") == "s3cr3t-value"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.write_bytes(b"short")
    with pytest.raises(SecretError, match="32 bytes"):
        load_or_create_key(path)


def test_migration_and_lookup() -> None:
    meta = MetaStore.open_memory()
    box = SecretBox.ephemeral()
    with meta.write() as tx:
        tx.put_access_key(AccessKey("OLDKEY1", "old-secret-1", 1000, 1000, [5], "alice"))
        tx.put_access_key(AccessKey("OLDKEY2", "old-secret-2", 1000, 1000, [5], "alice"))
        tx.put_access_key(AccessKey("OLDKEY3", "old-secret-3", 1001, 1001, [], ""))
        tx.put_access_key(AccessKey("OLDKEY4", "old-secret-4", 1000, 7, [], "impostor"))
    keys = KeyStore(meta, box)
    old = keys.lookup("OLDKEY1")  # readable before the migration too
    assert old is not None and old.secret == "old-secret-1"
    assert migrate_keys(meta, box) == (4, 1)
    assert migrate_keys(meta, box) == (0, 0)  # idempotent
    with meta.snapshot() as tx:
        assert all(k.secret == "" and k.secret_enc for k in tx.list_access_keys())
        assert [u.name for u in tx.list_users()] == ["alice"]  # uid 1000 taken: no impostor
    keys.invalidate()
    for n in (1, 2, 3, 4):
        k = keys.lookup(f"OLDKEY{n}")
        assert k is not None and k.secret == f"old-secret-{n}"
    assert keys.owner(1000).display_name == "alice"
    assert keys.lookup("") is None and keys.lookup("NOPE") is None
    # a key whose secret was sealed with another box is unusable, not an exception
    with meta.write() as tx:
        tx.put_access_key(seal_key(AccessKey("FOREIGN", "x" * 20, 1, 1), SecretBox.ephemeral()))
    assert keys.lookup("FOREIGN") is None


def test_records_from_before_encryption() -> None:
    """An AccessKey record as older versions wrote it (nine fields, secret in clear) decodes,
    works, and is encrypted by the migration."""
    meta = MetaStore.open_memory()
    box = SecretBox.ephemeral()
    old = msgpack.packb(["OLDFORM", "old-form-secret", 1200, 1200, [7], "olduser", True, False,
                         123], use_bin_type=True)
    with meta.write() as tx:
        tx.kv.put(b"KOLDFORM", old)
    keys = KeyStore(meta, box)
    k = keys.lookup("OLDFORM")
    assert k is not None and (k.secret, k.uid, k.groups, k.user) == (
        "old-form-secret", 1200, [7], "olduser")
    assert migrate_keys(meta, box) == (1, 1)
    with meta.snapshot() as tx:
        raw = tx.kv.get(b"KOLDFORM")
    assert raw is not None and b"old-form-secret" not in raw
    keys.invalidate()
    k = keys.lookup("OLDFORM")
    assert k is not None and k.secret == "old-form-secret" and k.uid == 1200


def test_directory_rules_and_cache() -> None:
    meta = MetaStore.open_memory()
    keys = KeyStore(meta)
    d = Directory(keys)
    bob = d.add_user("bob", 1500, groups=[20, 10, 20])
    assert (bob.gid, bob.groups, bob.admin) == (1500, [10, 20], False)
    new = d.add_key("bob")
    assert new.key.secret == "" and new.key.secret_enc and len(new.secret) == 40
    k = keys.lookup(new.key.access_key)
    assert k is not None and (k.secret, k.uid, k.groups) == (new.secret, 1500, [10, 20])
    # the cache follows changes made through the directory
    d.set_enabled(new.key.access_key, False)
    assert keys.lookup(new.key.access_key) is None
    d.set_enabled(new.key.access_key, True)
    assert keys.lookup(new.key.access_key) is not None
    assert [x.access_key for x in d.list_keys("bob")] == [new.key.access_key]
    assert d.list_users()[0][1] == 1
    with pytest.raises(DirectoryError) as e:
        d.add_user("bob", 1600)
    assert e.value.code == "conflict"
    with pytest.raises(DirectoryError):
        d.add_user("carol", 1500)  # uid taken
    assert d.delete_user("bob") == [new.key.access_key]
    assert keys.lookup(new.key.access_key) is None
    with pytest.raises(DirectoryError) as e:
        d.delete_user("root")
    assert e.value.code == "conflict"


def test_root_bootstrap(tmp_path: Path) -> None:
    meta = MetaStore.open_memory()
    box = SecretBox.from_data_dir(tmp_path)
    first = bootstrap_root_key(meta, tmp_path, env={}, box=box)
    again = bootstrap_root_key(meta, tmp_path, env={}, box=box)
    assert (again.access_key, again.secret) == (first.access_key, first.secret)
    assert first.secret in (tmp_path / "root-credentials").read_text()
    with meta.snapshot() as tx:
        stored = tx.get_access_key(first.access_key)
        user = tx.get_user("root")
    assert stored is not None and stored.secret == "" and stored.secret_enc
    assert user is not None and user.uid == 0 and user.admin
    # the environment's pair replaces it
    env = {"TIERD_ROOT_ACCESS_KEY": "ENVROOT", "TIERD_ROOT_SECRET_KEY": "env-root-secret"}
    k = bootstrap_root_key(meta, tmp_path, env=env, box=box)
    assert (k.access_key, k.secret) == ("ENVROOT", "env-root-secret")
    with meta.snapshot() as tx:
        assert tx.get_access_key(first.access_key) is None
    # the secrets key lost: the unreadable root key is replaced by a new one
    other = bootstrap_root_key(meta, tmp_path, env={}, box=SecretBox.ephemeral())
    assert other.access_key != "ENVROOT" and other.secret


def test_admin_token(tmp_path: Path) -> None:
    token = bootstrap_admin_token(tmp_path, env={})
    path = tmp_path / TOKEN_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_text().strip() == token
    assert bootstrap_admin_token(tmp_path, env={}) == token
    os.chmod(path, 0o644)
    assert bootstrap_admin_token(tmp_path, env={}) == token
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    chosen = "x" * 20
    assert bootstrap_admin_token(tmp_path, env={"TIERD_ADMIN_TOKEN": chosen}) == chosen
    assert path.read_text().strip() == chosen
    with pytest.raises(TokenError):
        bootstrap_admin_token(tmp_path, env={"TIERD_ADMIN_TOKEN": "short"})
