"""How the overlays protect the services: every service loads mutual-TLS settings whose files come from its own
secret (tandem-<service>-tls: tls.crt, tls.key, ca.crt), the gateway an API keys secret and client-facing TLS;
NetworkPolicies let only the gateway's pods reach the verifier's gRPC port and the drafter's (the verifier's pods,
where it calls its drafter), anyone the gateway's,
and metrics and health only this namespace (and namespaces labelled for scraping); deploy/cert-manager makes exactly
the secrets the overlays mount, with the names the gateway dials and a client certificate for the gateway alone."""

from __future__ import annotations

import posixpath
import subprocess

import pytest
import yaml

from tests.deploy.manifests import (
    CALLERS,
    DEPLOY,
    KUBECTL,
    OVERLAYS,
    build,
    container_env,
    kinds,
    labels_match,
    load_settings,
    main_container,
    pod_spec,
    settings_classes,
    tandem_deployments,
)

FILES = {"tls_cert_file": "tls.crt", "tls_key_file": "tls.key", "tls_ca_file": "ca.crt"}


def _secret_of(deployment: dict, container: dict, path: str) -> tuple[str, str]:
    """(secret name, key in it) that ``path`` in ``container`` reads, from a read-only secret volume mount."""
    for mount in container.get("volumeMounts", []):
        if posixpath.dirname(path) == mount["mountPath"].rstrip("/"):
            volume = {v["name"]: v for v in pod_spec(deployment)["volumes"]}[mount["name"]]
            assert "secret" in volume, f"{path}: {mount['mountPath']} is not a secret"
            assert mount.get("readOnly") is True, f"{path}: mount {mount['mountPath']} read-only"
            assert "items" not in volume["secret"], "the secret's keys are its file names"
            return volume["secret"]["secretName"], posixpath.basename(path)
    pytest.fail(f"{path} is on no volume of {container['name']}")


def _settings(objects, component: str, monkeypatch):
    d = tandem_deployments(objects)[component]
    c = main_container(d, component)
    return d, c, load_settings(settings_classes()[component], container_env(objects, c), monkeypatch)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_service_speaks_mutual_tls_from_its_own_secret(overlay, monkeypatch):
    objects = build(overlay)
    for component in tandem_deployments(objects):
        d, c, settings = _settings(objects, component, monkeypatch)
        assert settings.insecure is False, f"{overlay}: tandem-{component} runs plaintext"
        for field, key in FILES.items():
            assert _secret_of(d, c, getattr(settings, field)) == (f"tandem-{component}-tls", key), \
                f"{overlay}: tandem-{component} {field}"
        assert settings.health_port is not None, f"{overlay}: tandem-{component}: probes need the health port"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_gateway_takes_api_keys_over_tls(overlay, monkeypatch):
    d, c, settings = _settings(build(overlay), "gateway", monkeypatch)
    assert _secret_of(d, c, settings.api_keys_file) == ("tandem-api-keys", "keys")
    assert _secret_of(d, c, settings.api_tls_cert_file) == ("tandem-gateway-tls", "tls.crt")
    assert _secret_of(d, c, settings.api_tls_key_file) == ("tandem-gateway-tls", "tls.key")


def _policies_of(objects, deployment: dict) -> list[dict]:
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    return [p for p in kinds(objects, "NetworkPolicy").values()
            if labels_match(p["spec"]["podSelector"].get("matchLabels", {}), labels)]


def _rules_for(policies: list[dict], port: str) -> list[dict]:
    """The ingress rules that let traffic reach the named ``port`` (a rule without ports allows every port)."""
    return [rule for p in policies for rule in p["spec"].get("ingress", [])
            if not rule.get("ports") or any(x.get("port") == port for x in rule["ports"])]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policies_let_only_the_caller_reach_the_model_services(overlay):
    """The verifier's gRPC port takes the gateway alone; the drafter's the gateway, or the verifier where it calls its
    drafter (split-direct)."""
    objects = build(overlay)
    deployments = tandem_deployments(objects)
    for component, d in deployments.items():
        policies = _policies_of(objects, d)
        assert len(policies) == 1 and "Ingress" in policies[0]["spec"]["policyTypes"], \
            f"{overlay}: tandem-{component} should be isolated for ingress by one NetworkPolicy"
        names = {p["name"] for p in main_container(d, component)["ports"]}
        for rule in policies[0]["spec"]["ingress"]:
            assert {x["port"] for x in rule.get("ports", [])} <= names, f"{overlay}: a policy names a missing port"
        grpc = _rules_for(policies, "grpc")
        if component == "gateway":
            assert any("from" not in rule for rule in grpc), "the gateway's clients may come from anywhere"
        else:
            assert grpc, f"{overlay}: nothing may reach tandem-{component}"
            caller = CALLERS[overlay][component]
            caller_labels = deployments[caller]["spec"]["template"]["metadata"]["labels"]
            for rule in grpc:
                sources = rule.get("from")
                assert sources, f"{overlay}: tandem-{component}'s gRPC port is open to anyone"
                for source in sources:
                    assert set(source) == {"podSelector"}, f"{overlay}: tandem-{component} gRPC from {source}"
                    assert labels_match(source["podSelector"].get("matchLabels", {}), caller_labels) and \
                        source["podSelector"]["matchLabels"].get("app.kubernetes.io/component") == caller, \
                        f"{overlay}: tandem-{component}'s gRPC port takes {source}, not the {caller} alone"
        for port in ("metrics", "health"):
            for rule in _rules_for(policies, port):
                assert rule.get("from"), f"{overlay}: tandem-{component}'s {port} port is open to anyone"


def _cert_manager(directory: str = "cert-manager") -> tuple[dict, ...]:
    if KUBECTL is None:
        pytest.skip("kubectl is not installed")
    proc = subprocess.run([KUBECTL, "kustomize", str(DEPLOY / directory)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return tuple(d for d in yaml.safe_load_all(proc.stdout) if d)


def test_cert_manager_makes_the_secrets_the_overlays_mount(monkeypatch):
    objects = _cert_manager()
    assert {o["apiVersion"] for o in objects} == {"cert-manager.io/v1"}
    certs = {c["spec"]["secretName"]: c["spec"] for c in kinds(objects, "Certificate").values()}
    issuers = kinds(objects, "Issuer")
    ca_issuer = issuers["tandem-ca"]["spec"]["ca"]["secretName"]
    assert certs[ca_issuer]["isCA"] is True and certs[ca_issuer]["issuerRef"]["name"] in issuers
    split = build("split")
    gateway = load_settings(settings_classes()["gateway"],
                            container_env(split, main_container(tandem_deployments(split)["gateway"], "gateway")),
                            monkeypatch)
    dialled = {"verifier": gateway.verifier_address.rpartition(":")[0],
               "drafter": gateway.drafter_address.rpartition(":")[0]}
    services = kinds(split, "Service")
    mounted = set()
    for component, d in tandem_deployments(split).items():
        mounted |= {v["secret"]["secretName"] for v in pod_spec(d)["volumes"] if "secret" in v}
        spec = certs[f"tandem-{component}-tls"]
        assert spec["issuerRef"] == {"name": "tandem-ca", "kind": "Issuer"}
        assert f"tandem-{component}" in spec["dnsNames"] and f"tandem-{component}" in services
        if component in dialled:
            assert dialled[component] in spec["dnsNames"], f"the gateway dials {dialled[component]}"
        assert "server auth" in spec["usages"]
        assert ("client auth" in spec["usages"]) is (component == "gateway"), \
            f"only the gateway may use its certificate as a client ({component})"
    # every TLS secret the overlays mount is made here; the API keys are the operator's own
    assert mounted - {"tandem-api-keys"} == set(certs) - {ca_issuer}


def test_cert_manager_direct_lets_the_verifier_call_its_drafter():
    """deploy/cert-manager-direct (for overlays/split-direct): the same certificates, the verifier's a client one
    too; the drafter's still serves only."""
    usages = {c["metadata"]["name"]: c["spec"].get("usages") for c in kinds(_cert_manager(), "Certificate").values()}
    direct = {c["metadata"]["name"]: c["spec"].get("usages")
              for c in kinds(_cert_manager("cert-manager-direct"), "Certificate").values()}
    assert set(direct) == set(usages)
    assert "client auth" in direct["tandem-verifier"] and "client auth" not in usages["tandem-verifier"]
    assert {k: v for k, v in direct.items() if k != "tandem-verifier"} == \
        {k: v for k, v in usages.items() if k != "tandem-verifier"}
    assert "client auth" not in direct["tandem-drafter"]
