"""The Kubernetes deployment (deploy/) and the image (Dockerfile).

Every overlay is built with ``kubectl kustomize``; each object must validate strictly (unknown
fields are errors) against the Kubernetes 1.30 schemas of ``kubernetes-validate`` (offline), hold
the objects its mode needs, and run only ``tandem`` subcommands and settings that exist: the
commands are parsed by the CLI's own parser and the ConfigMap plus each container's env are
loaded into the services' own pydantic-settings classes.
"""

from __future__ import annotations

import functools
import json
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKERFILE = ROOT / "Dockerfile"
OVERLAYS = ("split", "colocated", "dev")
K8S_VERSION = "1.30"
SERVICES = ("gateway", "verifier", "drafter")
MODE_SERVICES = {"split": {"gateway", "verifier", "drafter"},
                 "colocated": {"gateway", "verifier"},
                 "dev": {"gateway", "verifier", "drafter"}}
GPU_SERVICES = {"split": {"verifier", "drafter"}, "colocated": {"verifier"}, "dev": set()}
GPU = "nvidia.com/gpu"

KUBECTL = shutil.which("kubectl")


# ------------------------------------------------------------------------------------------- helpers


@functools.cache
def build(overlay: str) -> tuple[dict, ...]:
    if KUBECTL is None:
        pytest.skip("kubectl is not installed: the kustomize overlays cannot be built (install kubectl "
                    "to run the manifest tests)")
    proc = subprocess.run([KUBECTL, "kustomize", str(DEPLOY / "overlays" / overlay)],
                          check=False, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"kubectl kustomize deploy/overlays/{overlay} failed:\n{proc.stderr}"
    objects = tuple(d for d in yaml.safe_load_all(proc.stdout) if d)
    assert objects, f"deploy/overlays/{overlay} built no objects"
    return objects


def kinds(objects, kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def tandem_deployments(objects) -> dict[str, dict]:
    """component (gateway/verifier/drafter) -> its Deployment."""
    out = {}
    for d in kinds(objects, "Deployment").values():
        labels = d["spec"]["template"]["metadata"]["labels"]
        if labels.get("app.kubernetes.io/name") == "tandem":
            component = labels["app.kubernetes.io/component"]
            assert component not in out, f"two Deployments for the {component}"
            out[component] = d
    return out


def pod_spec(deployment: dict) -> dict:
    return deployment["spec"]["template"]["spec"]


def main_container(deployment: dict, component: str) -> dict:
    containers = {c["name"]: c for c in pod_spec(deployment)["containers"]}
    assert set(containers) == {component}, f"tandem-{component} should run one container named {component}"
    return containers[component]


def all_containers(deployment: dict) -> list[dict]:
    spec = pod_spec(deployment)
    return [*spec.get("initContainers", []), *spec["containers"]]


def config_map(objects) -> dict:
    maps = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("tandem-config")]
    assert len(maps) == 1, "expected one tandem-config ConfigMap"
    return maps[0]


def container_env(objects, container: dict) -> dict[str, str]:
    """What the process sees: envFrom ConfigMaps first, then env (which wins)."""
    maps = kinds(objects, "ConfigMap")
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        name = source["configMapRef"]["name"]
        assert name in maps, f"{container['name']}: envFrom names ConfigMap {name!r}, which the overlay lacks"
        env.update(maps[name].get("data", {}))
    for var in container.get("env", []):
        assert "value" in var, f"{container['name']}: env {var['name']} has no literal value"
        env[var["name"]] = var["value"]
    return env


def settings_classes() -> dict[str, type]:
    from drafter_svc.settings import DrafterSettings
    from gateway.settings import GatewaySettings
    from verifier_svc.settings import VerifierSettings

    return {"gateway": GatewaySettings, "verifier": VerifierSettings, "drafter": DrafterSettings}


def setting_env_names(cls) -> set[str]:
    prefix = cls.model_config["env_prefix"]
    return {(prefix + name).upper() for name in cls.model_fields}


def load_settings(cls, env: dict[str, str], monkeypatch):
    """The settings a service would start with under `env` (and nothing else named TANDEM_*)."""
    import os

    with monkeypatch.context() as m:
        for key in [k for k in os.environ if k.startswith("TANDEM_")]:
            m.delenv(key)
        for key, value in env.items():
            m.setenv(key, value)
        return cls()


@functools.cache
def cli_parser():
    from cli.main import build_parser

    return build_parser()


def cli_subcommands() -> set[str]:
    import argparse

    actions = [a for a in cli_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(actions) == 1
    return set(actions[0].choices)


def assert_tandem_command(argv: list[str], where: str) -> str:
    """`argv` runs the tandem CLI with a subcommand and flags its parser accepts; returns the subcommand."""
    assert argv and argv[0] == "tandem", f"{where}: runs {argv!r}, not the tandem CLI"
    assert len(argv) > 1, f"{where}: no tandem subcommand"
    assert argv[1] in cli_subcommands(), f"{where}: `tandem {argv[1]}` is not a subcommand " \
                                         f"(have {sorted(cli_subcommands())})"
    try:
        cli_parser().parse_args(argv[1:])
    except SystemExit as exc:  # argparse rejects unknown flags or values this way
        pytest.fail(f"{where}: `{shlex.join(argv)}` is rejected by the tandem CLI parser ({exc})")
    return argv[1]


def container_argv(container: dict) -> list[str]:
    """command + args; without a command, the image's ENTRYPOINT runs."""
    command = container.get("command") or dockerfile_exec("ENTRYPOINT")
    return [*command, *container.get("args", [])]


# ---------------------------------------------------------------------------------------- Dockerfile


@functools.cache
def dockerfile_instructions() -> tuple[tuple[str, str], ...]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    logical, current = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        logical.append(current + stripped)
        current = ""
    assert not current, "Dockerfile ends inside a continued line"
    out = []
    for entry in logical:
        instruction, _, rest = entry.partition(" ")
        out.append((instruction.upper(), rest.strip()))
    return tuple(out)


def final_stage() -> list[tuple[str, str]]:
    instructions = dockerfile_instructions()
    last_from = max(i for i, (ins, _) in enumerate(instructions) if ins == "FROM")
    return list(instructions[last_from:])


def dockerfile_exec(instruction: str) -> list[str]:
    found = [rest for ins, rest in final_stage() if ins == instruction]
    assert found, f"the Dockerfile's final stage has no {instruction}"
    value = json.loads(found[-1])  # exec form: a JSON array
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), f"{instruction} is not exec form"
    return value


def dockerfile_env() -> dict[str, str]:
    env = {}
    for ins, rest in final_stage():
        if ins == "ENV":
            for token in shlex.split(rest):
                key, sep, value = token.partition("=")
                assert sep, f"ENV {token!r}: use the KEY=value form"
                env[key] = value
    return env


def test_dockerfile_entrypoint_is_the_tandem_cli():
    entrypoint = dockerfile_exec("ENTRYPOINT")
    assert entrypoint == ["tandem"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts.get("tandem") == "cli.main:main", "the image's entrypoint is not the project's tandem script"
    assert_tandem_command([*entrypoint, *dockerfile_exec("CMD")], "Dockerfile ENTRYPOINT + CMD")


def test_dockerfile_base_user_cache_and_extras():
    froms = [rest for ins, rest in dockerfile_instructions() if ins == "FROM"]
    args = {}
    for ins, rest in dockerfile_instructions():
        if ins == "ARG" and "=" in rest:
            key, _, value = rest.partition("=")
            args.setdefault(key, value)
    base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], froms[-1].split()[0])
    assert re.fullmatch(r"nvidia/cuda:1[2-9]\.\d+(\.\d+)?-runtime-ubuntu2[2-9]\.04", base), \
        f"the final image should start from a CUDA runtime image, not {base}"
    # Ubuntu 22.04 ships Python 3.10: the project needs 3.11+
    assert not base.endswith("ubuntu22.04"), "Ubuntu 22.04's python3 is 3.10; the project requires >= 3.11"

    users = [rest for ins, rest in final_stage() if ins == "USER"]
    assert users, "the image runs as root"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "USER must be a numeric non-root uid (Kubernetes runAsNonRoot checks it)"

    installs = " ".join(rest for ins, rest in dockerfile_instructions() if ins == "RUN" and "pip install" in rest)
    assert re.search(r"\[gpu\]", installs), "the image does not install the gpu extra"

    env = dockerfile_env()
    assert env.get("PATH", "").startswith("/opt/tandem/bin"), "the tandem venv is not first on PATH"
    cache = env.get("TANDEM_CACHE")
    assert cache, "TANDEM_CACHE is not set in the image"
    volumes = [v for ins, rest in final_stage() if ins == "VOLUME" for v in json.loads(rest)]
    assert cache in volumes, f"the model cache {cache} is not a VOLUME"


def test_dockerfile_cache_variable_is_the_one_the_engine_reads(monkeypatch):
    from engine.assets import cache_dir

    cache = dockerfile_env()["TANDEM_CACHE"]
    monkeypatch.setenv("TANDEM_CACHE", cache)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert cache_dir() == Path(cache)


def test_dockerfile_copies_every_package_and_dockerignore_keeps_them():
    import fnmatch

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    needed = packages | {"pyproject.toml", pyproject["project"]["readme"]}
    copies = [shlex.split(rest) for ins, rest in dockerfile_instructions() if ins == "COPY" and "--from" not in rest]
    copied = {src.rstrip("/") for *sources, _ in copies for src in sources}
    assert "." in copied or needed <= copied, f"not copied into the image: {sorted(needed - copied)}"
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    dropped = {n for n in needed for p in patterns if fnmatch.fnmatch(n, p.rstrip("/"))}
    assert not dropped, f".dockerignore drops what the image needs: {sorted(dropped)}"
    assert all((ROOT / n).exists() for n in needed)


# --------------------------------------------------------------------------------------------- schemas


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates_strictly_against_kubernetes_1_30(overlay):
    import kubernetes_validate

    for obj in build(overlay):
        where = f"{overlay}: {obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
        try:
            version = kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{where}: {exc.message} at {'/'.join(str(p) for p in exc.absolute_path)}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            pytest.fail(f"{where}: {exc.message}")
        assert version == K8S_VERSION, f"{where}: validated against {version}, not {K8S_VERSION}"


def test_strict_validation_rejects_unknown_fields():
    """The check above can fail: a misspelt field in a container is an error in strict mode."""
    import copy

    import kubernetes_validate

    deployment = copy.deepcopy(tandem_deployments(build("dev"))["gateway"])
    pod_spec(deployment)["containers"][0]["livenessProbe"]["grpcc"] = {"port": 50051}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


# ---------------------------------------------------------------------------------- what each has


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_has_the_objects_of_its_mode(overlay):
    objects = build(overlay)
    services = MODE_SERVICES[overlay]
    expected = {("ConfigMap", "tandem-config"), ("Deployment", "jaeger"), ("Service", "jaeger")}
    for s in services:
        expected |= {("Deployment", f"tandem-{s}"), ("Service", f"tandem-{s}"),
                     ("PodDisruptionBudget", f"tandem-{s}")}
        if s != "gateway":
            expected.add(("Service", f"tandem-{s}-headless"))
    if overlay != "dev":
        expected.add(("HorizontalPodAutoscaler", "tandem-gateway"))
    got = {(o["kind"], re.sub(r"^(tandem-config)-[a-z0-9]+$", r"\1", o["metadata"]["name"])) for o in objects}
    assert got == expected, f"missing {sorted(expected - got)}, unexpected {sorted(got - expected)}"
    assert set(tandem_deployments(objects)) == services
    for o in objects:
        assert o["metadata"]["labels"].get("app.kubernetes.io/part-of") == "tandem", \
            f"{o['kind']}/{o['metadata']['name']} lacks app.kubernetes.io/part-of=tandem"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gpus_go_to_the_model_services_only(overlay):
    for component, d in tandem_deployments(build(overlay)).items():
        for c in all_containers(d):
            requests = c["resources"].get("requests", {})
            limits = c["resources"].get("limits", {})
            if component in GPU_SERVICES[overlay] and c in pod_spec(d)["containers"]:
                assert limits.get(GPU) == "1" and requests.get(GPU) == "1", \
                    f"{overlay}: tandem-{component} should request and be limited to one {GPU}"
            else:
                assert GPU not in requests and GPU not in limits, \
                    f"{overlay}: {c['name']} of tandem-{component} should not ask for a GPU"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_replicas(overlay):
    objects = build(overlay)
    deployments = tandem_deployments(objects)
    hpas = kinds(objects, "HorizontalPodAutoscaler")
    if overlay == "dev":
        assert all(d["spec"]["replicas"] == 1 for d in deployments.values())
        assert not hpas
    else:
        hpa = hpas["tandem-gateway"]
        assert hpa["apiVersion"] == "autoscaling/v2"
        assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                                 "name": deployments["gateway"]["metadata"]["name"]}
        assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
        assert any(m["type"] == "Resource" for m in hpa["spec"]["metrics"])


# ---------------------------------------------------------------------------------- pods and ports


def _labels_match(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_and_pdbs_select_their_pods(overlay):
    objects = build(overlay)
    deployments = kinds(objects, "Deployment")
    for svc in kinds(objects, "Service").values():
        name = svc["metadata"]["name"]
        targets = [d for d in deployments.values()
                   if _labels_match(svc["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"])]
        assert len(targets) == 1, f"{overlay}: Service {name} selects {len(targets)} Deployments"
        port_names = {p["name"] for c in pod_spec(targets[0])["containers"] for p in c.get("ports", [])}
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in port_names, f"{overlay}: Service {name} targets a port the pods lack"
        if name.endswith("-headless"):
            assert svc["spec"]["clusterIP"] == "None", f"{name} should be headless"
            assert targets[0]["metadata"]["name"] == name.removesuffix("-headless")
    for pdb in kinds(objects, "PodDisruptionBudget").values():
        d = deployments[pdb["metadata"]["name"]]
        assert _labels_match(pdb["spec"]["selector"]["matchLabels"], d["spec"]["template"]["metadata"]["labels"])
    for d in deployments.values():
        assert _labels_match(d["spec"]["selector"]["matchLabels"], d["spec"]["template"]["metadata"]["labels"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_are_hardened_with_resources(overlay):
    objects = build(overlay)
    for name, d in kinds(objects, "Deployment").items():
        spec = pod_spec(d)
        pod_sc = spec.get("securityContext", {})
        assert pod_sc.get("runAsNonRoot") is True, f"{name}: pod runAsNonRoot"
        assert pod_sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", f"{name}: pod seccompProfile"
        assert spec.get("automountServiceAccountToken") is False, f"{name}: no API token is needed"
        for c in all_containers(d):
            where = f"{overlay}: {name}/{c['name']}"
            sc = c.get("securityContext", {})
            assert sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True, f"{where}: runAsNonRoot"
            assert sc.get("allowPrivilegeEscalation") is False, f"{where}: allowPrivilegeEscalation"
            assert sc.get("readOnlyRootFilesystem") is True, f"{where}: readOnlyRootFilesystem"
            assert sc.get("capabilities", {}).get("drop") == ["ALL"], f"{where}: capabilities drop ALL"
            assert sc.get("seccompProfile", pod_sc.get("seccompProfile", {})).get("type") == "RuntimeDefault"
            for part in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(c.get("resources", {}).get(part, {})), f"{where}: {part}"
            mounted = {m["mountPath"] for m in c.get("volumeMounts", [])}
            assert "/tmp" in mounted, f"{where}: a read-only root needs a writable /tmp"
            volumes = {v["name"] for v in spec.get("volumes", [])}
            assert {m["name"] for m in c.get("volumeMounts", [])} <= volumes, f"{where}: mounts a missing volume"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_tandem_pods_fetch_the_model_into_the_cache_volume(overlay):
    image_env = dockerfile_env()
    cache, home = image_env["TANDEM_CACHE"], image_env["HOME"]
    for component, d in tandem_deployments(build(overlay)).items():
        spec = pod_spec(d)
        # Service links would set TANDEM_VERIFIER_PORT=tcp://... from the tandem-verifier Service
        assert spec.get("enableServiceLinks") is False, f"tandem-{component}: enableServiceLinks must be false"
        inits = spec.get("initContainers", [])
        assert [assert_tandem_command(container_argv(c), f"tandem-{component} init {c['name']}")
                for c in inits] == ["fetch"]
        images = {c["image"] for c in all_containers(d)}
        assert len(images) == 1 and re.fullmatch(r"\S+:\S+", images.pop()), \
            f"{overlay}: tandem-{component} should run one tagged tandem image"
        for c in all_containers(d):
            mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
            assert cache in mounts and home in mounts, f"tandem-{component}/{c['name']}: mount {cache} and {home}"
            assert not any(m.get("readOnly") for m in c["volumeMounts"] if m["mountPath"] == cache)
        cache_volume = {v["name"]: v for v in spec["volumes"]}[mounts[cache]]
        assert "emptyDir" in cache_volume or "persistentVolumeClaim" in cache_volume


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_containers_run_tandem_subcommands_that_exist(overlay):
    for component, d in tandem_deployments(build(overlay)).items():
        c = main_container(d, component)
        assert assert_tandem_command(container_argv(c), f"{overlay}: tandem-{component}") == component


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_grpc_probes_and_ports_match_the_settings(overlay, monkeypatch):
    objects = build(overlay)
    classes = settings_classes()
    for component, d in tandem_deployments(objects).items():
        c = main_container(d, component)
        settings = load_settings(classes[component], container_env(objects, c), monkeypatch)
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        grpc_port = getattr(settings, f"{component}_port")
        assert ports["grpc"] == grpc_port, f"tandem-{component}: containerPort grpc != TANDEM_{component.upper()}_PORT"
        assert ports["metrics"] == settings.metrics_port, f"tandem-{component}: metrics port != TANDEM_METRICS_PORT"
        annotations = d["spec"]["template"]["metadata"].get("annotations", {})
        assert annotations.get("prometheus.io/port") == str(settings.metrics_port)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert probe in c, f"{overlay}: tandem-{component} has no {probe}"
            assert c[probe].get("grpc", {}).get("port") == grpc_port, \
                f"{overlay}: tandem-{component} {probe} is not a native gRPC probe on {grpc_port}"


# --------------------------------------------------------------------------------------- settings


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_configmap_carries_only_real_settings(overlay):
    data = config_map(build(overlay))["data"]
    known = set().union(*(setting_env_names(cls) for cls in settings_classes().values()))
    unknown = {k for k in data if k.startswith("TANDEM_")} - known
    assert not unknown, f"{overlay}: ConfigMap keys that no service reads: {sorted(unknown)}"
    others = {k for k in data if not k.startswith("TANDEM_")}
    assert all(k.startswith("OTEL_") for k in others), f"{overlay}: unexpected keys {sorted(others)}"
    assert {"TANDEM_METRICS_PORT", "TANDEM_VERIFIER_ADDRESS"} <= set(data)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_service_starts_with_the_settings_of_its_mode(overlay, monkeypatch):
    """The ConfigMap + env of each container load into its settings class, and say the right mode."""
    objects = build(overlay)
    classes = settings_classes()
    deployments = tandem_deployments(objects)
    services = kinds(objects, "Service")
    loaded = {}
    for component, d in deployments.items():
        c = main_container(d, component)
        env = container_env(objects, c)
        for key in env:
            if key.startswith("TANDEM_") and key not in setting_env_names(classes[component]):
                # read by another service only: fine, the settings ignore it; but not a typo
                assert any(key in setting_env_names(cls) for cls in classes.values()), key
        loaded[component] = load_settings(classes[component], env, monkeypatch)

    gateway = loaded["gateway"]
    assert gateway.colocated is (overlay == "colocated")
    host, _, port = gateway.verifier_address.rpartition(":")
    assert host in services and int(port) in {p["port"] for p in services[host]["spec"]["ports"]}
    assert services[host]["spec"]["selector"] == deployments["verifier"]["spec"]["selector"]["matchLabels"]
    if overlay == "colocated":
        assert loaded["verifier"].draft != "none", "the co-located verifier must embed a drafter"
    else:
        assert loaded["verifier"].draft == "none", "a split-mode verifier should not embed a drafter"
        assert loaded["drafter"].draft != "none"
        host, _, port = gateway.drafter_address.rpartition(":")
        assert host in services and int(port) in {p["port"] for p in services[host]["spec"]["ports"]}
        assert services[host]["spec"]["selector"] == deployments["drafter"]["spec"]["selector"]["matchLabels"]
    for component in MODE_SERVICES[overlay] - {"gateway"}:
        s = loaded[component]
        assert s.device == ("cpu" if overlay == "dev" else "cuda"), f"{overlay}: {component} device {s.device}"
        assert s.k == gateway.k and s.max_k == gateway.max_k, "gateway and engines disagree on k / max_k"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_service_traces_to_jaeger(overlay):
    from rpc.telemetry import exporters_from_env

    objects = build(overlay)
    jaeger = kinds(objects, "Service")["jaeger"]
    ports = {p["name"]: p["port"] for p in jaeger["spec"]["ports"]}
    assert ports.get("otlp-grpc") == 4317 and ports.get("ui") == 16686
    jaeger_deployment = kinds(objects, "Deployment")["jaeger"]
    assert _labels_match(jaeger["spec"]["selector"], jaeger_deployment["spec"]["template"]["metadata"]["labels"])
    assert "all-in-one" in pod_spec(jaeger_deployment)["containers"][0]["image"]
    for component, d in tandem_deployments(objects).items():
        env = container_env(objects, main_container(d, component))
        assert env.get("OTEL_EXPORTER_OTLP_ENDPOINT") == "http://jaeger:4317", f"tandem-{component}"
        assert env.get("OTEL_SERVICE_NAME") == f"tandem-{component}"
        assert exporters_from_env(env) == ["otlp"], f"tandem-{component} would not export spans"
