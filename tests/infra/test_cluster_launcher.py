"""The Ray cluster-launcher config for cloud VMs (infra/cluster/aws.yaml), validated with Ray
2.60's own validator (``ray.autoscaler._private.util.validate_config``: the JSON schema
``ray/autoscaler/ray-schema.json`` shipped in the ray wheel, plus its cross-field checks), and
its start commands parsed by Ray's own `ray start` command."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest
import ray
import yaml
from ray.autoscaler._private.util import validate_config

from tests.infra.validation import INFRA, parse_ray_start, pyproject, shell_commands

CONFIG_PATH = INFRA / "cluster" / "aws.yaml"
PROJECT_VERSION = pyproject()["project"]["version"]


@pytest.fixture
def config() -> dict:
    return yaml.safe_load(CONFIG_PATH.read_text())


def test_validator_is_rays_and_uses_the_shipped_schema():
    schema_path = Path(ray.__file__).parent / "autoscaler" / "ray-schema.json"
    schema = json.loads(schema_path.read_text())
    assert ray.__version__ == "2.60.0"
    assert schema["additionalProperties"] is False  # unknown top-level keys fail


def test_config_passes_rays_validation(config):
    validate_config(config)


@pytest.mark.parametrize(
    "mutate, error",
    [
        (lambda c: c.__setitem__("max_worker", c.pop("max_workers")), jsonschema.ValidationError),  # typo
        (lambda c: c["available_node_types"]["gpu-train"].__setitem__("min_workers", "0"), jsonschema.ValidationError),
        (
            lambda c: c["available_node_types"]["gpu-train"]["resources"].__setitem__("GPU", 0.5),
            jsonschema.ValidationError,
        ),
        (lambda c: c["available_node_types"]["cpu-curation"].pop("node_config"), jsonschema.ValidationError),
        (lambda c: c["docker"].__setitem__("gpus", "all"), jsonschema.ValidationError),
        (lambda c: c.__setitem__("head_node_type", "ray.head.default"), ValueError),  # not a declared node type
        (
            lambda c: c["available_node_types"]["cpu-curation"].__setitem__("min_workers", 90),
            ValueError,
        ),  # > max_workers
        (lambda c: c.pop("cluster_synced_files"), RuntimeError),
    ],
)
def test_rays_validation_rejects_a_broken_config(config, mutate, error):
    config = copy.deepcopy(config)
    mutate(config)
    with pytest.raises(error):
        validate_config(config)


def test_node_types(config):
    types = config["available_node_types"]
    assert set(types) == {"head", "cpu-curation", "gpu-train"}
    assert types[config["head_node_type"]]["resources"] == {"CPU": 0}
    assert "GPU" not in types["cpu-curation"]["resources"] and types["cpu-curation"]["resources"]["CPU"] > 0
    assert types["gpu-train"]["resources"]["GPU"] == 8
    assert "--gpus all" in types["gpu-train"]["docker"]["worker_run_options"]
    for name, node in types.items():
        if name != config["head_node_type"]:
            assert 0 == node["min_workers"] < node["max_workers"], name
    assert config["max_workers"] == sum(n.get("max_workers", 0) for n in types.values())


def test_runs_the_platform_image_with_nothing_installed_at_start(config):
    assert config["docker"]["image"] == f"registry.example.com/humanvision:{PROJECT_VERSION}"
    assert config["docker"]["pull_before_run"] is True
    for key in ("initialization_commands", "setup_commands", "head_setup_commands", "worker_setup_commands"):
        assert config[key] == [], key
    options = " ".join(config["docker"]["run_options"])
    assert "MLFLOW_TRACKING_URI=http" in options and "RAY_AUTH_MODE=token" in options
    assert config["file_mounts"] == {"~/.ray/auth_token": "~/.ray/auth_token"}


def test_start_commands_are_valid_ray_start_command_lines(config):
    head = [argv for line in config["head_start_ray_commands"] for argv in shell_commands(line)]
    worker = [argv for line in config["worker_start_ray_commands"] for argv in shell_commands(line)]
    for argvs, is_head in ((head, True), (worker, False)):
        starts = [a for a in argvs if a[:2] == ["ray", "start"]]
        assert len(starts) == 1
        params = parse_ray_start(starts[0][2:])
        assert params["head"] is is_head
        assert params["disable_usage_stats"] is True
    head_params = parse_ray_start(next(a for a in head if a[:2] == ["ray", "start"])[2:])
    assert head_params["num_cpus"] == 0 and head_params["autoscaling_config"] == "~/ray_bootstrap_config.yaml"
