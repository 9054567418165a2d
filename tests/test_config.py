"""Settings: defaults, precedence of the sources, and rejection messages naming key + source."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import platformdirs
import pytest

from tierd.config import (
    NON_SETTING_ENV,
    SETTINGS,
    Config,
    ConfigError,
    HostPort,
    ParseContext,
    load_config,
    parse_bool,
    parse_int,
    parse_size,
)

ROOT = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, text: str, name: str = "tierd.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def rejected(**kwargs: object) -> ConfigError:
    kwargs.setdefault("env", {})
    with pytest.raises(ConfigError) as info:
        load_config(**kwargs)  # type: ignore[arg-type]
    return info.value


# --- defaults -------------------------------------------------------------------------------


def test_defaults(tmp_path: Path) -> None:
    c = load_config(env={}, cwd=tmp_path)
    data = Path(platformdirs.user_data_dir("tierd"))
    assert c.data_dir == data
    assert c.s3_listen == HostPort("127.0.0.1", 9000)
    assert str(c.admin_listen) == "127.0.0.1:9001"
    assert c.mount is None
    assert (c.log_level, c.log_format, c.umask, c.region) == ("info", "text", 0o022, "us-east-1")
    assert (c.meta_dir, c.hot_dir, c.warm_dir, c.cold_dir) == (
        data / "meta",
        data / "hot",
        data / "warm",
        data / "cold",
    )
    assert c.lock_file == data / "tierd.lock"
    assert c == Config()


def test_config_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Config().log_level = "debug"  # type: ignore[misc]


def test_derived_dirs_follow_data_dir_but_can_be_overridden(tmp_path: Path) -> None:
    c = load_config(env={"TIERD_DATA_DIR": str(tmp_path / "d")}, cli={"cold_dir": "/srv/cold"})
    assert c.hot_dir == tmp_path / "d" / "hot"
    assert c.meta_dir == tmp_path / "d" / "meta"
    assert c.cold_dir == Path("/srv/cold")


# --- precedence -----------------------------------------------------------------------------


def test_precedence_defaults_file_env_cli(tmp_path: Path) -> None:
    cfg = write(
        tmp_path,
        'log_level = "debug"\nlog_format = "json"\nregion = "eu-west-1"\numask = "027"\n',
    )
    env = {"TIERD_CONFIG": str(cfg), "TIERD_LOG_FORMAT": "text", "TIERD_REGION": "eu-north-1"}
    c = load_config(env=env, cli={"region": "ap-south-1", "log_level": None})
    assert c.log_level == "debug"  # file beats default; CLI None means "not given"
    assert c.log_format == "text"  # env beats file
    assert c.region == "ap-south-1"  # CLI beats env
    assert c.umask == 0o027
    assert c.s3_listen == HostPort("127.0.0.1", 9000)  # untouched default


def test_config_flag_beats_tierd_config_env(tmp_path: Path) -> None:
    a = write(tmp_path, 'region = "from-env-file"\n', "a.toml")
    b = write(tmp_path, 'region = "from-flag-file"\n', "b.toml")
    c = load_config(env={"TIERD_CONFIG": str(a)}, config_file=b)
    assert c.region == "from-flag-file"


def test_relative_paths_in_file_are_relative_to_the_file(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    cfg = write(tmp_path / "etc", 'data_dir = "../var"\nhot_dir = "~/hot"\n')
    c = load_config(env={}, config_file=cfg, cwd=Path("/"))
    assert c.data_dir == tmp_path / "var"
    assert c.hot_dir == Path.home() / "hot"
    c = load_config(env={"TIERD_DATA_DIR": "rel"}, cwd=tmp_path)
    assert c.data_dir == tmp_path / "rel"


def test_value_forms(tmp_path: Path) -> None:
    c = load_config(
        env={"TIERD_UMASK": "0o077", "TIERD_LOG_LEVEL": "WARNING", "TIERD_MOUNT": ""},
        cli={"s3_listen": "[::1]:0", "admin_listen": "localhost:65535"},
    )
    assert c.umask == 0o077
    assert c.log_level == "warning"
    assert c.mount is None
    assert c.s3_listen == HostPort("::1", 0) and str(c.s3_listen) == "[::1]:0"
    assert c.admin_listen == HostPort("localhost", 65535)
    c = load_config(env={}, config_file=write(tmp_path, "umask = 0o007\nmount = '/mnt/t'\n"))
    assert c.umask == 0o007
    assert c.mount == Path("/mnt/t")


def test_documented_non_setting_env_vars_are_ignored() -> None:
    env = {name: "x" for name in NON_SETTING_ENV if name != "TIERD_CONFIG"}
    env["PATH"] = "/bin"
    assert load_config(env=env) == Config()


# --- rejections name the key and the source -------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("s3_listen", "nope", "HOST:PORT"),
        ("s3_listen", "127.0.0.1:", "not a number"),
        ("admin_listen", "127.0.0.1:65536", "out of range"),
        ("admin_listen", "::1:9000", "brackets"),
        ("s3_listen", "bad host:1", "not a valid host"),
        ("s3_listen", "[zz]:1", "IPv6"),
        ("log_level", "loud", "debug, info"),
        ("log_format", "xml", "text, json"),
        ("umask", "089", "octal"),
        ("umask", "1777", "out of range"),
        ("region", "Not A Region", "region"),
        ("data_dir", "", "empty"),
    ],
)
def test_bad_env_values_name_key_and_variable(key: str, value: str, why: str) -> None:
    env_name = "TIERD_" + key.upper()
    err = rejected(env={env_name: value})
    msg = str(err)
    assert key in msg and env_name in msg and why in msg, msg
    assert err.key == key


def test_bad_file_values_name_key_and_file(tmp_path: Path) -> None:
    for text, key, why in [
        ('s3_listen = "0.0.0.0:99999"', "s3_listen", "out of range"),
        ("s3_listen = 9000", "s3_listen", "got integer"),
        ("log_level = true", "log_level", "got boolean"),
        ("umask = 4096", "umask", "out of range"),
        ('umask = "u=rwx"', "umask", "octal"),
        ("data_dir = [1, 2]", "data_dir", "got array"),
        ("[tiers]\nhot = 1", "tiers", "unknown setting"),
    ]:
        cfg = write(tmp_path, text + "\n")
        msg = str(rejected(config_file=cfg))
        assert key in msg and str(cfg) in msg and why in msg, msg


def test_bad_cli_values_name_key_and_flag() -> None:
    msg = str(rejected(cli={"admin_listen": "localhost"}))
    assert "admin_listen" in msg and "--admin-listen" in msg


def test_unknown_file_key_suggests_the_right_one(tmp_path: Path) -> None:
    cfg = write(tmp_path, 's3-listen = "127.0.0.1:1"\n')
    err = rejected(config_file=cfg)
    assert "s3-listen" in str(err) and "did you mean s3_listen" in str(err)
    assert err.key == "s3-listen" and str(cfg) in str(err)


def test_unknown_env_var_is_rejected() -> None:
    err = rejected(env={"TIERD_S3_LISTN": "127.0.0.1:1"})
    assert "TIERD_S3_LISTN" in str(err) and "did you mean TIERD_S3_LISTEN" in str(err)


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    err = rejected(env={"TIERD_CONFIG": str(missing)})
    assert str(missing) in str(err) and "no such file" in str(err)
    bad = write(tmp_path, "log_level = \n")
    assert "invalid TOML" in str(rejected(config_file=bad))


# --- parsers kept for later settings --------------------------------------------------------


def test_reusable_parsers() -> None:
    ctx = ParseContext(Path("/"))
    assert parse_size("64GiB", ctx) == 64 << 30
    assert parse_size("512m", ctx) == 512 << 20
    assert parse_size(10, ctx) == 10
    assert parse_bool("on", ctx) is True and parse_bool(False, ctx) is False
    assert parse_int(1, 8)("3", ctx) == 3
    for parser, bad in [(parse_size, "lots"), (parse_bool, "maybe"), (parse_int(1, 8), 9)]:
        with pytest.raises(ValueError):
            parser(bad, ctx)


# --- the table and its documentation stay in step -------------------------------------------


def test_every_setting_has_env_flag_and_docs() -> None:
    doc = (ROOT / "docs" / "config.md").read_text()
    for spec in SETTINGS:
        assert spec.env == "TIERD_" + spec.name.upper()
        assert spec.flag == "--" + spec.name.replace("_", "-")
        assert re.search(rf"`{spec.name}`", doc), f"docs/config.md does not document {spec.name}"
        assert spec.env in doc, f"docs/config.md does not mention {spec.env}"
    for name in NON_SETTING_ENV:
        assert name in doc, f"docs/config.md does not mention {name}"


# --- combinations and stores that cannot work: one line naming the key, exit 2 ---------------


def test_watermarks_low_must_be_below_high(tmp_path: Path) -> None:
    cfg = write(tmp_path, "hot_high_watermark = 70\nhot_low_watermark = 80\n")
    err = rejected(config_file=cfg)
    msg = str(err)
    assert err.key in ("hot_low_watermark", "hot_high_watermark"), msg
    assert "hot_low_watermark (80" in msg and "hot_high_watermark (70" in msg and str(cfg) in msg
    err = rejected(env={"TIERD_WARM_LOW_WATERMARK": "95"})
    assert err.key == "warm_low_watermark" and "TIERD_WARM_LOW_WATERMARK" in str(err)
    assert load_config(env={"TIERD_HOT_LOW_WATERMARK": "10", "TIERD_HOT_HIGH_WATERMARK": "20"})


@pytest.mark.parametrize(
    ("env", "key", "why"),
    [
        ({"TIERD_COLD_URL": "bogus://x"}, "cold_url", "unknown cold store protocol"),
        ({"TIERD_COLD_URL": "memory://x", "TIERD_COLD_S3_ENDPOINT": "http://127.0.0.1:1"},
         "cold_s3_endpoint", "s3:// cold stores only"),
        ({"TIERD_COLD_URL": "s3://bkt/p", "TIERD_COLD_S3_ACCESS_KEY": "AK"},
         "cold_s3_access_key", "cold_s3_secret_key"),
        ({"TIERD_COLD_URL": "s3://bkt/p", "TIERD_COLD_PART_SIZE": "1MiB"}, "cold_part_size",
         "5 MiB"),
        ({"TIERD_COLD_RANGE_SIZE": "0"}, "cold_range_size", "larger than 0"),
        ({"TIERD_DIRTY_LIMIT": "0"}, "dirty_limit", "larger than 0"),
        ({"TIERD_S3_LISTEN": "127.0.0.1:9100", "TIERD_ADMIN_LISTEN": "0.0.0.0:9100"},
         "admin_listen", "share a port"),
        ({"TIERD_DATA_DIR": "/srv/t", "TIERD_HOT_DIR": "/srv/t/meta/hot"}, "hot_dir",
         "overlaps meta_dir"),
        ({"TIERD_DATA_DIR": "/srv/t", "TIERD_COLD_DIR": "/srv/t/hot"}, "cold_dir",
         "overlaps hot_dir"),
        ({"TIERD_DATA_DIR": "/srv/t", "TIERD_MOUNT": "/srv"}, "mount", "hide data_dir"),
        ({"TIERD_DATA_DIR": "/srv/t", "TIERD_MOUNT": "/srv/t/hot/m"}, "mount", "inside hot_dir"),
    ],
)
def test_combinations_that_cannot_work_name_the_key(env: dict[str, str], key: str,
                                                    why: str) -> None:
    err = rejected(env=env)
    msg = str(err)
    assert err.key == key and why in msg and "environment variable TIERD_" in msg, msg
    assert "\n" not in msg


def test_a_pool_socket_path_too_long_for_a_unix_socket_is_refused() -> None:
    deep = "/srv/" + "d" * 120
    err = rejected(env={"TIERD_DATA_DIR": deep})
    assert err.key == "data_dir" and "pool_socket" in str(err) and "107" in str(err)
    assert load_config(env={"TIERD_DATA_DIR": deep, "TIERD_POOL_SOCKET": "/run/tierd.sock"})


def test_a_mount_inside_the_data_dir_next_to_the_tiers_is_fine() -> None:
    c = load_config(env={"TIERD_DATA_DIR": "/srv/t", "TIERD_MOUNT": "/srv/t/mnt"})
    assert c.mount == Path("/srv/t/mnt")


def test_secrets_stay_out_of_combination_errors() -> None:
    msg = str(rejected(env={"TIERD_COLD_S3_SECRET_KEY": "very-secret-value"}))
    assert "very-secret-value" not in msg and "cold_s3_secret_key" in msg


def _serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
    return subprocess.run(
        [sys.executable, "-m", "tierd.cli", "serve", "--data-dir", str(tmp_path / "d"),
         "--s3-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", *args],
        capture_output=True, text=True, timeout=30, env=env, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("url", ["bogus://x", "ftp://x.invalid/y"])
def test_serve_with_a_cold_url_that_cannot_open_exits_2_with_one_line(
        tmp_path: Path, url: str) -> None:
    r = _serve(tmp_path, "--cold-url", url)
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "cold_url" in lines[0] and "--cold-url" in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_serve_with_crossed_watermarks_exits_2(tmp_path: Path) -> None:
    cfg = write(tmp_path, "hot_high_watermark = 50\nhot_low_watermark = 60\n")
    r = _serve(tmp_path, "--config", str(cfg))
    assert r.returncode == 2, r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "hot_low_watermark" in lines[0] and str(cfg) in lines[0]
