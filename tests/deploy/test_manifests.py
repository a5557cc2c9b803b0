"""The deployment files in deploy/ agree with the code: no container engine runs here,
so each manifest is parsed and checked against what the server really serves and reads."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from neffcache.server.app import create_app
from neffcache.server.blobs.memory import MemoryBlobStore
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.settings import ServerSettings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PORT = 8787
UID = 10001


def yaml_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))


def documents(path: Path) -> list[Any]:
    with path.open() as handle:
        return [doc for doc in yaml.safe_load_all(handle) if doc is not None]


def k8s(kind: str) -> dict[str, Any]:
    found = [
        doc
        for path in sorted((DEPLOY / "kubernetes").glob("*.yaml"))
        for doc in documents(path)
        if isinstance(doc, dict) and doc.get("kind") == kind
    ]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def compose() -> dict[str, Any]:
    docs = documents(DEPLOY / "compose.yaml")
    assert len(docs) == 1
    result: dict[str, Any] = docs[0]
    return result


def server_services() -> dict[str, dict[str, Any]]:
    """The compose services that run the image deploy/Dockerfile builds."""
    services = compose()["services"]
    found = {
        name: service
        for name, service in services.items()
        if str(service.get("build", {}).get("dockerfile", "")).endswith("deploy/Dockerfile")
    }
    assert found
    return found


def replica_services() -> dict[str, dict[str, Any]]:
    """The server services of the default stack (no profile): the S3 replicas."""
    return {name: svc for name, svc in server_services().items() if not svc.get("profiles")}


def dockerfile_stages() -> list[list[str]]:
    """The Dockerfile's instructions (continuations joined, comments dropped), per stage."""
    text = (DEPLOY / "Dockerfile").read_text()
    logical = re.sub(r"\\\n", " ", text)
    stages: list[list[str]] = []
    for line in logical.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            stages.append([])
        assert stages, "an instruction before the first FROM"
        stages[-1].append(line)
    return stages


def instructions(stage: list[str], name: str) -> list[str]:
    return [line.split(None, 1)[1] for line in stage if line.split(None, 1)[0].upper() == name]


def pod_spec() -> dict[str, Any]:
    spec: dict[str, Any] = k8s("Deployment")["spec"]["template"]["spec"]
    return spec


def container() -> dict[str, Any]:
    containers = pod_spec()["containers"]
    assert len(containers) == 1
    result: dict[str, Any] = containers[0]
    return result


def container_port(port: int | str) -> int:
    """A port number, or the container's port of that name."""
    if isinstance(port, int):
        return port
    named = [p["containerPort"] for p in container()["ports"] if p.get("name") == port]
    assert len(named) == 1, f"no container port named {port}"
    return int(named[0])


def probe_paths() -> dict[str, str]:
    """Every HTTP path a probe, health check or scraper asks of the server."""
    paths = {}
    for probe in ("readinessProbe", "livenessProbe"):
        paths[f"k8s {probe}"] = container()[probe]["httpGet"]["path"]
    healthcheck = instructions(dockerfile_stages()[-1], "HEALTHCHECK")
    assert len(healthcheck) == 1
    match = re.search(r"https?://[^/'\"]+(/[A-Za-z0-9_/-]*)", healthcheck[0])
    assert match, "the HEALTHCHECK names no URL"
    paths["Dockerfile HEALTHCHECK"] = match.group(1)
    for endpoint in k8s("ServiceMonitor")["spec"]["endpoints"]:
        paths["ServiceMonitor"] = endpoint.get("path", "/metrics")
    for job in documents(DEPLOY / "prometheus.yml")[0]["scrape_configs"]:
        paths[f"prometheus {job['job_name']}"] = job.get("metrics_path", "/metrics")
    return paths


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    settings = ServerSettings(data_dir=tmp_path_factory.mktemp("data"))
    blobs = MemoryBlobStore()
    app = create_app(settings, blob_store=blobs, index=MemoryIndex())
    try:
        with TestClient(app) as client:
            yield client
    finally:
        blobs.close()


def test_every_yaml_file_parses() -> None:
    files = yaml_files()
    assert DEPLOY / "compose.yaml" in files
    assert DEPLOY / "prometheus.yml" in files
    for path in files:
        assert documents(path), path


def test_kustomization_lists_every_manifest() -> None:
    kustomization = documents(DEPLOY / "kubernetes" / "kustomization.yaml")[0]
    manifests = {p.name for p in (DEPLOY / "kubernetes").glob("*.yaml")}
    assert sorted(kustomization["resources"]) == sorted(manifests - {"kustomization.yaml"})


def test_probes_and_scrapers_ask_paths_the_server_serves(served: TestClient) -> None:
    paths = probe_paths()
    assert paths["k8s readinessProbe"] == "/readyz"
    assert paths["k8s livenessProbe"] == "/healthz"
    assert paths["Dockerfile HEALTHCHECK"] == "/healthz"
    assert "/metrics" in paths.values()
    for where, path in paths.items():
        assert served.get(path).status_code == 200, f"{where}: GET {path}"


def test_scrapers_ask_metrics() -> None:
    paths = probe_paths()
    assert paths["ServiceMonitor"] == "/metrics"
    scrapes = [v for k, v in paths.items() if k.startswith("prometheus ")]
    assert scrapes
    assert set(scrapes) == {"/metrics"}


def test_ports_are_8787_everywhere() -> None:
    assert ServerSettings.model_fields["port"].default == PORT
    final = dockerfile_stages()[-1]
    assert instructions(final, "EXPOSE") == [str(PORT)]
    # Kubernetes: the container, its probes, the Service and the ServiceMonitor.
    assert [p["containerPort"] for p in container()["ports"]] == [PORT]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container_port(container()[probe]["httpGet"]["port"]) == PORT
    service_ports = k8s("Service")["spec"]["ports"]
    assert service_ports
    for port in service_ports:
        assert port["port"] == PORT
        assert container_port(port.get("targetPort", port["port"])) == PORT
    names = {port.get("name") for port in service_ports}
    for endpoint in k8s("ServiceMonitor")["spec"]["endpoints"]:
        assert endpoint["port"] in names
    config = k8s("ConfigMap")["data"]
    assert int(config.get("NEFFCACHE_PORT", PORT)) == PORT
    # Compose: each replica's container port, and Prometheus' targets.
    servers = replica_services()
    for service in servers.values():
        assert [str(p).rsplit(":", 1)[-1] for p in service["ports"]] == [str(PORT)]
    targets = [
        target
        for job in documents(DEPLOY / "prometheus.yml")[0]["scrape_configs"]
        for config in job["static_configs"]
        for target in config["targets"]
    ]
    assert sorted(targets) == sorted(f"{name}:{PORT}" for name in servers)
    # systemd: the default port (no --port, no NEFFCACHE_PORT elsewhere).
    unit = (DEPLOY / "systemd" / "neffcache.service").read_text()
    assert "--port" not in unit or f"--port {PORT}" in unit


def test_image_runs_as_non_root() -> None:
    stages = dockerfile_stages()
    assert len(stages) >= 2, "the image is multi-stage"
    final = stages[-1]
    assert instructions(final, "FROM")[0].split()[0] == "python:3.11-slim"
    users = instructions(final, "USER")
    assert users, "the final stage sets no USER"
    user = users[-1].split(":")[0]
    assert user.isdigit(), "a numeric USER lets runAsNonRoot verify it"
    assert int(user) == UID
    # Only the virtualenv comes from the builder.
    copies = instructions(final, "COPY")
    assert copies
    assert all(c.startswith("--from=builder /opt/neffcache ") for c in copies), copies
    assert instructions(final, "ENTRYPOINT") == ['["neffcache", "serve", "--host", "0.0.0.0"]']
    builder = "\n".join(stages[0])
    assert "pip wheel --no-deps" in builder
    assert "[server,s3,redis]" in builder


def test_pods_run_as_non_root_on_a_read_only_root() -> None:
    spec = pod_spec()
    pod = spec["securityContext"]
    assert pod["runAsNonRoot"] is True
    assert pod["runAsUser"] == UID
    own = container()["securityContext"]
    assert own.get("runAsNonRoot", True) is True
    assert own.get("runAsUser", UID) == UID
    assert own["readOnlyRootFilesystem"] is True
    assert own["allowPrivilegeEscalation"] is False
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container()["volumeMounts"]}
    for path in ("/tmp", "/var/lib/neffcache"):
        assert "emptyDir" in volumes[mounts[path]], path
    assert k8s("ConfigMap")["data"]["NEFFCACHE_DATA_DIR"] == "/var/lib/neffcache"
    assert container()["resources"]["requests"]["cpu"]  # the HPA scales on it


def test_no_service_links_into_the_neffcache_prefix() -> None:
    # A Service named neffcache in the namespace would inject NEFFCACHE_PORT=tcp://...,
    # which the server reads as its port and rejects.
    assert k8s("Service")["metadata"]["name"] == "neffcache"
    assert pod_spec()["enableServiceLinks"] is False


def test_deployment_takes_settings_and_secret_from_env_from() -> None:
    sources = container()["envFrom"]
    config_maps = [s["configMapRef"]["name"] for s in sources if "configMapRef" in s]
    secrets = [s["secretRef"]["name"] for s in sources if "secretRef" in s]
    assert config_maps == [k8s("ConfigMap")["metadata"]["name"]]
    assert secrets == [k8s("Secret")["metadata"]["name"]]
    assert "NEFFCACHE_BOOTSTRAP_ADMIN_TOKEN" in k8s("Secret")["stringData"]
    assert all(key.startswith(("NEFFCACHE_", "AWS_")) for key in k8s("ConfigMap")["data"])
    assert k8s("Deployment")["spec"]["replicas"] == 2


def _client_variables() -> set[str]:
    doc = (ROOT / "docs" / "client.md").read_text()
    return set(re.findall(r"`(NEFFCACHE_[A-Z0-9_]+)", doc))


def test_every_neffcache_variable_in_deploy_exists() -> None:
    settings = {f"NEFFCACHE_{name.upper()}" for name in ServerSettings.model_fields}
    client = _client_variables()
    assert "NEFFCACHE_TOKEN" in client
    named: dict[str, set[str]] = {}
    for path in sorted(p for p in DEPLOY.rglob("*") if p.is_file()):
        for name in re.findall(r"NEFFCACHE_[A-Z0-9_]*[A-Z0-9]", path.read_text()):
            named.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    assert "NEFFCACHE_BOOTSTRAP_ADMIN_TOKEN" in named
    unknown = {name: where for name, where in named.items() if name not in settings | client}
    assert unknown == {}


def test_compose_redis_persists_and_never_evicts() -> None:
    command = compose()["services"]["redis"]["command"]
    words = shlex.split(command) if isinstance(command, str) else [str(w) for w in command]
    options = dict(zip(words[1::2], words[2::2], strict=False))
    assert words[0] == "redis-server"
    assert options["--appendonly"] == "yes"
    assert options["--maxmemory-policy"] == "noeviction"
    assert options["--appendfsync"] == "everysec"


def test_compose_replicas_share_redis_and_s3_with_a_bootstrap_token() -> None:
    services = compose()["services"]
    servers = replica_services()
    assert len(servers) == 2
    for service in servers.values():
        assert service["build"]["context"] == ".."
        env = service["environment"]
        assert env["NEFFCACHE_INDEX_URL"].startswith("redis://redis:")
        assert env["NEFFCACHE_BLOB_URL"].startswith("s3://")
        assert env["AWS_ENDPOINT_URL_S3"].startswith("http://minio:")
        assert env["NEFFCACHE_BOOTSTRAP_ADMIN_TOKEN"].startswith("${")
        assert service["depends_on"]["createbucket"]["condition"] == (
            "service_completed_successfully"
        )
    bucket = servers[next(iter(servers))]["environment"]["NEFFCACHE_BLOB_URL"][5:].split("/")[0]
    assert f"local/{bucket}" in " ".join(services["createbucket"]["entrypoint"])
    assert services["createbucket"]["image"].startswith("minio/mc")


def test_hpa_targets_the_deployment() -> None:
    hpa = k8s("HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = hpa["spec"]["scaleTargetRef"]
    deployment = k8s("Deployment")
    assert (target["apiVersion"], target["kind"]) == ("apps/v1", "Deployment")
    assert target["name"] == deployment["metadata"]["name"]
    assert hpa["spec"]["minReplicas"] >= 2
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]


def _selects_pods(match_labels: dict[str, str]) -> bool:
    labels = k8s("Deployment")["spec"]["template"]["metadata"]["labels"]
    return bool(match_labels) and all(labels.get(k) == v for k, v in match_labels.items())


def test_selectors_match_the_pods() -> None:
    deployment = k8s("Deployment")
    assert _selects_pods(deployment["spec"]["selector"]["matchLabels"])
    pdb = k8s("PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert _selects_pods(pdb["spec"]["selector"]["matchLabels"])
    assert _selects_pods(k8s("Service")["spec"]["selector"])


def test_service_monitor_selects_the_service() -> None:
    monitor = k8s("ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    service_labels = k8s("Service")["metadata"]["labels"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector
    assert all(service_labels.get(k) == v for k, v in selector.items())


def test_systemd_unit() -> None:
    unit = (DEPLOY / "systemd" / "neffcache.service").read_text()
    lines = [line.strip() for line in unit.splitlines() if line and not line.startswith("#")]
    keys: dict[str, list[str]] = {}
    for line in lines:
        if "=" in line:
            key, _, value = line.partition("=")
            keys.setdefault(key, []).append(value)
    assert keys["User"] == ["neffcache"]
    assert keys["EnvironmentFile"] == ["/etc/neffcache/env"]
    (exec_start,) = keys["ExecStart"]
    assert exec_start.split()[:2] == ["/opt/neffcache/bin/neffcache", "serve"]
    argv = exec_start.split()
    data_dir = argv[argv.index("--data-dir") + 1]
    assert keys["ReadWritePaths"] == [data_dir]
    assert keys["StateDirectory"] == [Path(data_dir).name]
    assert data_dir.startswith("/var/lib/")
    assert keys["Restart"] == ["on-failure"]
    assert keys["NoNewPrivileges"] == ["yes"]
    assert keys["ProtectSystem"] == ["strict"]


def test_training_snippet_uses_one_install_and_the_documented_variable() -> None:
    snippet = (DEPLOY / "training-image" / "Dockerfile.snippet").read_text()
    live = [line for line in snippet.splitlines() if line and not line.startswith("#")]
    assert [line for line in live if "pip install" in line] == [
        "RUN pip install --no-cache-dir /tmp/neffcache"
        " && neffcache shim-dir --dir /opt/neffcache/shim"
    ]
    assert "COPY neffcache /tmp/neffcache" in live  # from source: no package index has it
    # The shim first on PATH: the living stacks run neuronx-cc by name.
    assert "ENV PATH=/opt/neffcache/shim:$PATH" in live
    (env,) = [line for line in live if line.startswith("ENV NEFFCACHE_")]
    name, _, url = env[4:].partition("=")
    assert name == "NEFFCACHE_URL"
    assert f"`{name}`" in (ROOT / "docs" / "client.md").read_text()
    assert re.fullmatch(rf"neffcache\+https?://[\w.-]+:{PORT}/[\w.-]+", url)


# --- nginx in front of a filesystem store (X-Accel-Redirect) ---------------------------

NGINX_CONF = DEPLOY / "nginx" / "nginx.conf"
OVERLAY = DEPLOY / "kubernetes-filesystem"


@dataclass(frozen=True)
class NginxFacts:
    listen: int
    upstream: str  # host:port
    internal: str  # the internal location, e.g. /_neffcache/blobs/
    alias: str  # where it reads the files
    temp_paths: list[str]


def nginx_facts() -> NginxFacts:
    text = NGINX_CONF.read_text()
    (listen,) = re.findall(r"^\s*listen (\d+);", text, re.M)
    (upstream,) = re.findall(r"^\s*server (\S+);", text, re.M)
    internal = re.search(r"location (\S+) \{\s*internal;\s*alias (\S+);", text)
    assert internal, "no internal location with an alias"
    temp = re.findall(r"^\s*(?:pid|\w+_temp_path) (\S+);", text, re.M)
    return NginxFacts(int(listen), upstream, internal[1], internal[2], temp)


def accel_store(env: dict[str, Any]) -> tuple[str, str]:
    """The store's directory and the accel prefix a server's environment names."""
    url = str(env["NEFFCACHE_BLOB_URL"])
    assert url.startswith("file:///")
    return url.removeprefix("file://"), str(env["NEFFCACHE_ACCEL_REDIRECT_PREFIX"])


def check_nginx_agrees(store: str, prefix: str, nginx_store_mount: str) -> None:
    """The server's store and prefix, and where nginx sees the store, agree with
    nginx.conf: X-Accel-Redirect <prefix>/blobs/ab/D is the file <store>/blobs/ab/D."""
    facts = nginx_facts()
    assert facts.internal == f"{prefix}/blobs/"
    assert facts.alias == f"{store}/blobs/"
    assert facts.alias.startswith(nginx_store_mount.rstrip("/") + "/")
    assert facts.upstream == f"127.0.0.1:{PORT}"
    assert all(path.startswith("/tmp/") for path in facts.temp_paths)
    assert len(facts.temp_paths) == 6  # pid and every temp path: a read-only root


def test_the_nginx_config_asks_for_x_accel_only_from_its_own_requests() -> None:
    text = NGINX_CONF.read_text()
    assert 'proxy_set_header X-Neffcache-Accel "on";' in text
    from neffcache.server.api.blobs import ACCEL_HEADER

    assert ACCEL_HEADER == "x-neffcache-accel"
    assert "add_header ETag $upstream_http_etag always;" in text
    assert "etag off;" in text
    assert "client_max_body_size 0;" in text  # uploads up to max_blob_bytes
    assert "proxy_request_buffering off;" in text


def test_compose_filesystem_variant_puts_nginx_in_front_of_the_store() -> None:
    services = compose()["services"]
    server, nginx = services["neffcache-fs"], services["nginx-fs"]
    assert server["profiles"] == nginx["profiles"] == ["filesystem"]
    assert server["build"]["dockerfile"] == "deploy/Dockerfile"
    store, prefix = accel_store(server["environment"])
    assert server["environment"]["NEFFCACHE_BOOTSTRAP_ADMIN_TOKEN"].startswith("${")
    # nginx shares the server's network namespace (127.0.0.1:8787), whose port it serves.
    assert nginx["network_mode"] == "service:neffcache-fs"
    assert [str(p).rsplit(":", 1)[-1] for p in server["ports"]] == [str(nginx_facts().listen)]
    mounts = dict(str(v).split(":", 1) for v in nginx["volumes"])
    server_mounts = dict(str(v).split(":", 1) for v in server["volumes"])
    (data_volume,) = [name for name, path in server_mounts.items() if store.startswith(path)]
    assert mounts[data_volume].endswith(":ro")
    check_nginx_agrees(store, prefix, mounts[data_volume].removesuffix(":ro"))
    assert str(nginx["user"]).split(":")[0] == str(UID)  # reads the server's 0600 files
    assert nginx["read_only"] is True
    assert nginx["tmpfs"] == ["/tmp"]
    argv = nginx["entrypoint"]
    config = argv[argv.index("-c") + 1]
    assert mounts["./nginx/nginx.conf"] == f"{config}:ro"
    assert data_volume in compose()["volumes"]


def overlay(name: str) -> dict[str, Any]:
    (document,) = documents(OVERLAY / name)
    result: dict[str, Any] = document
    return result


def test_kubernetes_filesystem_overlay_lists_its_files_and_ships_the_nginx_config() -> None:
    kustomization = overlay("kustomization.yaml")
    listed = set(kustomization["resources"]) | {p["path"] for p in kustomization["patches"]}
    assert listed == {"../kubernetes"} | {p.name for p in OVERLAY.glob("*.yaml")} - {
        "kustomization.yaml"
    }
    config = overlay("nginx-configmap.yaml")
    assert config["data"]["nginx.conf"] == NGINX_CONF.read_text()


def test_kubernetes_filesystem_overlay_puts_an_nginx_sidecar_in_front_of_the_store() -> None:
    settings = overlay("configmap-patch.yaml")["data"]
    store, prefix = accel_store(settings)
    spec = overlay("deployment-patch.yaml")["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in spec["containers"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    claim = volumes["store"]["persistentVolumeClaim"]["claimName"]
    assert overlay("persistentvolumeclaim.yaml")["metadata"]["name"] == claim
    assert "ReadWriteMany" in overlay("persistentvolumeclaim.yaml")["spec"]["accessModes"]

    def mount(container: str, volume: str) -> dict[str, Any]:
        (found,) = [m for m in containers[container]["volumeMounts"] if m["name"] == volume]
        return found

    assert mount("neffcache", "store")["mountPath"] == store
    assert mount("neffcache", "store").get("readOnly", False) is False
    assert mount("nginx", "store")["readOnly"] is True
    check_nginx_agrees(store, prefix, mount("nginx", "store")["mountPath"])
    nginx = containers["nginx"]
    command = nginx["command"]
    assert command[0] == "nginx"
    config_dir = mount("nginx", "nginx-config")["mountPath"]
    assert command[command.index("-c") + 1] == f"{config_dir}/nginx.conf"
    assert (
        volumes["nginx-config"]["configMap"]["name"]
        == overlay("nginx-configmap.yaml")["metadata"]["name"]
    )
    assert "emptyDir" in volumes[mount("nginx", "nginx-tmp")["name"]]
    assert mount("nginx", "nginx-tmp")["mountPath"] == "/tmp"
    own = nginx["securityContext"]
    assert own["runAsUser"] == UID  # reads the server's 0600 files
    assert own["readOnlyRootFilesystem"] is True
    assert own["allowPrivilegeEscalation"] is False
    (front,) = nginx["ports"]
    assert front["containerPort"] == nginx_facts().listen
    # The Service sends clients to nginx.
    (port,) = overlay("service-patch.yaml")["spec"]["ports"]
    assert port["targetPort"] == front["name"]
    assert port["port"] == PORT


def test_kubectl_renders_the_filesystem_overlay() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (the overlay's files are checked one by one)")
    rendered = subprocess.run(
        [kubectl, "kustomize", str(OVERLAY)], capture_output=True, text=True, timeout=60
    )
    assert rendered.returncode == 0, rendered.stderr
    docs = {
        doc["metadata"]["name"] if doc["kind"] == "ConfigMap" else doc["kind"]: doc
        for doc in yaml.safe_load_all(rendered.stdout)
        if doc
    }
    (service_port,) = docs["Service"]["spec"]["ports"]
    assert service_port["targetPort"] == "front"
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["neffcache", "nginx"]
    for c in pod["containers"]:
        assert "store" in {m["name"] for m in c["volumeMounts"]}, c["name"]
    settings = docs["neffcache-config"]["data"]
    assert settings["NEFFCACHE_ACCEL_REDIRECT_PREFIX"] == "/_neffcache"
    assert settings["NEFFCACHE_INDEX_URL"].startswith("redis://")  # the base's, kept
    assert docs["neffcache-nginx"]["data"]["nginx.conf"] == NGINX_CONF.read_text()
