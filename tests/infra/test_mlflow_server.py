"""The MLflow tracking-server deployment (infra/mlflow): its command line as MLflow 3.17's own
CLI parses it, its Host allow-list as MLflow's own middleware checks it, and its wiring to
PostgreSQL, the object store and the Ray pods. (Schema validation of these manifests is in
test_k8s_manifests.py.)"""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit

import mlflow
import pytest
from mlflow.server.security_utils import get_default_allowed_hosts, is_allowed_host_header, is_health_endpoint

from tests.infra.validation import INFRA, container_env, example_secrets, load_documents, pyproject

MLFLOW = {d["kind"]: d for d in load_documents(INFRA / "mlflow" / "mlflow.yaml")}
POSTGRES = {d["kind"]: d for d in load_documents(INFRA / "mlflow" / "postgres.yaml")}
CONTAINER = MLFLOW["Deployment"]["spec"]["template"]["spec"]["containers"][0]
TRACKING_URI = "http://mlflow.mlflow.svc:5000"


def _service_url(service: dict, port_name: str) -> tuple[str, int]:
    port = next(p for p in service["spec"]["ports"] if p["name"] == port_name)
    return f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc", port["port"]


@pytest.fixture
def server_params(monkeypatch):
    """`mlflow server` parameters as MLflow's click command resolves them from the
    Deployment's args and environment (Secrets taken from the example Secrets)."""
    from mlflow.cli import server

    env = container_env(CONTAINER, "mlflow", example_secrets())
    for key in list(os.environ):
        if key.startswith("MLFLOW_"):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert CONTAINER["args"][0] == "server"
    return server.make_context("server", list(CONTAINER["args"][1:])).params, env


def test_server_command_line(server_params):
    params, env = server_params
    assert params["backend_store_uri"].startswith("postgresql://")
    assert params["artifacts_destination"].startswith("s3://")
    assert params["serve_artifacts"] is True and params["artifacts_only"] is False
    assert params["host"] == "0.0.0.0"  # the pod network; the Service is ClusterIP
    assert int(params["workers"]) >= 1
    assert params["disable_security_middleware"] is False
    # The backend URI comes from a Secret through the environment, never the command line.
    assert not any("postgresql://" in arg for arg in CONTAINER["args"])
    assert env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"
    assert env["MLFLOW_DISABLE_TELEMETRY"] == "true"
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(env)


def test_mlflow_cli_rejects_a_misspelled_flag():
    from click.exceptions import NoSuchOption
    from mlflow.cli import server

    with pytest.raises(NoSuchOption):
        server.make_context("server", ["--artifact-destination=s3://b/x"])


def test_ray_pods_reach_the_server_through_its_service_and_host_check(server_params):
    params, _env = server_params
    host, port = _service_url(MLFLOW["Service"], "http")
    assert f"http://{host}:{port}" == TRACKING_URI
    target = MLFLOW["Service"]["spec"]["ports"][0]["targetPort"]
    assert any(p["name"] == target and p["containerPort"] == params["port"] for p in CONTAINER["ports"])
    allowed = [h.strip() for h in params["allowed_hosts"].split(",")]
    netloc = urlsplit(TRACKING_URI).netloc
    assert is_allowed_host_header(allowed, netloc)
    assert is_allowed_host_header(allowed, "localhost:5000")  # kubectl port-forward
    # Without the flag MLflow would refuse the in-cluster name (the reason the flag is there)...
    assert not is_allowed_host_header(get_default_allowed_hosts(), netloc)
    # ...and an unrelated host stays refused.
    assert not is_allowed_host_header(allowed, "evil.example.com")


def test_probes_hit_the_health_endpoint():
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = CONTAINER[probe]["httpGet"]
        assert get["path"] == "/health" and get["port"] == "http", probe
    assert is_health_endpoint("/health")  # exempt from the Host check, so kubelet probes pass
    assert {"cpu", "memory"} <= set(CONTAINER["resources"]["requests"])


def test_backend_uri_points_at_the_postgres_service():
    secrets = example_secrets()
    backend = secrets[("mlflow", "mlflow-backend")]
    uri = urlsplit(backend["MLFLOW_BACKEND_STORE_URI"])
    host, port = _service_url(POSTGRES["Service"], "postgres")
    assert (uri.scheme, uri.hostname, uri.port) == ("postgresql", host, port)
    assert (uri.username, uri.password, uri.path) == (
        backend["POSTGRES_USER"],
        backend["POSTGRES_PASSWORD"],
        "/" + backend["POSTGRES_DB"],
    )
    assert POSTGRES["Service"]["spec"]["clusterIP"] == "None"
    assert POSTGRES["StatefulSet"]["spec"]["serviceName"] == POSTGRES["Service"]["metadata"]["name"]
    pg = POSTGRES["StatefulSet"]["spec"]["template"]["spec"]["containers"][0]
    env = container_env(pg, "mlflow", secrets)
    assert env["PGDATA"].startswith(pg["volumeMounts"][0]["mountPath"] + "/")
    assert re.fullmatch(r"postgres:\d+\.\d+-\w+", pg["image"])


def test_server_image_runs_the_client_mlflow_version():
    pins = pyproject()["project"]["dependencies"]
    client = next(p for p in pins if p.startswith("mlflow=="))
    requirements = (INFRA / "docker" / "mlflow-requirements.txt").read_text().split()
    assert client in requirements and client == f"mlflow=={mlflow.__version__}"
    assert CONTAINER["image"].endswith(":" + mlflow.__version__)


def test_only_the_server_reaches_postgres_and_only_ray_reaches_the_server():
    policy = POSTGRES["NetworkPolicy"]["spec"]
    assert policy["podSelector"]["matchLabels"] == POSTGRES["StatefulSet"]["spec"]["selector"]["matchLabels"]
    assert policy["ingress"][0]["from"] == [
        {"podSelector": {"matchLabels": MLFLOW["Deployment"]["spec"]["selector"]["matchLabels"]}}
    ]
    sources = {
        f["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
        for f in MLFLOW["NetworkPolicy"]["spec"]["ingress"][0]["from"]
    }
    assert sources == {"humanvision", "mlflow"}
