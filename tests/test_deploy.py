"""Deployment (issue 29): the Dockerfile, the Kubernetes manifests under deploy/k8s, and flight-probe.

What this machine can check, it checks (docs/deploy.md, "Verified here and on paper"):

* every manifest against the Kubernetes API's own schemas, strictly (an unknown field fails), for
  the oldest and the newest version the validator ships (``kubernetes-validate``, which bundles
  the schemas: nothing is downloaded);
* what a reviewer would otherwise check by eye: the flags are the daemons' real flags, the drain
  fits in the grace period, the pods run as the image's non-root user on a read-only root, the
  memory flags fit the container, secrets are mounted files with placeholder values, the Services
  select the pods they should, the readiness probe is the image's health check;
* the probe itself, against real workers: plain, token-protected, ``--public-health``, draining,
  and a dead port;
* the image is built only where a Docker daemon runs and the base image can be had; otherwise
  that test skips and says which.
"""

from __future__ import annotations

import ast
import functools
import json
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.flight as fl
import pytest
import yaml

import flight
from flight.service import cli as service_cli
from flight.wire.limits import parse_size
from flight.worker import cli as worker_cli
from flight.worker import probe

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
DOCKERFILE = ROOT / "Dockerfile"
PROBE = ROOT / "flight" / "worker" / "probe.py"
OLDEST = "1.30"  # the first release whose preStop `sleep` action is on by default (beta in 1.30)
MEMORY_SHARE = 0.75  # --memory-limit + --memory-budget-mb of the container's memory; the rest is Python, gRPC, allocators
PLACEHOLDER = "REPLACE_WITH_"
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# ---------------------------------------------------------------- reading the files


@functools.cache
def _documents() -> list[tuple[str, dict[str, Any]]]:
    """Every YAML document under deploy/k8s, read once (the tests only read them)."""
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        docs += [(path.name, d) for d in yaml.load_all(path.read_text(), Loader=_LOADER) if d]
    return docs


def _resources() -> list[dict[str, Any]]:
    return [d for _, d in _documents() if d["kind"] != "Kustomization"]


def _one(kind: str, name: str) -> dict[str, Any]:
    found = [d for d in _resources() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name!r} in deploy/k8s, found {len(found)}"
    return found[0]


def _pod(name: str) -> dict[str, Any]:
    return _one("Deployment", name)["spec"]["template"]["spec"]


def _container(name: str) -> dict[str, Any]:
    (container,) = _pod(name)["containers"]
    return container


def _flags(args: list[str]) -> dict[str, str]:
    """``--flag=value`` items as a dict (the manifests write every flag so)."""
    assert all(a.startswith("--") and "=" in a for a in args), args
    return dict(a[2:].split("=", 1) for a in args)


def _dockerfile() -> list[tuple[str, str, str]]:
    """(stage, INSTRUCTION, rest) for every instruction, continuation lines joined, comments dropped."""
    lines, pending = [], ""
    for raw in DOCKERFILE.read_text().splitlines():
        if raw.strip().startswith("#") or not raw.strip():
            continue
        pending += raw.rstrip("\\").strip() + " " if raw.rstrip().endswith("\\") else raw.strip()
        if not raw.rstrip().endswith("\\"):
            lines.append(pending)
            pending = ""
    out, stage = [], ""
    for line in lines:
        word, _, rest = line.partition(" ")
        if word.upper() == "FROM":
            stage = rest.split(" AS ")[-1].strip() if " AS " in rest else ""
        out.append((stage, word.upper(), rest.strip()))
    return out


def _stage(name: str, instruction: str) -> list[str]:
    return [rest for stage, word, rest in _dockerfile() if stage == name and word == instruction]


def _quantity(text: str | int) -> float:
    """A Kubernetes quantity in bytes or cores: ``8Gi``, ``512Mi``, ``4``, ``500m``."""
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "k": 1e3, "M": 1e6, "G": 1e9, "m": 1e-3}
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(text))
    assert match, f"not a quantity: {text!r}"
    return float(match[1]) * units.get(match[2], 1)


# ---------------------------------------------------------------- the schemas


@pytest.mark.required
@pytest.mark.parametrize("version", [OLDEST, "latest"])
def test_every_manifest_is_valid_kubernetes_strictly(version: str) -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is a dev dependency (the Kubernetes schemas)")
    target = kv.utils.latest_version() if version == "latest" else version
    problems = []
    for name, doc in _documents():
        if doc["kind"] == "Kustomization":
            continue  # not an API object: its own test below
        try:
            kv.validate(doc, target, strict=True)
        except kv.ValidationError as exc:
            problems.append(f"{name}: {doc['kind']}/{doc['metadata']['name']}: {'.'.join(map(str, exc.path))}: {exc.message}")
        except (kv.SchemaNotFoundError, kv.VersionNotSupportedError) as exc:
            problems.append(f"{name}: {exc.message}")
    assert len(_resources()) >= 9
    assert not problems, f"against Kubernetes {target}:\n" + "\n".join(problems)


@pytest.mark.required
def test_the_validator_refuses_unknown_fields_and_wrong_types() -> None:
    """The check above means something: strict schemas fail a misspelt field, not only a wrong type."""
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is a dev dependency")
    deployment = yaml.safe_load((K8S / "worker.yaml").read_text())
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kv.ValidationError, match="readinesProbe"):
        kv.validate(deployment, kv.utils.latest_version(), strict=True)
    deployment = yaml.safe_load((K8S / "worker.yaml").read_text())
    deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "fifty"
    with pytest.raises(kv.ValidationError):
        kv.validate(deployment, kv.utils.latest_version(), strict=True)


def test_the_kustomization_names_every_manifest_and_every_image() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Kustomization"
    assert set(kustomization) <= {"apiVersion", "kind", "resources", "images"}
    assert set(kustomization["resources"]) == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    images = {i["name"] for i in kustomization["images"]}
    used = {c["image"].split(":")[0] for d in _resources() if d["kind"] == "Deployment" for c in d["spec"]["template"]["spec"]["containers"]}
    assert used == images
    assert all("namespace" not in d["metadata"] for d in _resources()), "the manifests are namespace-agnostic"


# ---------------------------------------------------------------- what a reviewer checks


def test_the_manifests_flags_are_the_daemons_flags() -> None:
    worker = _container("flight-worker")
    args = worker_cli._parser().parse_args(worker["args"])
    assert args.host == "0.0.0.0"
    assert args.spill_dir is not None and args.auth_token_file and args.tls_cert and args.tls_key
    coordinator = _container("flight-coordinator")["args"]
    args, unknown = service_cli._parser().parse_known_args(coordinator)
    assert args.host == "0.0.0.0" and args.http_port is not None
    pending = [a for a in unknown if not a.startswith("--workers-dns=")]
    assert not pending, f"flight-coordinator does not know {pending}"
    if unknown:
        pytest.xfail("flight-coordinator has no --workers-dns yet (a DnsWorkerResolver from the command line); coordinator.yaml is written for it")


def test_termination_grace_covers_the_prestop_sleep_and_the_drain() -> None:
    for name, shutdown in (("flight-worker", worker_cli.SHUTDOWN_WAIT_S), ("flight-coordinator", service_cli.SHUTDOWN_WAIT_S)):
        pod, container = _pod(name), _container(name)
        grace = float(_flags(container["args"])["grace"])
        sleep = container["lifecycle"]["preStop"]["sleep"]["seconds"]
        # Kubernetes counts preStop inside terminationGracePeriodSeconds; SIGTERM comes after it.
        assert pod["terminationGracePeriodSeconds"] >= sleep + grace + shutdown + 1, name
    worker = _container("flight-worker")
    assert worker["lifecycle"]["preStop"]["sleep"]["seconds"] >= 10, "the DNS resolver's refresh (5 s) and the records' TTL (5 s)"


def test_pods_run_as_the_image_s_non_root_user_on_a_read_only_root() -> None:
    users = {stage: _stage(stage, "USER") for stage in ("worker", "coordinator")}
    for name, stage in (("flight-worker", "worker"), ("flight-coordinator", "coordinator")):
        (user,) = users[stage]
        uid = int(user.split(":")[0])
        pod, container = _pod(name), _container(name)
        assert uid != 0 and pod["securityContext"]["runAsUser"] == uid, name
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        assert pod["automountServiceAccountToken"] is False
        sc = container["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
        empty = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
        writable = {m["mountPath"] for m in container["volumeMounts"] if m["name"] in empty and not m.get("readOnly")}
        assert "/tmp" in writable, name  # HOME=/tmp in the image
        assert all(m.get("readOnly") for m in container["volumeMounts"] if m["name"] not in empty), name
    spill = _flags(_container("flight-worker")["args"])["spill-dir"]
    assert spill in {m["mountPath"] for m in _container("flight-worker")["volumeMounts"] if m["name"] == "spill"}


def test_the_worker_s_memory_cores_and_disk_fit_its_container() -> None:
    container, pod = _container("flight-worker"), _pod("flight-worker")
    flags, resources = _flags(container["args"]), container["resources"]
    assert resources["requests"] == resources["limits"], "Guaranteed QoS: the last to be evicted"
    memory = _quantity(resources["limits"]["memory"])
    engine, buffers = parse_size(flags["memory-limit"]), int(flags["memory-budget-mb"]) << 20
    assert engine + buffers <= MEMORY_SHARE * memory, "the engine's limit and the buffers' budget leave room for the process itself"
    assert int(flags["engine-threads"]) <= _quantity(resources["limits"]["cpu"]), "the engine's default is the node's cores, not the pod's"
    disks = {v["name"]: _quantity(v["emptyDir"]["sizeLimit"]) for v in pod["volumes"] if "emptyDir" in v}
    assert sum(disks.values()) <= _quantity(resources["limits"]["ephemeral-storage"])


def test_the_readiness_probe_is_the_image_s_health_check() -> None:
    (healthcheck,) = _stage("worker", "HEALTHCHECK")
    image_command = json.loads(healthcheck.split(" CMD ", 1)[1])
    (writes,) = [r for r in _stage("worker", "RUN") if "> /usr/local/bin/flight-probe" in r]
    assert image_command[0] == "/usr/local/bin/flight-probe" and "python -P" in writes
    container = _container("flight-worker")
    readiness = container["readinessProbe"]
    command = readiness["exec"]["command"]
    assert command[0] == image_command[0]
    args = probe._parser().parse_args(command[1:])
    flags = _flags(container["args"])
    (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == "flight"]
    assert args.url == f"grpc+tls://127.0.0.1:{port}" and str(port) == flags["port"]
    assert args.tls_ca == flags["tls-ca"] and args.token_file == flags["auth-token-file"]
    assert args.tls_server_name, "the probe dials 127.0.0.1, which no worker certificate names"
    assert args.timeout < readiness["timeoutSeconds"]
    assert "exec" not in container["livenessProbe"], "a draining worker fails health, and must not be restarted for it"


def test_secrets_are_mounted_files_holding_placeholders_only() -> None:
    secrets = {d["metadata"]["name"]: d for d in _resources() if d["kind"] == "Secret"}
    for name, secret in secrets.items():
        assert "data" not in secret, f"{name}: base64 data could be a real value; placeholders go in stringData"
        for key, value in secret["stringData"].items():
            assert PLACEHOLDER in value and "-----BEGIN" not in value, f"{name}.{key} holds something other than a placeholder"
    configmaps = {d["metadata"]["name"]: d for d in _resources() if d["kind"] == "ConfigMap"}
    for deployment in ("flight-worker", "flight-coordinator"):
        pod, container = _pod(deployment), _container(deployment)
        assert "env" not in container and "envFrom" not in container, "credentials come from files"
        mounted = {}
        for volume in pod["volumes"]:
            source = volume.get("secret") or volume.get("configMap")
            if source is None:
                continue
            data = secrets[source["secretName"]]["stringData"] if "secret" in volume else configmaps[source["name"]]["data"]
            (mount,) = [m["mountPath"] for m in container["volumeMounts"] if m["name"] == volume["name"]]
            items = source.get("items") or [{"key": k, "path": k} for k in data]
            for item in items:
                assert item["key"] in data, f"{deployment}: {volume['name']} mounts the missing key {item['key']!r}"
                mounted[f"{mount}/{item['path']}"] = item["key"]
        files = [v for k, v in _flags(container["args"]).items() if k.endswith(("-file", "-cert", "-key", "-ca", "catalog"))]
        assert files and all(f in mounted for f in files), f"{deployment}: {sorted(set(files) - set(mounted))} are not mounted"
    worker_mounts = {m["mountPath"] for m in _container("flight-worker")["volumeMounts"]}
    assert "/etc/flight/coordinator-tls" not in worker_mounts


def test_the_services_and_the_budget_select_the_right_pods() -> None:
    labels = {name: _one("Deployment", name)["spec"]["template"]["metadata"]["labels"] for name in ("flight-worker", "flight-coordinator")}
    for name in labels:
        assert _one("Deployment", name)["spec"]["selector"]["matchLabels"].items() <= labels[name].items()

    def selects(selector: dict[str, str], name: str) -> bool:
        return selector.items() <= labels[name].items()

    headless = _one("Service", "flight-worker")["spec"]
    assert headless["clusterIP"] == "None" and not headless.get("publishNotReadyAddresses")
    assert selects(headless["selector"], "flight-worker") and not selects(headless["selector"], "flight-coordinator")
    budget = _one("PodDisruptionBudget", "flight-worker")["spec"]
    assert selects(budget["selector"]["matchLabels"], "flight-worker") and not selects(budget["selector"]["matchLabels"], "flight-coordinator")
    assert budget["maxUnavailable"] == 1
    service = _one("Service", "flight-coordinator")["spec"]
    assert selects(service["selector"], "flight-coordinator") and not selects(service["selector"], "flight-worker")
    for name, spec in (("flight-worker", headless), ("flight-coordinator", service)):
        ports = {p["name"]: p["containerPort"] for p in _container(name)["ports"]}
        for port in spec["ports"]:
            assert port["targetPort"] in ports and port["port"] == ports[port["targetPort"]], f"{name}: {port}"
    coordinator = _flags(_container("flight-coordinator")["args"])
    assert {p["name"]: p["port"] for p in service["ports"]} == {"flight-sql": int(coordinator["port"]), "http": int(coordinator["http-port"])}
    target = coordinator["workers-dns"].split("://", 1)[1]
    assert target == f"flight-worker:{headless['ports'][0]['port']}", "the coordinator resolves the headless Service's name"


def test_the_dockerfile_builds_small_non_root_images() -> None:
    stages = [rest.split(" AS ")[-1] for _, word, rest in _dockerfile() if word == "FROM"]
    assert stages[-1] == "worker", "`docker build .` builds the worker"
    assert _stage("worker", "ENTRYPOINT") == ['["flight-worker"]']
    assert _stage("coordinator", "ENTRYPOINT") == ['["flight-coordinator"]']
    (cmd,) = _stage("worker", "CMD")
    worker_cli._parser().parse_args(json.loads(cmd))
    assert "50051" in _stage("worker", "EXPOSE")[0].split()
    for stage in ("worker", "coordinator"):
        assert all(user.split(":")[0] not in ("0", "root") for user in _stage(stage, "USER")) and _stage(stage, "USER")
    ignore = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert ignore[0] == "*" and {"!flight/", "!pyproject.toml", "!README.md"} <= set(ignore), "the build context is the package only"


# ---------------------------------------------------------------- the image, where it can be built


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_worker_image_builds_and_reports_healthy() -> None:
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker client on this machine: the image is checked on paper only (docs/deploy.md)")
    info = subprocess.run([docker, "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True, timeout=60, check=False)
    if info.returncode != 0:
        why = (info.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"no Docker daemon on this machine ({why}): the image is checked on paper only (docs/deploy.md)")
    base = re.search(r"^ARG PYTHON=(\S+)$", DOCKERFILE.read_text(), re.MULTILINE)
    assert base is not None
    have = subprocess.run([docker, "image", "inspect", base[1]], capture_output=True, timeout=60, check=False).returncode == 0
    if not have:
        pulled = subprocess.run([docker, "pull", base[1]], capture_output=True, text=True, timeout=600, check=False)
        if pulled.returncode != 0:
            pytest.skip(f"the base image {base[1]} is not here and cannot be pulled ({pulled.stderr.strip()[-200:]})")
    tag = "flight-exec-worker:test"
    built = subprocess.run([docker, "build", "-t", tag, str(ROOT)], capture_output=True, text=True, timeout=1500, check=False)
    assert built.returncode == 0, built.stderr[-4000:]
    user = subprocess.run([docker, "run", "--rm", "--entrypoint", "id", tag, "-u"], capture_output=True, text=True, timeout=120, check=True)
    assert user.stdout.strip() == "10001"
    name = f"flight-exec-test-{socket.gethostname()}"
    subprocess.run([docker, "run", "-d", "--rm", "--name", name, tag], check=True, capture_output=True, timeout=120)
    try:
        status, deadline = "", time.monotonic() + 120  # HEALTHCHECK's start period and a few intervals
        while status not in ("healthy", "unhealthy") and time.monotonic() < deadline:
            time.sleep(1)
            status = subprocess.run([docker, "inspect", "--format", "{{.State.Health.Status}}", name],
                                    capture_output=True, text=True, timeout=30, check=False).stdout.strip()
        assert status == "healthy"
    finally:
        stopped = subprocess.run([docker, "stop", "-t", "40", name], capture_output=True, timeout=120, check=False)
    assert stopped.returncode == 0, stopped.stderr  # SIGTERM drains and the worker exits


# ---------------------------------------------------------------- the probe, against real workers


def _probe(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """flight-probe as the image runs it: the file alone (python -P), no flight package imported."""
    return subprocess.run([sys.executable, "-P", str(PROBE), *args], capture_output=True, text=True, timeout=60, env=env, check=False)


def _unhealthy(done: subprocess.CompletedProcess[str], url: str, reason: str) -> None:
    assert done.returncode == 1, done
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"unhealthy: {url}: ") and reason in line, line


@pytest.fixture(scope="module")
def plain() -> Iterator[flight.LocalCluster]:
    with flight.LocalCluster(1) as c:
        yield c


@pytest.fixture(scope="module")
def secure() -> Iterator[flight.LocalCluster]:
    with flight.LocalCluster(1, secure=True) as c:
        yield c


def test_the_probe_file_imports_nothing_of_the_package() -> None:
    imported = set()
    for node in ast.walk(ast.parse(PROBE.read_text())):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert imported <= {"__future__", "argparse", "os", "sys", "collections", "pathlib", "typing", "pyarrow"}, imported


@pytest.mark.slow  # a worker of its own: a few seconds
def test_the_probe_says_healthy_then_draining_then_healthy(plain: flight.LocalCluster) -> None:
    url = plain.urls[0]
    done = _probe("--url", url)
    assert done.returncode == 0 and done.stdout == f"healthy: {url} answered health with ok\n", done
    assert probe.main(["--url", url]) == 0  # python -m flight.worker.probe: the same code, imported
    with fl.connect(url) as client:
        list(client.do_action(fl.Action("drain", b"")))
        deadline = 50
        while (done := _probe("--url", url)).returncode == 0 and deadline:
            deadline -= 1
        _unhealthy(done, url, "is draining")
        list(client.do_action(fl.Action("resume", b"")))
    assert _probe("--url", url).returncode == 0


def test_the_probe_fails_a_dead_port_in_one_line() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"grpc://127.0.0.1:{port}"
    _unhealthy(_probe("--url", url, "--timeout", "2"), url, "Connection refused")


def test_the_probe_never_exits_2_which_docker_reserves() -> None:
    _unhealthy(_probe("--no-such-flag"), "flight-probe", "unrecognized arguments")
    _unhealthy(_probe("--url", "grpc://127.0.0.1:1", "--token-file", "/nonexistent/token"), "grpc://127.0.0.1:1", "cannot read")


@pytest.mark.slow  # a worker of its own: a few seconds
def test_the_probe_on_a_token_protected_tls_worker(secure: flight.LocalCluster) -> None:
    url, files = secure.urls[0], secure.security_files
    assert url.startswith("grpc+tls://127.0.0.1:") and files.token_file and files.ca_file
    _unhealthy(_probe("--url", url, "--tls-ca", files.ca_file), url, "requires a bearer token")
    assert _probe("--url", url, "--tls-ca", files.ca_file, "--token-file", files.token_file).returncode == 0
    # Dialling 127.0.0.1, checking the certificate for another name it carries (a pod's probe does so).
    assert _probe("--url", url, "--tls-ca", files.ca_file, "--token-file", files.token_file, "--tls-server-name", "localhost").returncode == 0
    _unhealthy(_probe("--url", url, "--tls-ca", files.ca_file, "--token-file", files.token_file, "--tls-server-name", "flight-worker"),
               url, "flight-worker")
    _unhealthy(_probe("--url", url, "--token-file", files.token_file), url, "certificate verify failed")
    # Docker's HEALTHCHECK runs the probe without flags: the environment says where and how.
    env = {"PATH": "/usr/bin:/bin", "FLIGHT_EXEC_PROBE_URL": url, "FLIGHT_EXEC_TLS_CA": files.ca_file, "FLIGHT_EXEC_TOKEN_FILE": files.token_file}
    assert _probe(env=env).returncode == 0


@pytest.mark.slow  # a worker of its own: a few seconds
def test_the_probe_needs_no_token_on_a_public_health_worker() -> None:
    with flight.LocalCluster(1, secure=True, worker_args=["--public-health"]) as c:
        url, files = c.urls[0], c.security_files
        assert files.ca_file
        done = _probe("--url", url, "--tls-ca", files.ca_file)
        assert done.returncode == 0, done
