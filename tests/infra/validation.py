"""Offline validators for the deployment files under infra/ (shared by the tests here).

Sources of truth, all on disk (nothing is fetched):
- Built-in Kubernetes kinds: the JSON schemas shipped in the ``kubernetes-validate`` wheel
  (generated from Kubernetes' OpenAPI, one set per minor version), used in strict mode so an
  unknown field fails. Checked against the oldest and newest Kubernetes we claim.
- KubeRay ``RayCluster`` / ``RayJob``: no package ships KubeRay's CRD schema, so
  ``infra/k8s/schemas/kuberay-v1-partial.schema.json`` is our own partial schema (see its
  description); every embedded pod template is then validated as a Kubernetes
  ``PodTemplateSpec`` by wrapping it in a core/v1 ``PodTemplate``, and the RayCluster spec is
  read by Ray's own KubeRay autoscaler code (``_derive_autoscaling_config_from_ray_cr``).
- Command lines: MLflow's and Ray's own click commands parse the flags we pass.
"""

from __future__ import annotations

import copy
import json
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import yaml

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (the project allows it): pip vendors the same parser
    from pip._vendor import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
KUBERAY_SCHEMA = INFRA / "k8s" / "schemas" / "kuberay-v1-partial.schema.json"

# The oldest Kubernetes minor these manifests are meant for (our choice: nothing in them needs
# a newer API); the newest is whatever the installed kubernetes-validate ships (1.37 in 1.37.0).
MIN_K8S = "1.30"

RAY_KINDS = {"RayCluster", "RayJob"}


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def load_documents(path: Path) -> list[dict]:
    """Every non-empty YAML document of ``path``."""
    with open(path) as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def all_manifests() -> list[tuple[Path, dict]]:
    """(file, document) for every Kubernetes manifest under infra/k8s and infra/mlflow."""
    out = []
    for folder in ("k8s", "mlflow"):
        for path in sorted((INFRA / folder).glob("*.yaml")):
            out.extend((path, doc) for doc in load_documents(path))
    return out


def k8s_versions() -> list[str]:
    import kubernetes_validate

    latest = kubernetes_validate.latest_version()
    return sorted({MIN_K8S, ".".join(latest.split(".")[:2])}, key=lambda v: tuple(map(int, v.split("."))))


def validate_builtin(doc: dict, version: str) -> None:
    """Strict validation of a built-in kind; raises ``kubernetes_validate.ValidationError``."""
    import kubernetes_validate

    kubernetes_validate.validate(doc, version, strict=True)


def validate_pod_template(template: dict, version: str) -> None:
    """A ``PodTemplateSpec`` validated by wrapping it in a core/v1 ``PodTemplate``."""
    wrapper = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "embedded"}, "template": template}
    validate_builtin(wrapper, version)


def kuberay_validator(kind: str) -> jsonschema.Draft202012Validator:
    schema = json.loads(KUBERAY_SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    schema = dict(schema)
    schema.pop("oneOf")
    schema["$ref"] = f"#/$defs/{kind}"
    return jsonschema.Draft202012Validator(schema)


def validate_kuberay(doc: dict) -> None:
    """Our partial KubeRay schema; raises ``jsonschema.ValidationError`` (the most relevant error)."""
    error = jsonschema.exceptions.best_match(kuberay_validator(doc["kind"]).iter_errors(doc))
    if error is not None:
        raise error


def cluster_spec(doc: dict) -> dict:
    """The RayCluster spec of a RayCluster or RayJob."""
    return doc["spec"] if doc["kind"] == "RayCluster" else doc["spec"]["rayClusterSpec"]


def groups(doc: dict) -> Iterator[tuple[str, dict]]:
    """(group name, group spec) for the head ('head') and every worker group."""
    spec = cluster_spec(doc)
    yield "head", spec["headGroupSpec"]
    for group in spec.get("workerGroupSpecs", []):
        yield group["groupName"], group


def pod_templates(doc: dict) -> Iterator[tuple[str, dict]]:
    """(where, template) for every pod template embedded in a RayCluster or RayJob."""
    for name, group in groups(doc):
        yield f"{name}.template", group["template"]
    if doc["kind"] == "RayJob" and "submitterPodTemplate" in doc["spec"]:
        yield "submitterPodTemplate", doc["spec"]["submitterPodTemplate"]


def ray_container(group: dict) -> dict:
    """KubeRay runs Ray in the pod's first container."""
    return group["template"]["spec"]["containers"][0]


def derive_autoscaling_config(doc: dict) -> dict:
    """What Ray's KubeRay autoscaler makes of the cluster spec (it also runs Ray's validate_config)."""
    from ray.autoscaler._private.kuberay.autoscaling_config import _derive_autoscaling_config_from_ray_cr

    cr = {
        "metadata": {"name": doc["metadata"]["name"], "namespace": doc["metadata"]["namespace"]},
        "spec": copy.deepcopy(cluster_spec(doc)),
    }
    return _derive_autoscaling_config_from_ray_cr(cr)


def ray_start_flags(params: dict[str, str], head: bool) -> list[str]:
    """rayStartParams as KubeRay passes them to `ray start` (``--key=value``)."""
    return (["--head"] if head else ["--address=127.0.0.1:6379"]) + [f"--{k}={v}" for k, v in params.items()]


def parse_ray_start(argv: list[str]) -> dict[str, Any]:
    """Parse `ray start` flags with Ray's own click command (raises click.UsageError on a bad flag)."""
    from ray.scripts.scripts import start

    return start.make_context("start", list(argv)).params


def shell_commands(line: str) -> list[list[str]]:
    """Split a shell line at ';' into argv lists (enough for the cluster launcher's start commands)."""
    return [shlex.split(part) for part in line.split(";") if part.strip()]


def container_env(container: dict, namespace: str, secrets: dict[tuple[str, str], dict]) -> dict[str, str]:
    """A container's environment as the kubelet builds it: envFrom Secrets first, then env
    (literal values and secretKeyRef), from the example Secrets in ``secrets``."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        ref = source["secretRef"]["name"]
        env.update(secrets[(namespace, ref)])
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = secrets[(namespace, ref["name"])][ref["key"]]
    return env


def example_secrets() -> dict[tuple[str, str], dict]:
    """The example Secrets under infra/ (placeholders), keyed by (namespace, name)."""
    out = {}
    for _path, doc in all_manifests():
        if doc["kind"] == "Secret":
            out[(doc["metadata"]["namespace"], doc["metadata"]["name"])] = dict(doc.get("stringData", {}))
    return out
