"""deploy/ against the project it deploys: what someone applying the Kubernetes manifests or starting the compose
file would trip over. Every probe and healthcheck path is a route of the process it probes (an instance's answers
200), every `manage.py` command they run exists, every PANTHEON_* variable they set is a setting, every Secret key
they read is one docs/deploy.md tells you to create, the instances advertise the stable names their headless Service
gives them, and the compose file runs the expected services. The manifests are read the way kustomize reads them,
from the kustomizations' resources; the image is never built here (docs/deploy.md).
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest
import yaml
from django.core.management import get_commands
from django.test import Client
from django.urls import Resolver404, resolve

REPO_ROOT = Path(__file__).resolve().parent.parent
DEPLOY = REPO_ROOT / "deploy"
KUSTOMIZATIONS = [
    DEPLOY / "kubernetes",
    DEPLOY / "kubernetes" / "cpu",
    DEPLOY / "kubernetes" / "components" / "servicemonitor",
]
COMPOSE = DEPLOY / "compose.yaml"
# The router serves its own URL configuration (`manage.py router`).
ROUTER_URLCONF = "fleet.urls"
EXPECTED_COMPOSE_SERVICES = {
    "postgres",
    "redis",
    "setup",
    "router",
    "instance-1",
    "instance-2",
    "celery-worker",
    "celery-beat",
}


def _documents(root: Path, seen: set[Path]) -> list[dict]:
    """The objects a kustomization builds from its resources and components (files, or folders with their own)."""
    root = root.resolve()
    if root in seen:
        return []
    seen.add(root)
    kustomization = yaml.safe_load((root / "kustomization.yaml").read_text())
    documents = []
    for entry in kustomization.get("resources", []) + kustomization.get("components", []):
        path = root / entry
        if path.is_dir():
            documents += _documents(path, seen)
        else:
            documents += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return documents


def manifests() -> list[dict]:
    seen: set[Path] = set()
    return [document for root in KUSTOMIZATIONS for document in _documents(root, seen)]


def workloads() -> list[tuple[str, dict]]:
    """(kind/name, pod spec) of every Deployment, StatefulSet and Job."""
    return [
        (f"{d['kind']}/{d['metadata']['name']}", d["spec"]["template"]["spec"])
        for d in manifests()
        if d["kind"] in {"Deployment", "StatefulSet", "Job"}
    ]


def containers() -> list[tuple[str, dict]]:
    return [
        (f"{name}/{c['name']}", c)
        for name, spec in workloads()
        for c in spec.get("initContainers", []) + spec["containers"]
    ]


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def command_words(command) -> list[str]:
    """A command as words; an `sh -c` script's words too."""
    words = shlex.split(command) if isinstance(command, str) else [str(w) for w in command or []]
    if words[:2] == ["sh", "-c"]:
        return words[:2] + shlex.split(words[2])
    return words


def manage_commands(words: list[str]) -> list[str]:
    return [words[i + 1] for i, word in enumerate(words[:-1]) if word == "manage.py"]


def process_of(words: list[str]) -> str:
    """Which of Pantheon's HTTP processes a command runs: "serve", "router", or "" for any other."""
    commands = manage_commands(words)
    return commands[0] if commands and commands[0] in {"serve", "router"} else ""


def probed_paths() -> list[tuple[str, str, str]]:
    """(where, process, path) of every HTTP probe in the manifests and every healthcheck URL in the compose file."""
    found = []
    for name, container in containers():
        process = process_of(command_words(container.get("command", []) + container.get("args", [])))
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            if "httpGet" in container.get(kind, {}):
                found.append((f"{name} {kind}", process, container[kind]["httpGet"]["path"]))
    for name, service in compose()["services"].items():
        test = " ".join(service.get("healthcheck", {}).get("test", []))
        for path in re.findall(r"http://127\.0\.0\.1:8000(/[^'\"\s]*)", test):
            found.append((f"compose {name} healthcheck", process_of(command_words(service.get("command"))), path))
    return found


def deploy_texts() -> dict[str, str]:
    files = [DEPLOY / "Dockerfile", COMPOSE, *sorted((DEPLOY / "kubernetes").rglob("*.yaml"))]
    return {str(path.relative_to(REPO_ROOT)): path.read_text() for path in files}


def test_every_yaml_file_is_in_a_kustomization():
    """A manifest no kustomization names is never applied: nobody notices until it is missing in the cluster."""
    named = {Path(root / entry).resolve() for root in KUSTOMIZATIONS for entry in _resources(root)}
    files = {path.resolve() for path in (DEPLOY / "kubernetes").rglob("*.yaml") if path.name != "kustomization.yaml"}
    files -= set((DEPLOY / "kubernetes" / "prometheus").glob("*.yaml"))  # a Prometheus config, not a manifest
    assert files - named == set()


def _resources(root: Path) -> list[str]:
    kustomization = yaml.safe_load((root / "kustomization.yaml").read_text())
    listed = kustomization.get("resources", []) + kustomization.get("components", [])
    return [e for e in listed if not (root / e).is_dir()] + [
        f"{e}/{sub}" for e in listed if (root / e).is_dir() for sub in _resources(root / e)
    ]


def test_the_manifests_run_the_expected_workloads():
    kinds = {f"{d['kind']}/{d['metadata']['name']}" for d in manifests()}
    assert {
        "Deployment/pantheon-router",
        "Service/pantheon-router",
        "StatefulSet/pantheon-instance",
        "Service/pantheon-instance",
        "Deployment/pantheon-celery-worker",
        "Deployment/pantheon-celery-beat",
        "Job/pantheon-setup",
        "StatefulSet/pantheon-postgres",
        "StatefulSet/pantheon-redis",
    } <= kinds
    beat = next(d for d in manifests() if d["metadata"]["name"] == "pantheon-celery-beat")
    assert beat["spec"]["replicas"] == 1 and beat["spec"]["strategy"]["type"] == "Recreate"  # never two beats


@pytest.mark.parametrize("where,process,path", probed_paths(), ids=lambda v: str(v))
def test_every_probe_path_is_a_route_of_the_process_it_probes(where, process, path):
    """An instance's probe path answers 200 from the project's routes; a router's resolves in the router's own."""
    if process == "serve":
        response = Client().get(path)
        assert response.status_code == 200, f"{where}: GET {path} answered {response.status_code}"
    elif process == "router":
        try:
            resolve(path, urlconf=ROUTER_URLCONF)
        except Resolver404:
            pytest.fail(f"{where}: {path} is no route of the router ({ROUTER_URLCONF})")
    else:
        pytest.fail(f"{where}: probes {path} on a process that is neither serve nor the router")


def test_every_manage_py_command_exists():
    words = [command_words(c.get("command", []) + c.get("args", [])) for _, c in containers()]
    words += [command_words(s.get("command")) for s in compose()["services"].values()]
    named = {command for w in words for command in manage_commands(w)}
    assert {"serve", "migrate", "create_token", "load_model", "router"} <= named  # the parse found them
    assert named - set(get_commands()) == set()


def test_pantheon_containers_keep_the_images_entrypoint():
    """`command:` would replace tini (deploy/Dockerfile's ENTRYPOINT): `serve` would run as PID 1 with nothing to
    reap what its worker processes leave. The manifests give their commands as `args:`."""
    replaced = [name for name, c in containers() if c["image"].startswith("pantheon") and "command" in c]
    assert replaced == []


def test_the_celery_processes_name_the_projects_app():
    words = [command_words(c.get("args", [])) for _, c in containers()]
    words += [command_words(s.get("command")) for s in compose()["services"].values()]
    celery = [w for w in words if w[:1] == ["celery"]]
    assert len(celery) == 4  # worker and beat, in each
    assert all(w[1:3] == ["-A", "pantheon_site"] for w in celery)
    assert importlib.util.find_spec("pantheon_site.celery") is not None


def test_every_pantheon_variable_in_the_deploy_files_is_a_setting():
    """A misspelt variable is silently ignored by a container; here it is a failure."""
    settings_text = (REPO_ROOT / "pantheon_site" / "settings.py").read_text()
    read = set(re.findall(r"[\"'](PANTHEON_[A-Z0-9_]+)[\"']", settings_text))
    used = {name: path for path, text in deploy_texts().items() for name in re.findall(r"\bPANTHEON_[A-Z0-9_]+", text)}
    unknown = {name: path for name, path in used.items() if name not in read}
    assert unknown == {}


def test_every_secret_key_the_manifests_read_is_one_the_docs_create():
    """A key missing from the Secret keeps the pod from starting (CreateContainerConfigError)."""
    documented = set(re.findall(r"--from-literal=([A-Z_]+)=", (REPO_ROOT / "docs" / "deploy.md").read_text()))
    read = set(
        re.findall(r"secretKeyRef: \{name: pantheon-secrets, key: ([A-Z_]+)\}", "".join(deploy_texts().values()))
    )
    read |= set(
        re.findall(
            r"key: ([A-Z_]+)\n", (DEPLOY / "kubernetes/components/servicemonitor/servicemonitor.yaml").read_text()
        )
    )
    assert read and read <= documented


def test_instances_advertise_the_names_their_headless_service_gives_them():
    """The router reaches an instance at PANTHEON_PUBLIC_URL: it must be the pod's own stable DNS name."""
    (instances,) = [
        d for d in manifests() if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "pantheon-instance"
    ]
    service_name = instances["spec"]["serviceName"]
    (service,) = [d for d in manifests() if d["kind"] == "Service" and d["metadata"]["name"] == service_name]
    assert service["spec"]["clusterIP"] == "None"
    serve = instances["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in serve["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    port = serve["ports"][0]["containerPort"]
    assert env["PANTHEON_PUBLIC_URL"]["value"] == f"http://$(POD_NAME).{service_name}.$(POD_NAMESPACE).svc:{port}"
    assert f"--port {port}" in " ".join(map(str, serve["args"]))
    gpu = serve["resources"]["limits"]["nvidia.com/gpu"]
    assert gpu == serve["resources"]["requests"]["nvidia.com/gpu"] == "1"


def test_the_compose_file_runs_a_router_two_instances_and_their_services():
    services = compose()["services"]
    assert set(services) == EXPECTED_COMPOSE_SERVICES
    for name in ("instance-1", "instance-2"):
        env = services[name]["environment"]
        assert (
            env["PANTHEON_PUBLIC_URL"] == f"http://{name}:8000" and env["PANTHEON_REGISTRY_URL"] == "http://router:8000"
        )
        targets = {re.search(r":(/[^:]+)(:ro)?$", volume).group(1) for volume in services[name]["volumes"]}
        assert targets >= {"/data", "/files", "/models"}
    assert services["instance-1"]["volumes"][0] != services["instance-2"]["volumes"][0]  # a data folder each
    assert all("healthcheck" in services[n] for n in EXPECTED_COMPOSE_SERVICES - {"setup", "celery-beat"})
