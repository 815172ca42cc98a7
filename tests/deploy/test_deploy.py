"""deploy/: compose, Kubernetes manifests, Prometheus and Grafana files parse, agree with each other, load with the
real config classes, and query only metrics kvpool exports (checked on a fresh registry AND scraped from a running
pool's /metrics)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from kvpool import EmbeddedPool, Namespace, block_keys
from kvpool.config import load_config
from kvpool.connector.config import ConnectorConfig
from kvpool.dashboard import DashboardServer
from kvpool.engine_adapter.config import EngineConfig
from kvpool.metrics import ConnectorMetrics, EngineMetrics, PoolMetrics, exported_names
from kvpool.store.config import MasterServerConfig, NodeServerConfig

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S = DEPLOY / "k8s"
CONFIGS = {"master": MasterServerConfig, "node": NodeServerConfig, "connector": ConnectorConfig,
           "engine": EngineConfig}
# Variables the deployment sets for fields that land with the distributed-pool work (http_listen of the master,
# metrics_listen of a node): load_config ignores KVPOOL_* variables naming no field, so they are harmless before.
PENDING_ENV = {"master": {"KVPOOL_HTTP_LISTEN"}, "node": {"KVPOOL_METRICS_LISTEN"}, "serve": set()}
COMPOSE_SERVICES = {"redis", "master", "node-1", "node-2", "engine-1", "engine-2", "prometheus", "grafana"}


SECRET_MOUNTS = ("/run/secrets/kvpool-tokens", "/run/secrets/kvpool-tls")


@pytest.fixture(scope="module")
def secrets_dir(tmp_path_factory) -> Path:
    """What deploy/make_secrets.sh writes (run for real, into a temporary OUT), laid out as deploy/secrets/."""
    out = tmp_path_factory.mktemp("deploy") / "secrets"
    env = {**os.environ, "OUT": str(out), "KVPOOL": f"{sys.executable} -m kvpool.cli"}
    done = subprocess.run(["bash", str(DEPLOY / "make_secrets.sh")], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert oct((out).stat().st_mode & 0o777) == "0o700"
    return out


def local_secrets(env: dict[str, str], secrets: Path) -> dict[str, str]:
    """The deployment's secret paths (mounted at /run/secrets/kvpool-tokens|tls) mapped to `secrets`."""
    return {k: v.replace(SECRET_MOUNTS[0], str(secrets / "tokens")).replace(SECRET_MOUNTS[1], str(secrets / "tls"))
            for k, v in env.items()}


def secret_paths(env: dict[str, str]) -> set[str]:
    """The secret files a process is told to read (file:PATH sources and TLS paths under the secret mounts)."""
    return {v.removeprefix("file:") for v in env.values() if v.removeprefix("file:").startswith(SECRET_MOUNTS)}


def field_env(cls: type, prefix: str = "KVPOOL_") -> set[str]:
    return {prefix + f.name.upper() for f in dataclasses.fields(cls)}


ALLOWED_ENV = {
    "master": field_env(MasterServerConfig) | PENDING_ENV["master"],
    "node": field_env(NodeServerConfig) | PENDING_ENV["node"],
    "serve": field_env(ConnectorConfig) | field_env(EngineConfig, "KVPOOL_ENGINE_"),
}


def compose() -> dict:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def manifests() -> list[dict]:
    """Every Kubernetes object (kustomization.yaml is kubectl's input list, not an object)."""
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return docs


def by_kind(kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in manifests() if d["kind"] == kind}


def grafana_exprs() -> list[str]:
    dash = json.loads((DEPLOY / "grafana" / "kvpool-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in dash["templating"]["list"]]
    return exprs


def grafana_metric_names() -> set[str]:
    names = set()
    for expr in grafana_exprs():
        for name in re.findall(r"kvpool_[a-z_]+", expr):
            names.add(re.sub(r"_(bucket|sum|count)$", "", name))
    return names


class _Captured(Exception):
    pass


def config_via_cli(argv: list[str], env: dict[str, str], monkeypatch) -> object:
    """Run `kvpool master|node ...` through the real CLI with exactly `env`, up to the point where the server would
    start, and return the config it built. So the test follows whatever file/env/flag precedence and environment
    prefix the commands really use; /etc/kvpool/X is read from deploy/config/X."""
    from kvpool import cli, services

    captured: dict[str, object] = {}

    class Capture:
        def __init__(self, config):
            captured["config"] = config

        def start(self):
            raise _Captured

    monkeypatch.setattr(services, "MasterProcess", Capture)
    monkeypatch.setattr(services, "NodeProcess", Capture)
    for name in [k for k in os.environ if k.startswith("KVPOOL")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    argv = [str(DEPLOY / "config" / Path(a).name) if a.startswith("/etc/kvpool/") else a for a in argv]
    with pytest.raises(_Captured):
        cli.main(argv)
    return captured["config"]


# ---- compose --------------------------------------------------------------------------------------------------

def test_compose_has_every_service_and_kvpool_roles_load_their_configs(monkeypatch, secrets_dir):
    services = compose()["services"]
    declared = compose()["secrets"]
    assert set(services) == COMPOSE_SERVICES
    roles = {}
    for name, svc in services.items():
        if svc.get("image", "").startswith("kvpool:"):
            assert svc["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}
            assert "./config:/etc/kvpool:ro" in svc["volumes"]
            role, args = svc["command"][0], svc["command"][1:]
            roles[name] = role
            env = {k: str(v) for k, v in svc.get("environment", {}).items()}
            assert set(env) <= ALLOWED_ENV[role], f"{name}: KVPOOL_* variables naming no config field"
            # Every secret a service names is mounted into it, from a file make_secrets.sh writes.
            mounted = {s["target"]: s["source"] for s in svc.get("secrets", [])}
            assert secret_paths(env) and secret_paths(env) <= set(mounted), name
            for target, source in mounted.items():
                assert (secrets_dir / declared[source]["file"].removeprefix("./secrets/")).is_file(), source
            env = local_secrets(env, secrets_dir)
            config = Path(args[args.index("--config") + 1])
            assert config.parent == Path("/etc/kvpool")
            if role == "serve":
                cfg = load_config(EngineConfig, DEPLOY / "config" / config.name, env=env,
                                  env_prefix="KVPOOL_ENGINE_")
                assert cfg.model_name == "smollm2-135m"
                assert args[args.index("--engine-name") + 1] == name  # distinct TTFT `engine` label per engine
                connector = Path(args[args.index("--connector-config") + 1])
                conn = load_config(ConnectorConfig, DEPLOY / "config" / connector.name, env=env)
                assert conn.pool == "master:50051"
            else:
                cfg = config_via_cli(svc["command"], env, monkeypatch)
                assert isinstance(cfg, CONFIGS[role])
                if role == "master":
                    assert (cfg.redis_url, cfg.listen) == ("redis://redis:6379/0", "0.0.0.0:50051")
                else:
                    assert cfg.node_id == name and cfg.advertise_host == name and cfg.master == "master:50051"
                    assert f"{name}-ssd:/var/lib/kvpool" in svc["volumes"]
                    assert cfg.ssd_path.startswith("/var/lib/kvpool/")
    assert roles == {"master": "master", "node-1": "node", "node-2": "node", "engine-1": "serve",
                     "engine-2": "serve"}
    assert services["master"]["depends_on"]["redis"] == {"condition": "service_healthy"}


def test_prometheus_targets_are_compose_services_on_exposed_ports():
    services = compose()["services"]
    prom = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    scraped: dict[str, set[str]] = {}
    for job in prom["scrape_configs"]:
        for sc in job["static_configs"]:
            for target in sc["targets"]:
                host, port = target.rsplit(":", 1)
                if host == "localhost":
                    continue
                assert host in services, f"{job['job_name']}: {host} is not a compose service"
                assert port in [str(p) for p in services[host]["expose"]], f"{target}: port not exposed"
                scraped.setdefault(job["job_name"], set()).add(host)
    assert scraped == {"kvpool-master": {"master"}, "kvpool-node": {"node-1", "node-2"},
                       "kvpool-engine": {"engine-1", "engine-2"}}
    mounts = services["prometheus"]["volumes"]
    assert "./prometheus.yml:/etc/prometheus/prometheus.yml:ro" in mounts


def test_grafana_provisioning_matches_compose_mounts_and_dashboard_datasource():
    services = compose()["services"]
    ds = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yaml").read_text())["datasources"][0]
    assert ds["type"] == "prometheus" and ds["url"] == "http://prometheus:9090"
    provider = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/kvpool.yaml").read_text())["providers"][0]
    mounted = {v.split(":")[1]: v.split(":")[0] for v in services["grafana"]["volumes"]}
    assert mounted[provider["options"]["path"] + "/kvpool-dashboard.json"] == "./grafana/kvpool-dashboard.json"
    assert mounted["/etc/grafana/provisioning"] == "./grafana/provisioning"
    dash = json.loads((DEPLOY / "grafana" / "kvpool-dashboard.json").read_text())
    uids = {p["datasource"]["uid"] for p in dash["panels"] if p["type"] != "row"}
    uids |= {t["datasource"]["uid"] for p in dash["panels"] for t in p.get("targets", [])}
    assert uids == {ds["uid"]}


# ---- Grafana queries only what kvpool exports ---------------------------------------------------------------------

def test_grafana_json_is_what_its_builder_writes():
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_dashboard", DEPLOY / "grafana" / "build_dashboard.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert (DEPLOY / "grafana" / "kvpool-dashboard.json").read_text() == module.render()


def test_every_grafana_metric_is_defined_in_kvpool_metrics():
    reg = CollectorRegistry()
    PoolMetrics.create(reg, lambda: {}, node_counts=lambda: {"cut_writes": 0, "drained_writes": 0, "late_writes": 0,
                                                            "ssd_reads_from_file": 0, "ssd_corrupt_reads": 0})
    EngineMetrics.create(reg)
    ConnectorMetrics.create(reg)
    used = grafana_metric_names()
    assert used <= exported_names(reg), f"undefined: {sorted(used - exported_names(reg))}"
    # The panels the issue asks for are there: hit rate by tier, capacity, movement, latency, errors, TTFT.
    assert {"kvpool_hit_tokens_total", "kvpool_requested_tokens_total", "kvpool_tier_bytes",
            "kvpool_tier_capacity_bytes", "kvpool_evictions_total", "kvpool_demotions_total", "kvpool_op_seconds",
            "kvpool_rpc_errors_total", "kvpool_engine_ttft_seconds"} <= used
    hist = [e for e in grafana_exprs() if "histogram_quantile" in e]
    assert hist and all("_bucket[" in e and "by (le" in e for e in hist)


def test_pool_metrics_grafana_queries_are_exported_by_a_running_pool(tmp_path):
    """Scrape /metrics of a dashboard server on a real EmbeddedPool with traffic: every pool-side metric the
    Grafana dashboard queries is in the exposition with samples (engine/connector metrics live in engine
    processes and are checked on the registry above)."""
    ns = Namespace(model="tiny", fingerprint="f0", kv_dtype="float32", block_tokens=4, num_layers=1,
                   num_kv_heads=1, head_dim=4)
    with EmbeddedPool(dram_bytes=4 << 10, ssd_path=str(tmp_path), ssd_bytes=1 << 20) as pool:
        registry = CollectorRegistry()
        metrics = PoolMetrics.create(registry, pool.stats)
        keys = block_keys(ns, list(range(64)))
        with metrics.time_op("put"):
            pool.put_many(keys, [bytes([i]) * ns.block_bytes for i in range(len(keys))], namespace=ns)
        with metrics.time_op("lookup"):
            assert pool.lookup_prefix(keys, namespace=ns) == len(keys)
        metrics.rpc_errors.labels(method="Lookup", code="DEADLINE_EXCEEDED").inc()
        with DashboardServer(pool.stats, registry, sample_interval=None) as server:
            with urllib.request.urlopen(server.url + "metrics", timeout=10) as r:
                text = r.read().decode()
    sampled = {re.sub(r"_(bucket|sum|count|created)$", "", line.split("{")[0].split(" ")[0])
               for line in text.splitlines() if line and not line.startswith("#")}
    # (per-tenant metrics need tenants: an authenticated pool's /metrics is scraped in tests/kvpool/test_cli_security)
    # (a node's write fence counters: on its own /metrics, scraped from a node process in tests/store/test_write_fence)
    pool_side = {n for n in grafana_metric_names()
                 if not n.startswith(("kvpool_engine_", "kvpool_connector_", "kvpool_tenant_", "kvpool_node_"))}
    assert pool_side <= sampled, f"queried but not exported with samples: {sorted(pool_side - sampled)}"
    assert 'kvpool_requested_tokens_total{namespace="tiny/default"} 64.0' in text.splitlines()


# ---- Kubernetes -------------------------------------------------------------------------------------------------

def test_manifests_parse_with_required_kinds():
    kinds = {(d["kind"], d["metadata"]["name"]) for d in manifests()}
    assert {("Namespace", "kvpool"), ("ConfigMap", "kvpool-config"), ("Deployment", "redis"),
            ("Service", "redis"), ("Deployment", "kvpool-master"), ("Service", "kvpool-master"),
            ("StatefulSet", "kvpool-node"), ("Service", "kvpool-node"), ("Deployment", "kvpool-engine"),
            ("Service", "kvpool-engine"), ("StorageClass", "local-ssd")} <= kinds
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert set(kustomization["resources"]) == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    for d in manifests():
        if d["kind"] not in ("Namespace", "StorageClass", "PersistentVolume"):
            assert d["metadata"]["namespace"] == "kvpool", d["metadata"]["name"]


def test_node_statefulset_claims_a_local_ssd_and_runs_on_a_headless_service():
    sts = by_kind("StatefulSet")["kvpool-node"]
    svc = by_kind("Service")[sts["spec"]["serviceName"]]
    assert svc["spec"]["clusterIP"] == "None"
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    storage_class = by_kind("StorageClass")[claim["spec"]["storageClassName"]]
    assert storage_class["provisioner"] == "kubernetes.io/no-provisioner"
    assert storage_class["volumeBindingMode"] == "WaitForFirstConsumer"
    assert any(pv["spec"]["storageClassName"] == "local-ssd" and "local" in pv["spec"]
               for pv in by_kind("PersistentVolume").values())
    pod = sts["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == "/var/lib/kvpool"
    assert mounts["dshm"] == "/dev/shm"
    assert {v["name"]: v for v in pod["volumes"]}["dshm"]["emptyDir"]["medium"] == "Memory"


def test_workloads_load_their_configs_and_services_select_them(monkeypatch, secrets_dir):
    configmap = by_kind("ConfigMap")["kvpool-config"]
    for name, body in configmap["data"].items():
        assert body == (DEPLOY / "config" / name).read_text(), f"ConfigMap {name} differs from deploy/config/"
    workloads = {**by_kind("Deployment"), **by_kind("StatefulSet")}
    roles = set()
    for wname, w in workloads.items():
        tmpl = w["spec"]["template"]
        assert w["spec"]["selector"]["matchLabels"].items() <= tmpl["metadata"]["labels"].items()
        for c in tmpl["spec"]["containers"]:
            ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
            ann = tmpl["metadata"].get("annotations", {})
            if ann.get("prometheus.io/scrape") == "true":
                assert int(ann["prometheus.io/port"]) in ports.values(), wname
            if not c["image"].startswith("kvpool:"):
                continue
            role, args = c["args"][0], c["args"][1:]
            roles.add(role)
            env = {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}
            assert set(env) <= ALLOWED_ENV[role], f"{wname}: KVPOOL_* variables naming no config field"
            # Every secret file named is an item of a Secret volume mounted where the path says.
            volumes_by_name = {v["name"]: v for v in tmpl["spec"]["volumes"]}
            items = {f"{m['mountPath']}/{i['path']}" for m in c["volumeMounts"]
                     if "secret" in volumes_by_name.get(m["name"], {})  # (claims are not pod volumes)
                     for i in volumes_by_name[m["name"]]["secret"]["items"]}
            assert secret_paths(env) and secret_paths(env) <= items, wname
            env = local_secrets(env, secrets_dir)
            config = Path(args[args.index("--config") + 1])
            assert config.name in configmap["data"] and config.parent == Path("/etc/kvpool")
            mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
            volumes = {v["name"]: v for v in tmpl["spec"]["volumes"]}
            assert volumes[mounts["/etc/kvpool"]]["configMap"]["name"] == "kvpool-config"
            resolved = {k: re.sub(r"\$\(POD_NAME\)", "kvpool-node-0", v) for k, v in env.items()}
            if role == "serve":
                load_config(EngineConfig, DEPLOY / "config" / config.name, env=resolved, env_prefix="KVPOOL_ENGINE_")
                assert load_config(ConnectorConfig, DEPLOY / "config" / "connector.yaml",
                                   env=resolved).pool == "kvpool-master:50051"
            else:
                cfg = config_via_cli(c["args"], resolved, monkeypatch)
                assert isinstance(cfg, CONFIGS[role])
                if role == "node":
                    assert (cfg.node_id, cfg.master) == ("kvpool-node-0", "kvpool-master:50051")
                    assert cfg.advertise_host == "kvpool-node-0.kvpool-node.kvpool.svc.cluster.local"
                    assert cfg.ssd_bytes <= 100 << 30  # fits the 100Gi claim
    assert roles == {"master", "node", "serve"}
    for sname, svc in by_kind("Service").items():
        selected = [w for w in workloads.values()
                    if svc["spec"]["selector"].items() <= w["spec"]["template"]["metadata"]["labels"].items()]
        assert len(selected) == 1, f"Service {sname} selects {len(selected)} workloads"
        port_names = {p["name"] for c in selected[0]["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
        assert {p["targetPort"] for p in svc["spec"]["ports"]} <= port_names, sname


@pytest.mark.parametrize("path", sorted(p.name for p in K8S.glob("*.yaml")))
def test_every_manifest_document_has_api_version_kind_and_name(path):
    for d in yaml.safe_load_all((K8S / path).read_text()):
        assert d["apiVersion"] and d["kind"]
        if d["kind"] != "Kustomization":
            assert d["metadata"]["name"]


# ---- every kvpool command line in deploy/ parses with the real CLI ----------------------------------------------

def deploy_command_lines() -> list[tuple[str, list[str]]]:
    lines = [(f"compose {name}", svc["command"]) for name, svc in compose()["services"].items()
             if svc.get("image", "").startswith("kvpool:")]
    for w in {**by_kind("Deployment"), **by_kind("StatefulSet")}.values():
        for c in w["spec"]["template"]["spec"]["containers"]:
            if c["image"].startswith("kvpool:"):
                lines.append((f"k8s {w['metadata']['name']}", c["args"]))
                pre_stop = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
                if pre_stop:
                    assert pre_stop[:2] == ["sh", "-c"]
                    argv = shlex.split(pre_stop[2].replace("$POD_NAME", "kvpool-node-0"))
                    assert argv[0] == "kvpool"
                    lines.append((f"k8s {w['metadata']['name']} preStop", argv[1:]))
    return lines


@pytest.mark.parametrize("where, argv", [pytest.param(w, a, id=w) for w, a in deploy_command_lines()])
def test_deploy_command_lines_parse_with_the_real_cli(where, argv):
    from kvpool.cli import build_parser

    parser = build_parser()

    def parses(args: list[str]) -> bool:
        try:
            parser.parse_args(args)
            return True
        except SystemExit:  # argparse already printed why
            return False

    assert parses(argv), f"{where}: `kvpool {' '.join(argv)}` does not parse"
