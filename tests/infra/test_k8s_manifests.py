"""The Kubernetes manifests under infra/k8s and infra/mlflow, validated offline.

Built-in kinds against Kubernetes' own JSON schemas (kubernetes-validate, strict, oldest and
newest supported minor); RayCluster/RayJob against our partial KubeRay schema, their pod
templates against Kubernetes' PodTemplateSpec, and the cluster spec through Ray's own KubeRay
autoscaler code. Every validator is also shown to reject a broken manifest.
"""

from __future__ import annotations

import copy
import re
import shlex

import jsonschema
import kubernetes_validate
import pytest
import ray

from tests.infra.validation import (
    INFRA,
    RAY_KINDS,
    REPO,
    all_manifests,
    container_env,
    derive_autoscaling_config,
    example_secrets,
    groups,
    k8s_versions,
    load_documents,
    parse_ray_start,
    pod_templates,
    pyproject,
    ray_container,
    ray_start_flags,
    validate_builtin,
    validate_kuberay,
    validate_pod_template,
)

MANIFESTS = all_manifests()
BUILTIN = [(p, d) for p, d in MANIFESTS if d["kind"] not in RAY_KINDS]
RAY_DOCS = [(p, d) for p, d in MANIFESTS if d["kind"] in RAY_KINDS]
VERSIONS = k8s_versions()
PROJECT_VERSION = pyproject()["project"]["version"]
IMAGE = f"registry.example.com/humanvision:{PROJECT_VERSION}"
TRACKING_URI = "http://mlflow.mlflow.svc:5000"


def _id(item) -> str:
    path, doc = item
    return f"{path.relative_to(INFRA)}:{doc['kind']}/{doc['metadata']['name']}"


def _doc(name: str) -> dict:
    return next(d for _p, d in RAY_DOCS if d["metadata"]["name"] == name)


def test_the_expected_manifests_are_there():
    kinds = {(d["kind"], d["metadata"]["name"]) for _p, d in MANIFESTS}
    assert {
        ("RayCluster", "hv-ray"),
        ("RayJob", "hv-curate-humans1b"),
        ("RayJob", "hv-dag"),
        ("Deployment", "mlflow"),
        ("Service", "mlflow"),
        ("StatefulSet", "mlflow-postgres"),
        ("Service", "mlflow-postgres"),
        ("Secret", "mlflow-backend"),
        ("Secret", "hv-object-store"),
        ("PersistentVolumeClaim", "hv-models"),
    } <= kinds
    assert VERSIONS[0] == "1.30" and len(VERSIONS) == 2


# --- built-in kinds: Kubernetes' schemas -------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("item", BUILTIN, ids=_id)
def test_builtin_manifest_matches_kubernetes_schema(item, version):
    _path, doc = item
    validate_builtin(doc, version)


@pytest.mark.parametrize(
    "mutate, where",
    [
        (lambda d: d["spec"].__setitem__("replicas", "one"), "replicas"),  # wrong type
        (lambda d: d["spec"]["template"]["spec"]["containers"][0].__setitem__("resource", {}), "resource"),  # typo
        (lambda d: d["spec"]["template"]["spec"]["containers"][0].pop("name"), "name"),  # required field
        (
            lambda d: d["spec"]["template"]["spec"]["containers"][0]["startupProbe"]["httpGet"].__setitem__("path", 5),
            "path",
        ),
    ],
)
def test_kubernetes_schema_rejects_a_broken_deployment(mutate, where):
    doc = copy.deepcopy(next(d for _p, d in BUILTIN if d["kind"] == "Deployment"))
    mutate(doc)
    with pytest.raises(kubernetes_validate.ValidationError) as err:
        validate_builtin(doc, VERSIONS[-1])
    assert where in str(err.value.message) + str(list(err.value.path))


def test_an_unknown_kind_has_no_schema():
    doc = copy.deepcopy(next(d for _p, d in BUILTIN if d["kind"] == "Deployment"))
    doc["kind"] = "Deploymnet"
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        validate_builtin(doc, VERSIONS[-1])


# --- KubeRay kinds: our partial schema, Kubernetes' PodTemplateSpec, Ray's own reading ------------


@pytest.mark.parametrize("item", RAY_DOCS, ids=_id)
def test_ray_manifest_matches_kuberay_schema(item):
    _path, doc = item
    validate_kuberay(doc)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("item", RAY_DOCS, ids=_id)
def test_embedded_pod_templates_match_kubernetes_schema(item, version):
    _path, doc = item
    templates = list(pod_templates(doc))
    assert len(templates) >= 3  # head and at least two worker groups
    for _where, template in templates:
        validate_pod_template(template, version)


def _group(doc, name):
    return dict(groups(doc))[name]


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["spec"].__setitem__("workerGroupSpec", d["spec"].pop("workerGroupSpecs")), "workerGroupSpec"),
        (lambda d: _group(d, "cpu-curation")["rayStartParams"].__setitem__("num-cpus", 0), "0 is not of type 'string'"),
        (lambda d: _group(d, "gpu-train").pop("groupName"), "groupName"),
        (lambda d: _group(d, "gpu-train").__setitem__("maxReplicas", -1), "-1"),
        (lambda d: d["spec"]["autoscalerOptions"].__setitem__("upscalingMode", "Fast"), "Fast"),
        (lambda d: d["spec"].__setitem__("rayVersion", 2.6), "2.6"),
        (lambda d: d.__setitem__("apiVersion", "ray.io/v1alpha1"), "ray.io/v1"),
        (lambda d: d["metadata"].__setitem__("name", "HV_ray"), "HV_ray"),
    ],
)
def test_kuberay_schema_rejects_a_broken_raycluster(mutate, message):
    doc = copy.deepcopy(_doc("hv-ray"))
    mutate(doc)
    with pytest.raises(jsonschema.ValidationError) as err:
        validate_kuberay(doc)
    assert message in str(err.value.message)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda s: s.__setitem__("submissionMode", "K8sMode"), "K8sMode"),
        (lambda s: s.pop("entrypoint"), "entrypoint"),
        (lambda s: s.pop("rayClusterSpec"), "not valid under any of the given schemas"),  # nor clusterSelector
        (lambda s: s.__setitem__("shutdownAfterJobFinishes", "yes"), "yes"),
    ],
)
def test_kuberay_schema_rejects_a_broken_rayjob(mutate, message):
    doc = copy.deepcopy(_doc("hv-curate-humans1b"))
    mutate(doc["spec"])
    with pytest.raises(jsonschema.ValidationError) as err:
        validate_kuberay(doc)
    assert message in str(err.value.message)


def test_pod_template_check_rejects_a_broken_worker_template():
    doc = copy.deepcopy(_doc("hv-ray"))
    container = ray_container(_group(doc, "gpu-train"))
    container["resources"]["limits"]["nvidia.com/gpu"] = ["8"]
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_pod_template(_group(doc, "gpu-train")["template"], VERSIONS[-1])


@pytest.mark.parametrize("item", RAY_DOCS, ids=_id)
def test_ray_reads_the_cluster_spec_as_intended(item):
    """Ray's KubeRay autoscaler derives node types from the spec (and runs Ray's validate_config)."""
    _path, doc = item
    config = derive_autoscaling_config(doc)
    node_types = config["available_node_types"]
    assert node_types["headgroup"]["resources"]["CPU"] == 0
    assert "GPU" not in node_types["headgroup"]["resources"]
    worker_groups = {name: g for name, g in groups(doc) if name != "head"}
    assert set(node_types) == {"headgroup", *worker_groups}
    for name, group in worker_groups.items():
        resources = node_types[name]["resources"]
        limits = ray_container(group)["resources"]["limits"]
        assert resources["CPU"] == int(limits["cpu"]) > 0
        assert node_types[name]["max_workers"] == group["maxReplicas"]
        assert node_types[name]["min_workers"] == group["minReplicas"]
        if name.startswith("cpu-"):
            assert "GPU" not in resources
        else:
            assert name.startswith("gpu-") and resources["GPU"] == int(limits["nvidia.com/gpu"]) >= 1
    assert config["max_workers"] == sum(g["maxReplicas"] for g in worker_groups.values())


def test_ray_rejects_a_cluster_spec_it_cannot_autoscale():
    doc = copy.deepcopy(_doc("hv-ray"))
    _group(doc, "gpu-train")["maxReplicas"] = "sixteen"
    with pytest.raises(TypeError):
        derive_autoscaling_config(doc)


@pytest.mark.parametrize("item", RAY_DOCS, ids=_id)
def test_kuberay_operator_rules(item):
    """Rules the KubeRay operator enforces at reconcile time (utils/validation.go) and ours."""
    _path, doc = item
    spec = doc["spec"] if doc["kind"] == "RayCluster" else doc["spec"]["rayClusterSpec"]
    assert spec["rayVersion"] == ray.__version__ == "2.60.0"
    assert spec["enableInTreeAutoscaling"] is True
    assert spec["authOptions"]["mode"] == "token"  # needs rayVersion >= 2.52.0
    names = [name for name, _g in groups(doc)]
    assert len(names) == len(set(names)) and "headgroup" not in names
    for name, group in groups(doc):
        assert group["template"]["spec"]["containers"], name
        assert "labels" not in group["rayStartParams"], name
        assert not group.get("suspend"), name
        resources = ray_container(group)["resources"]
        assert resources["requests"] == resources["limits"], f"{name}: Guaranteed QoS (requests == limits)"
        if name == "head":
            assert "nvidia.com/gpu" not in resources["limits"]
            assert group["serviceType"] == "ClusterIP"
        else:
            assert 0 <= group["minReplicas"] <= group.get("replicas", 0) <= group["maxReplicas"], name
            assert group["maxReplicas"] >= 1, name


@pytest.mark.parametrize("item", RAY_DOCS, ids=_id)
def test_ray_start_params_are_ray_start_flags(item):
    _path, doc = item
    for name, group in groups(doc):
        params = parse_ray_start(ray_start_flags(group["rayStartParams"], head=name == "head"))
        if name == "head":
            assert params["num_cpus"] == 0 and params["dashboard_host"] == "0.0.0.0"


def test_ray_start_check_rejects_an_unknown_flag():
    with pytest.raises(Exception, match="no-such-flag"):
        parse_ray_start(ray_start_flags({"no-such-flag": "1"}, head=True))


# --- what the pods share ----------------------------------------------------------------------------


def _ray_containers():
    for _path, doc in RAY_DOCS:
        for name, group in groups(doc):
            yield doc, name, group, ray_container(group)


def test_every_ray_pod_runs_the_platform_image():
    for doc, name, _group, container in _ray_containers():
        assert container["image"] == IMAGE, (doc["metadata"]["name"], name)


def test_images_are_pinned():
    for path, doc in MANIFESTS:
        for _where, template in (
            pod_templates(doc)
            if doc["kind"] in RAY_KINDS
            else [("template", doc["spec"]["template"])]
            if "template" in doc.get("spec", {})
            else []
        ):
            for container in template["spec"]["containers"]:
                image = container["image"]
                assert re.fullmatch(r"[\w.\-/]+:[\w.\-]+", image), (path.name, image)
                assert not image.endswith(":latest"), (path.name, image)


def test_ray_pods_get_tracking_uri_credentials_and_models():
    secrets = example_secrets()
    pvcs = {
        (d["metadata"]["namespace"], d["metadata"]["name"])
        for _p, d in MANIFESTS
        if d["kind"] == "PersistentVolumeClaim"
    }
    for doc, name, group, container in _ray_containers():
        where = (doc["metadata"]["name"], name)
        namespace = doc["metadata"]["namespace"]
        assert namespace == "humanvision", where
        env = container_env(container, namespace, secrets)
        assert env["MLFLOW_TRACKING_URI"] == TRACKING_URI, where
        assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"} <= set(env), where
        pod = group["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        assert mounts["/models"]["readOnly"] is True, where
        claim = volumes[mounts["/models"]["name"]]["persistentVolumeClaim"]
        assert (namespace, claim["claimName"]) in pvcs, where
        assert volumes[mounts["/dev/shm"]["name"]]["emptyDir"]["medium"] == "Memory", where
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0, where
        assert container["securityContext"]["allowPrivilegeEscalation"] is False, where


def test_gpu_groups_tolerate_the_gpu_taint_and_cpu_groups_ask_for_no_gpu():
    for doc, name, group, container in _ray_containers():
        gpus = container["resources"]["limits"].get("nvidia.com/gpu")
        tolerations = group["template"]["spec"].get("tolerations", [])
        if name.startswith("gpu-"):
            assert int(gpus) >= 1 and any(t["key"] == "nvidia.com/gpu" for t in tolerations), name
        else:
            assert gpus is None, (doc["metadata"]["name"], name)


# --- the RayJobs: what they run ------------------------------------------------------------------


def _entrypoint(doc):
    argv = shlex.split(doc["spec"]["entrypoint"])
    assert not set(doc["spec"]["entrypoint"]) & set(";&|`$<>"), "one command: KubeRay runs it through a shell"
    assert argv[0] == "python" and argv[2] == "--config", argv
    script, config = (REPO / argv[1].removeprefix("/app/"), REPO / argv[3].removeprefix("/app/"))
    assert argv[1].startswith("/app/") and argv[3].startswith("/app/"), "absolute paths in the image's /app"
    return script, config


@pytest.mark.parametrize("name", ["hv-curate-humans1b", "hv-dag"])
def test_rayjob_entrypoint_runs_a_script_of_this_repo(name):
    for path in _entrypoint(_doc(name)):
        rel = str(path.relative_to(REPO))
        assert path.is_file(), rel


def test_curate_job_config_fits_the_cluster():
    """The recipe the curate RayJob runs: weights under the /models mount, tracking to the
    shared server, and enough GPUs in the cluster for the detector actors it asks for."""
    from curation.recipe import CurationConfig
    from infra.config import config_to_dict, load_config

    doc = _doc("hv-curate-humans1b")
    _script, config_path = _entrypoint(doc)
    cfg = load_config(CurationConfig, config_path, [])
    cfg.validate()
    assert cfg.tracking.uri == TRACKING_URI
    assert cfg.output_dir.startswith("s3://") and cfg.input.uri.startswith("s3://")

    def weights(node, key=""):
        if isinstance(node, dict):
            for k, v in node.items():
                yield from weights(v, k)
        elif key.endswith("weights") and isinstance(node, str) and node:
            yield node

    assert all(w.startswith("/models/") for w in weights(config_to_dict(cfg)))

    det = cfg.detector
    gpu_groups = [g for name, g in groups(doc) if name.startswith("gpu-")]
    gpus = sum(g["maxReplicas"] * int(ray_container(g)["resources"]["limits"]["nvidia.com/gpu"]) for g in gpu_groups)
    assert gpus >= det.num_actors * det.num_gpus
    for g in gpu_groups:
        limits = ray_container(g)["resources"]["limits"]
        actors_per_pod = int(limits["nvidia.com/gpu"]) / det.num_gpus
        assert actors_per_pod * det.num_cpus <= int(limits["cpu"])


def test_rayjobs_clean_up_and_retry():
    for name in ("hv-curate-humans1b", "hv-dag"):
        spec = _doc(name)["spec"]
        assert spec["submissionMode"] == "K8sJobMode"
        assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] > 0
        assert spec["backoffLimit"] >= 1


def test_dag_job_cluster_is_the_long_lived_cluster_spec():
    """rayjob-dag.yaml embeds raycluster.yaml's spec verbatim (one place to size the cluster)."""
    assert _doc("hv-dag")["spec"]["rayClusterSpec"] == _doc("hv-ray")["spec"]


def test_namespaces_are_declared():
    declared = {d["metadata"]["name"] for _p, d in MANIFESTS if d["kind"] == "Namespace"}
    used = {d["metadata"]["namespace"] for _p, d in MANIFESTS if d["kind"] != "Namespace"}
    assert used <= declared == {"humanvision", "mlflow"}


def test_files_parse_as_yaml_documents():
    for folder in ("k8s", "mlflow"):
        for path in (INFRA / folder).glob("*.yaml"):
            assert all("apiVersion" in d and "kind" in d for d in load_documents(path)), path
