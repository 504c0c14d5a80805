"""What the deploy tests share: the overlays built with ``kubectl kustomize``, the objects' parts,
the Dockerfile's instructions, the services' settings classes and the tandem CLI's parser."""

from __future__ import annotations

import functools
import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKERFILE = ROOT / "Dockerfile"
OVERLAYS = ("split", "split-direct", "colocated", "dev")
K8S_VERSION = "1.30"
SERVICES = ("gateway", "verifier", "drafter")
MODE_SERVICES = {"split": {"gateway", "verifier", "drafter"},
                 "split-direct": {"gateway", "verifier", "drafter"},
                 "colocated": {"gateway", "verifier"},
                 "dev": {"gateway", "verifier", "drafter"}}
GPU_SERVICES = {"split": {"verifier", "drafter"}, "split-direct": {"verifier", "drafter"}, "colocated": {"verifier"},
                "dev": set()}
# the overlays where the verifier runs the rounds (the gateway streams: its TANDEM_COLOCATED is true)
VERIFIER_ROUNDS = {"colocated", "split-direct"}
# who may call each model service's gRPC port: the gateway, except where the verifier calls its drafter
CALLERS = {overlay: {"verifier": "gateway", "drafter": "verifier" if overlay == "split-direct" else "gateway"}
           for overlay in OVERLAYS}
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


def labels_match(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())
