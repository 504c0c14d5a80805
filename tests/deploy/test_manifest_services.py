"""What each overlay's containers run: tandem subcommands its CLI parses, ports and native gRPC probes
that match the settings (the probes on the plaintext health port: they cannot speak TLS), a ConfigMap and
env that load into each service's own pydantic-settings class and say its mode, and traces exported to
the overlay's Jaeger. (TLS, API keys and NetworkPolicies: test_manifest_security.py.)"""

from __future__ import annotations

import pytest

from tests.deploy.manifests import (
    MODE_SERVICES,
    OVERLAYS,
    VERIFIER_ROUNDS,
    assert_tandem_command,
    build,
    config_map,
    container_argv,
    container_env,
    kinds,
    labels_match,
    load_settings,
    main_container,
    pod_spec,
    setting_env_names,
    settings_classes,
    tandem_deployments,
)


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
        assert ports["health"] == settings.health_port, f"tandem-{component}: health port != TANDEM_HEALTH_PORT"
        assert len(set(ports.values())) == len(ports), f"tandem-{component}: two ports share a number"
        annotations = d["spec"]["template"]["metadata"].get("annotations", {})
        assert annotations.get("prometheus.io/port") == str(settings.metrics_port)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert probe in c, f"{overlay}: tandem-{component} has no {probe}"
            assert c[probe].get("grpc", {}).get("port") == settings.health_port, \
                f"{overlay}: tandem-{component} {probe} is not a native gRPC probe on the health port"


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
    assert gateway.colocated is (overlay in VERIFIER_ROUNDS)
    host, _, port = gateway.verifier_address.rpartition(":")
    assert host in services and int(port) in {p["port"] for p in services[host]["spec"]["ports"]}
    assert services[host]["spec"]["selector"] == deployments["verifier"]["spec"]["selector"]["matchLabels"]
    if overlay == "colocated":
        assert loaded["verifier"].draft != "none", "the co-located verifier must embed a drafter"
    else:
        assert loaded["verifier"].draft == "none", "a split-mode verifier should not embed a drafter"
        assert loaded["drafter"].draft != "none"
        # who calls the drafter: the verifier where it runs the rounds (split-direct), else the gateway
        caller = loaded["verifier"].direct_drafter_address if overlay in VERIFIER_ROUNDS else gateway.drafter_address
        assert (loaded["verifier"].direct_drafter_address is None) is (overlay not in VERIFIER_ROUNDS)
        host, _, port = caller.rpartition(":")
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
    assert labels_match(jaeger["spec"]["selector"], jaeger_deployment["spec"]["template"]["metadata"]["labels"])
    assert "all-in-one" in pod_spec(jaeger_deployment)["containers"][0]["image"]
    for component, d in tandem_deployments(objects).items():
        env = container_env(objects, main_container(d, component))
        assert env.get("OTEL_EXPORTER_OTLP_ENDPOINT") == "http://jaeger:4317", f"tandem-{component}"
        assert env.get("OTEL_SERVICE_NAME") == f"tandem-{component}"
        assert exporters_from_env(env) == ["otlp"], f"tandem-{component} would not export spans"
