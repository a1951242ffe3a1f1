"""The container images (infra/docker), checked statically: no Docker engine is available here,
so the images are not built. Each Dockerfile is parsed with dockerfile-parse and checked for
what the cluster depends on: a pinned CUDA base matching torch's CUDA build, Python 3.11, the
project installed with pip from pyproject.toml under pins that agree with the project's and
with the Ray the tests run, a non-root user, /app and /models, offline settings, and build
context files that exist and are not excluded by the image's .dockerignore."""

from __future__ import annotations

import fnmatch
import importlib.metadata
import importlib.util
import re
import shlex
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser
from packaging.requirements import Requirement

from tests.infra.validation import INFRA, REPO, pyproject

DOCKER = INFRA / "docker"
PLATFORM = DOCKER / "Dockerfile"
MLFLOW_IMAGE = DOCKER / "mlflow.Dockerfile"
PROJECT = pyproject()["project"]
PROJECT_REQS = {Requirement(r).name: Requirement(r) for r in PROJECT["dependencies"]}
# Versions installed in this venv, read from metadata (importing torch would cost seconds).
INSTALLED = {name: importlib.metadata.version(name) for name in ("torch", "ray", "mlflow")}


def torch_cuda_version() -> str | None:
    """torch.version.cuda of the installed torch, read from torch/version.py without importing torch."""
    folder = Path(importlib.util.find_spec("torch").submodule_search_locations[0])
    match = re.search(r"^cuda: .*= '([\d.]+)'", (folder / "version.py").read_text(), re.M)
    return match[1] if match else None


def parse(path: Path) -> DockerfileParser:
    return DockerfileParser(path=str(path))


def instructions(df: DockerfileParser, name: str, stage: int | None = None) -> list[str]:
    """Values of every ``name`` instruction (of the given 0-based stage, else of all)."""
    out, current = [], -1
    for item in df.structure:
        if item["instruction"] == "FROM":
            current += 1
        if item["instruction"] == name and (stage is None or stage == current):
            out.append(item["value"])
    return out


def pins(path: Path) -> dict[str, Requirement]:
    lines = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
    return {Requirement(line).name: Requirement(line) for line in lines if line}


def dockerignore_excludes(ignore_file: Path, rel_path: str) -> bool:
    """Whether a context path is excluded: the last matching pattern wins, '!' re-includes,
    a pattern matching a folder excludes everything under it (Docker's rules, minus the
    corner cases we do not use)."""
    excluded = False
    for raw in ignore_file.read_text().splitlines():
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        parts = rel_path.split("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        if any(fnmatch.fnmatchcase(p, pattern) or fnmatch.fnmatchcase(p, pattern.replace("**/", "")) for p in prefixes):
            excluded = not negate
    return excluded


def copy_sources(df: DockerfileParser) -> list[str]:
    """Context paths of every COPY that reads the build context (not another stage)."""
    sources = []
    for value in instructions(df, "COPY"):
        args = [a for a in shlex.split(value) if not a.startswith("--")]
        if "--from=" in value:
            continue
        sources.extend(args[:-1])
    return sources


def problems(dockerfile: Path, context: Path = REPO) -> list[str]:
    """The checks every image here must pass: tagged (not latest) bases, a non-root final user,
    COPY sources that exist in the context and are not excluded by <Dockerfile>.dockerignore."""
    df = parse(dockerfile)
    found = []
    for image in df.parent_images:
        name, _, tag = image.rpartition(":")
        if not name or not tag or tag == "latest" or "/" in tag:
            found.append(f"base image not pinned: {image}")
    users = instructions(df, "USER", stage=len(df.parent_images) - 1)
    if not users or users[-1] in ("root", "0"):
        found.append("final stage runs as root")
    ignore = dockerfile.with_name(dockerfile.name + ".dockerignore")
    for source in copy_sources(df):
        if source == ".":
            continue
        if not (context / source).exists():
            found.append(f"COPY source missing: {source}")
        elif ignore.is_file() and dockerignore_excludes(ignore, source):
            found.append(f"COPY source excluded by {ignore.name}: {source}")
    return found


@pytest.mark.parametrize("path", [DOCKER / "Dockerfile", DOCKER / "mlflow.Dockerfile"], ids=lambda p: p.name)
def test_image_passes_the_common_checks(path):
    assert problems(path) == []


def test_common_checks_catch_a_broken_dockerfile(tmp_path):
    (tmp_path / "present.txt").write_text("x")
    (tmp_path / "ignored.txt").write_text("x")
    broken = tmp_path / "Dockerfile"
    broken.write_text(
        "FROM nvidia/cuda AS a\nFROM python:latest\nCOPY present.txt missing.txt ignored.txt /app/\nUSER root\n"
    )
    (tmp_path / "Dockerfile.dockerignore").write_text("ignored.txt\n")
    assert problems(broken, context=tmp_path) == [
        "base image not pinned: nvidia/cuda",
        "base image not pinned: python:latest",
        "final stage runs as root",
        "COPY source missing: missing.txt",
        "COPY source excluded by Dockerfile.dockerignore: ignored.txt",
    ]


# --- the platform image --------------------------------------------------------------------


def test_base_is_a_pinned_cuda_runtime_matching_torchs_cuda_build():
    df = parse(PLATFORM)
    assert df.is_multistage
    bases = set(df.parent_images)
    assert len(bases) == 1, bases  # builder and runtime share the base (same /usr/bin/python3.11)
    base = bases.pop()
    match = re.fullmatch(r"nvidia/cuda:(\d+)\.(\d+)\.(\d+)-cudnn-runtime-ubuntu22\.04", base)
    assert match, base
    # The image installs the same torch wheel as this venv (PyPI's torch 2.14.1): same CUDA major.minor.
    assert INSTALLED["torch"].startswith("2.14.1")
    assert f"{match[1]}.{match[2]}" == torch_cuda_version()


def test_python_311_and_the_project_installed_with_pip_from_pyproject():
    df = parse(PLATFORM)
    runs = " ".join(instructions(df, "RUN"))
    assert "python3.11 -m venv /opt/venv" in runs
    assert re.search(r"apt-get install [^&]*\bpython3\.11\b", runs)
    assert "COPY pyproject.toml /app/pyproject.toml" in ["COPY " + v for v in instructions(df, "COPY")]
    installs = [r for r in instructions(df, "RUN", stage=0) if "pip install" in r]
    assert any("-c /tmp/pins/constraints.txt /app" in r for r in installs)
    assert any("--no-deps -c /tmp/pins/constraints.txt /app" in r for r in installs)
    assert "[dev]" not in runs and "-e " not in runs  # production image: no dev extras, not editable


def test_pins_agree_with_the_project_and_with_the_ray_we_test():
    constraints = pins(DOCKER / "constraints.txt")
    for name in ("torch", "torchvision", "ray", "mlflow", "pyarrow"):
        pinned = next(iter(constraints[name].specifier)).version
        assert PROJECT_REQS[name].specifier.contains(pinned), (name, pinned, PROJECT_REQS[name])
    assert str(constraints["ray"].specifier) == "==" + INSTALLED["ray"] == str(PROJECT_REQS["ray"].specifier)
    assert str(constraints["mlflow"].specifier) == "==" + INSTALLED["mlflow"]
    assert str(constraints["torch"].specifier) == "==2.14.1" == "==" + INSTALLED["torch"].split("+")[0]
    assert "boto3" in pins(DOCKER / "requirements-cluster.txt")  # the launcher's AWS autoscaler


def test_runtime_stage_is_non_root_in_app_with_models_and_offline_settings():
    df = parse(PLATFORM)
    users = instructions(df, "USER", stage=1)
    assert users and users[-1] not in ("root", "0")
    assert instructions(df, "WORKDIR", stage=1)[-1] == "/app"
    runs = " ".join(instructions(df, "RUN", stage=1))
    assert "mkdir -p /models" in runs and "chown hv:hv /models" in runs
    assert "export PATH=/opt/venv/bin:$PATH' > /etc/profile.d/" in runs  # login shells (KubeRay: bash -lc)
    assert re.search(r"useradd --uid \"\$\{APP_UID\}\"", runs) and df.args["APP_UID"] != "0"
    env = df.envs  # of the last stage
    for key, value in {
        "HF_HUB_OFFLINE": "1",
        "YOLO_OFFLINE": "1",
        "YOLO_AUTOINSTALL": "0",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "RAY_USAGE_STATS_ENABLED": "0",
        "HV_MODELS_DIR": "/models",
        "VIRTUAL_ENV": "/opt/venv",
    }.items():
        assert env[key] == value, key
    # What KubeRay's probes (wget) and the cluster launcher (ssh, rsync) run inside the container.
    for package in ("wget", "openssh-client", "rsync", "libgl1"):
        assert re.search(rf"\b{re.escape(package)}\b", runs), package
    assert "build-essential" not in runs  # compilers stay in the builder stage


def test_build_context_files_exist_and_are_not_ignored():
    for dockerfile in (PLATFORM, MLFLOW_IMAGE):
        ignore = dockerfile.with_name(dockerfile.name + ".dockerignore")
        assert ignore.is_file(), ignore
        for source in copy_sources(parse(dockerfile)):
            if source == ".":
                continue
            assert (REPO / source).exists(), source
            assert not dockerignore_excludes(ignore, source), (dockerfile.name, source)
    ignore = PLATFORM.with_name("Dockerfile.dockerignore")
    for path in ("runs/demo/x.jpg", ".venv/bin/python", ".git/HEAD", "curation/__pycache__/a.pyc"):
        assert dockerignore_excludes(ignore, path), path
    for path in ("pipelines/curate.py", "configs/curate_humans1b.yaml", "curation/config.py", "infra/config.py"):
        assert not dockerignore_excludes(ignore, path), path


def test_dockerignore_check_sees_an_excluded_source(tmp_path):
    ignore = tmp_path / "x.dockerignore"
    ignore.write_text("infra\n")
    assert dockerignore_excludes(ignore, "infra/docker/constraints.txt")
    ignore.write_text("*\n!infra/docker/mlflow-requirements.txt\n")
    assert not dockerignore_excludes(ignore, "infra/docker/mlflow-requirements.txt")
    assert dockerignore_excludes(ignore, "pyproject.toml")


# --- the MLflow server image -------------------------------------------------------------------


def test_mlflow_image_is_small_pinned_and_non_root():
    df = parse(MLFLOW_IMAGE)
    (base,) = set(df.parent_images)
    assert re.fullmatch(r"python:3\.11\.\d+-slim-\w+", base), base
    assert instructions(df, "USER")[-1] not in ("root", "0")
    assert any("pip install -r /tmp/mlflow-requirements.txt" in r for r in instructions(df, "RUN"))
    assert df.envs["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"
    requirements = pins(DOCKER / "mlflow-requirements.txt")
    assert {"mlflow", "psycopg2-binary", "boto3"} == set(requirements)
    assert all(str(r.specifier).startswith("==") for r in requirements.values())


@pytest.mark.parametrize("path", [PLATFORM, MLFLOW_IMAGE], ids=lambda p: p.name)
def test_dockerfile_parses_with_a_syntax_directive(path):
    first = path.read_text().splitlines()[0]
    assert first.startswith("# syntax=docker/dockerfile:1")
    assert [i["instruction"] for i in parse(path).structure if i["instruction"] != "COMMENT"][0] == "ARG"
