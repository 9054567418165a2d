"""The cluster variants of deploy/ checked without Docker or Kubernetes: the compose file of
three nodes (deploy/compose/docker-compose.cluster.yaml) and the kustomize overlay
(deploy/kubernetes-cluster/) give every node settings tierd's own loader accepts as a node of
one cluster -- the same database, cold store and secrets, names and peer URLs of their own --
and the overlay renders to objects valid against the Kubernetes API schemas."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from tierd.config import ConfigError, load_config

from .test_manifests import DEPLOY, DOCKERFILE, K8S, K8S_VERSIONS, TIERD_ENV, docs

COMPOSE = DEPLOY / "compose" / "docker-compose.cluster.yaml"
OVERLAY = DEPLOY / "kubernetes-cluster"
NODES = ("tierd-n1", "tierd-n2", "tierd-n3")


def compose() -> dict[str, Any]:
    (doc,) = docs(COMPOSE)
    return doc


def node_env(service: dict[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in service["environment"].items()}


def test_compose_cluster_nodes_load_as_three_nodes_of_one_cluster() -> None:
    services = compose()["services"]
    shared: set[tuple[str, str]] | None = None
    names, peers, ports = set(), set(), []
    for name in NODES:
        env = node_env(services[name])
        unknown = {k for k in env if k.startswith("TIERD_")} - TIERD_ENV
        assert not unknown, f"{name}: not tierd variables: {unknown}"
        # the image's CMD plus this environment, through tierd's own loader and checks
        cfg = load_config(env=env, cli={"data_dir": "/data"})
        names.add(cfg.node_name)
        peer = urlsplit(cfg.peer_url)
        assert peer.hostname == name and peer.port == 9002, name  # the service's own name
        assert cfg.peer_listen is not None and cfg.peer_listen.port == 9002
        peers.add(cfg.peer_url)
        common = {(k, v) for k, v in env.items()
                  if k not in ("TIERD_NODE_NAME", "TIERD_PEER_URL")}
        shared = common if shared is None else shared
        assert common == shared, f"{name} differs from the others in {common ^ shared}"
        ports += [p.split(":")[1] for p in services[name]["ports"]]
        build = services[name]["build"]
        assert (COMPOSE.parent / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
        assert "/dev/fuse" in services[name]["devices"]
    assert len(names) == len(peers) == 3
    assert len(ports) == len(set(ports)), "two nodes publish the same host port"


def test_compose_cluster_database_and_cold_store_are_the_containers_it_starts() -> None:
    services = compose()["services"]
    env = node_env(services["tierd-n1"])
    cfg = load_config(env=env, cli={"data_dir": "/data"})
    db = urlsplit(cfg.meta_url)
    pg = services["postgres"]["environment"]
    assert services["postgres"]["image"].startswith("postgres:15")
    assert (db.hostname, db.port, db.username, db.password, db.path) == (
        "postgres", 5432, pg["POSTGRES_USER"], pg["POSTGRES_PASSWORD"],
        "/" + pg["POSTGRES_DB"])
    minio = services["minio"]["environment"]
    assert (cfg.cold_s3_access_key, cfg.cold_s3_secret_key) == (
        minio["MINIO_ROOT_USER"], minio["MINIO_ROOT_PASSWORD"])
    assert urlsplit(cfg.cold_s3_endpoint or "").hostname == "minio"
    assert services["minio-init"]["entrypoint"][-1] == f"cold/{urlsplit(cfg.cold_url).netloc}"
    # n1 makes the database's tables; the others start once it is healthy
    first = services["tierd-n1"]["depends_on"]
    assert first["postgres"]["condition"] == "service_healthy"
    assert first["minio-init"]["condition"] == "service_completed_successfully"
    for name in NODES[1:]:
        assert services[name]["depends_on"]["tierd-n1"]["condition"] == "service_healthy"
    assert services["postgres"]["healthcheck"]["test"][0] == "CMD"


def test_the_cluster_check_and_the_stand_ins_match_the_compose_files() -> None:
    """check_cluster.py drives the services, mount and root key the compose file names; the
    offline stand-ins replace only the MinIO services, with the compose file's cold bucket
    and key."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_cluster",
                                                  COMPOSE.parent / "check_cluster.py")
    assert spec is not None and spec.loader is not None
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    services = compose()["services"]
    assert check.NODES == NODES
    for name in NODES:
        env = node_env(services[name])
        assert env["TIERD_MOUNT"] == check.MNT
        assert {"TIERD_ROOT_ACCESS_KEY", "TIERD_ROOT_SECRET_KEY"} <= env.keys()
        assert "9000" in " ".join(services[name]["ports"])  # the snippet's 127.0.0.1:9000
    (standins,) = docs(COMPOSE.parent / "offline" / "standins.yaml")
    assert set(standins["services"]) == {"minio", "minio-init"}
    single, = docs(COMPOSE.parent / "docker-compose.yaml")
    cfg = load_config(env=node_env(services["tierd-n1"]), cli={"data_dir": "/data"})
    init = " ".join(standins["services"]["minio-init"]["entrypoint"])
    minio = services["minio"]["environment"]
    assert f"Bucket='{urlsplit(cfg.cold_url).netloc}'" in init
    assert f"aws_access_key_id='{minio['MINIO_ROOT_USER']}'" in init
    assert f"aws_secret_access_key='{minio['MINIO_ROOT_PASSWORD']}'" in init
    assert {"minio", "minio-init"} <= set(single["services"])
    assert " 9000" in " ".join(standins["services"]["minio"]["command"])


def test_a_node_without_the_cluster_secret_is_refused() -> None:
    env = node_env(compose()["services"]["tierd-n2"])
    env["TIERD_CLUSTER_SECRET"] = "short"
    with pytest.raises(ConfigError, match="cluster_secret"):
        load_config(env=env, cli={"data_dir": "/data"})


# --- Kubernetes -----------------------------------------------------------------------------


def overlay_secret() -> dict[str, str]:
    (doc,) = docs(OVERLAY / "secret-cluster.yaml")
    return dict(doc["stringData"])


def test_overlay_files_parse_and_name_the_base() -> None:
    (kust,) = docs(OVERLAY / "kustomization.yaml")
    assert (OVERLAY / kust["resources"][0]).resolve() == K8S
    for res in kust["resources"][1:]:
        assert (OVERLAY / res).exists(), res
    for patch in kust["patches"]:
        assert (OVERLAY / patch["path"]).exists(), patch


def test_overlay_secret_placeholders_are_refused_and_real_values_accepted(
        tmp_path: Path) -> None:
    secret = overlay_secret()
    assert set(secret) == {"TIERD_META_URL", "TIERD_CLUSTER_SECRET"} <= TIERD_ENV
    base = {"TIERD_NODE_NAME": "gpu-node-7", "TIERD_PEER_LISTEN": "0.0.0.0:9002",
            "TIERD_PEER_URL": "http://10.1.2.3:9002"}
    with pytest.raises(ConfigError, match="meta_url"):
        load_config(env={**base, **secret}, cli={"data_dir": str(tmp_path)})
    good = {**base, "TIERD_META_URL": "postgresql://tierd:pw@postgres.db.svc:5432/tierd",
            "TIERD_CLUSTER_SECRET": secret["TIERD_CLUSTER_SECRET"]}
    with pytest.raises(ConfigError, match="cluster_secret"):
        load_config(env=good, cli={"data_dir": str(tmp_path)})
    assert "TIERD_CLUSTER_SECRET=$(openssl rand -hex 24)" in (
        OVERLAY / "secret-cluster.yaml").read_text()
    good["TIERD_CLUSTER_SECRET"] = "0123456789abcdef" * 3  # what openssl rand -hex 24 makes
    cfg = load_config(env=good, cli={"data_dir": str(tmp_path)})
    assert cfg.node_name == "gpu-node-7"


def rendered() -> list[dict[str, Any]]:
    r = subprocess.run(["kubectl", "kustomize", str(OVERLAY)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_overlay_renders_objects_valid_against_the_api_schemas(version: str) -> None:
    objs = rendered()
    assert sorted(d["kind"] for d in objs) == [
        "ConfigMap", "DaemonSet", "Namespace", "Secret", "Secret", "Service"]
    for d in objs:
        try:
            kubernetes_validate.validate(d, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            where = "/".join(str(p) for p in e.path)
            pytest.fail(f"{d['kind']}/{d['metadata']['name']} at {where}: {e.message}")


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_overlay_daemonset_makes_each_pod_a_node_named_after_its_kubernetes_node(
        tmp_path: Path) -> None:
    objs = {f"{d['kind']}/{d['metadata']['name']}": d for d in rendered()}
    spec = objs["DaemonSet/tierd"]["spec"]["template"]["spec"]
    (c,) = [c for c in spec["containers"] if c["name"] == "tierd"]
    env = {e["name"]: e for e in c["env"]}
    assert env["TIERD_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    names = [e["name"] for e in c["env"]]
    assert names.index("POD_IP") < names.index("TIERD_PEER_URL")  # $(POD_IP) expands
    refs = {r["secretRef"]["name"] for r in c["envFrom"]}
    assert refs == {"tierd-secrets", "tierd-cluster"}
    assert {p["name"]: p["containerPort"] for p in c["ports"]}["peer"] == 9002
    assert {n for n in env if n.startswith("TIERD_")} <= TIERD_ENV
    # everything the pod gets, with the kubelet's substitutions, through tierd's loader
    (tmp_path / "tierd.toml").write_text(objs["ConfigMap/tierd-config"]["data"]["tierd.toml"])
    values = {n: e["value"] for n, e in env.items() if "value" in e}
    values["TIERD_CONFIG"] = str(tmp_path / "tierd.toml")
    values["TIERD_NODE_NAME"] = "gpu-node-7"
    values["TIERD_PEER_URL"] = values["TIERD_PEER_URL"].replace("$(POD_IP)", "10.1.2.3")
    for ref in refs:
        values |= objs[f"Secret/{ref}"]["stringData"]
    values |= {"TIERD_META_URL": "postgresql://tierd@postgres.db.svc:5432/tierd",
               "TIERD_CLUSTER_SECRET": "0123456789abcdef" * 3}
    toml = tomllib.loads((tmp_path / "tierd.toml").read_text())
    values["TIERD_DATA_DIR"] = str(tmp_path / "data")  # not the node's /var/lib/tierd
    assert toml["data_dir"]
    cfg = load_config(env=values)
    assert (cfg.node_name, cfg.peer_url) == ("gpu-node-7", "http://10.1.2.3:9002")
