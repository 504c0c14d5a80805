"""The Kubernetes deployment (deploy/): every overlay is built with ``kubectl kustomize``; each object
must validate strictly (unknown fields are errors) against the Kubernetes 1.30 schemas of
``kubernetes-validate`` (offline), hold the objects its mode needs, select its pods, and run hardened.

What the containers run and with which settings: test_manifest_services.py.
"""

from __future__ import annotations

import re

import pytest

from tests.deploy.manifests import (
    GPU,
    GPU_SERVICES,
    K8S_VERSION,
    MODE_SERVICES,
    OVERLAYS,
    all_containers,
    assert_tandem_command,
    build,
    container_argv,
    dockerfile_env,
    kinds,
    labels_match,
    pod_spec,
    tandem_deployments,
)

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
                     ("PodDisruptionBudget", f"tandem-{s}"), ("NetworkPolicy", f"tandem-{s}")}
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


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_and_pdbs_select_their_pods(overlay):
    objects = build(overlay)
    deployments = kinds(objects, "Deployment")
    for svc in kinds(objects, "Service").values():
        name = svc["metadata"]["name"]
        targets = [d for d in deployments.values()
                   if labels_match(svc["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"])]
        assert len(targets) == 1, f"{overlay}: Service {name} selects {len(targets)} Deployments"
        port_names = {p["name"] for c in pod_spec(targets[0])["containers"] for p in c.get("ports", [])}
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in port_names, f"{overlay}: Service {name} targets a port the pods lack"
        if name.endswith("-headless"):
            assert svc["spec"]["clusterIP"] == "None", f"{name} should be headless"
            assert targets[0]["metadata"]["name"] == name.removesuffix("-headless")
    for pdb in kinds(objects, "PodDisruptionBudget").values():
        d = deployments[pdb["metadata"]["name"]]
        assert labels_match(pdb["spec"]["selector"]["matchLabels"], d["spec"]["template"]["metadata"]["labels"])
    for d in deployments.values():
        assert labels_match(d["spec"]["selector"]["matchLabels"], d["spec"]["template"]["metadata"]["labels"])


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
