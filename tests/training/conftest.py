"""Fixtures for the pretraining tests: small WebDataset shards written here (fast unit
tests) and real curated demo shards (session-scoped, for the Ray Train runs)."""

from __future__ import annotations

import io
import json
import struct
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from infra.config import load_config
from training.config import PretrainConfig

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "configs" / "pretrain_tiny.yaml"
REFERENCE = REPO.parent / "shared" / "reference"  # the official key layouts and parity vectors


def reference_file(name: str) -> Path:
    path = REFERENCE / name
    if not path.is_file():
        pytest.fail(f"the reference file is missing: {path} (see shared/reference/README.md)")
    return path


def released_tiny_backbone(path: Path, *, prefix: str = "") -> Path:
    """A released-layout Sapiens2 backbone file of ``sapiens2_tiny``: the official module's
    weights of the parity vectors (group ``plain``), official keys (with ``prefix``), as a
    released pretrain file holds them."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(reference_file("sapiens2_parity_tiny.safetensors"))
    state = {prefix + k.removeprefix("plain/model/"): v for k, v in tensors.items() if k.startswith("plain/model/")}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(state, path)
    return path


def shaped_zeros_file(path: Path, size: str) -> Path:
    """A valid safetensors file with every key and shape of the official ``size`` (e.g.
    ``sapiens2_0.4b``, from sapiens2_reference.json) and zero float32 data, written sparse:
    a 1.6 GB file that costs no disk and whose header says what a real one says."""
    shapes = json.loads(reference_file("sapiens2_reference.json").read_text())[size]["state_dict"]
    header, offset = {}, 0
    for key in sorted(shapes):
        nbytes = 4 * int(np.prod(shapes[key], dtype=np.int64))
        header[key] = {"dtype": "F32", "shape": shapes[key], "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(8 + len(text) + offset)
    return path


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Training tests run torch single-threaded: on a small shared machine two OpenMP
    threads per process spin against other processes and make each step ~50x slower.
    Restored afterwards, so other tests in the session keep their setting."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def write_shards(folder: Path, counts: list[int], *, size=(120, 90), seed: int = 0) -> list[str]:
    """WebDataset tars in the curated layout (``<key>.jpg`` + ``<key>.json``, sorted keys);
    every image is a distinct random picture. Returns the shard paths."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for s, count in enumerate(counts):
        path = folder / f"{s:06d}-synthetic.tar"
        with tarfile.open(path, "w") as tar:
            for i in range(count):
                key = f"s{s}_img{i:03d}"
                w, h = size
                pixels = (rng.random((h // 8, w // 8, 3)) * 255).astype(np.uint8)
                buf = io.BytesIO()
                Image.fromarray(pixels).resize((w, h), Image.Resampling.BILINEAR).save(buf, format="JPEG", quality=90)
                meta = {"key": key, "width": w, "height": h, "person_boxes": [[0, 0, w / 2, h]], "person_scores": [0.9]}
                for ext, data in (("jpg", buf.getvalue()), ("json", json.dumps(meta).encode())):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        paths.append(str(path))
    return paths


@pytest.fixture(scope="session")
def synthetic_shards(tmp_path_factory) -> list[str]:
    """3 shards of 5, 7 and 4 samples."""
    return write_shards(tmp_path_factory.mktemp("shards"), [5, 7, 4])


def tiny_config(*overrides: str) -> PretrainConfig:
    return load_config(PretrainConfig, TINY, list(overrides))


@pytest.fixture(scope="session")
def curated_demo(demo_curated):
    """The session's curated demo (tests/conftest.py): a dataset version registered in
    ``<root>/mlflow.db``. Returns (root, CurationResult)."""
    root, _, _, result = demo_curated
    return root, result


# The uninterrupted Sapiens2 tiny run that the end-to-end checks read and the crash-and-resume
# test compares against (tests/training/test_pretrain_crash_resume.py runs the same settings
# through pipelines/pretrain.py): checkpoints at 4, 8 and 12, so a kill after step 5 has one behind it.
REFERENCE_STEPS, REFERENCE_EVERY = 12, 4


def reference_settings(dataset_id: str, store: Path, storage: Path) -> list[str]:
    return [
        f"data.dataset={dataset_id}",
        f"tracking.uri=sqlite:///{store / 'mlflow.db'}",
        f"storage_path={storage}",
        f"steps={REFERENCE_STEPS}",
        f"checkpoint.every={REFERENCE_EVERY}",
        "record_batch_keys=true",
        f"metrics.images_every={REFERENCE_EVERY}",
        "metrics.log_every=3",
        "ray.num_workers=2",
    ]


@pytest.fixture(scope="session")
def pretrain_reference(curated_demo, tmp_path_factory) -> dict:
    """``run_name=reference`` trained in this process (Ray Train, 2 FSDP2 workers) on the curated demo."""
    from training.run import run_pretraining

    root, curated = curated_demo
    storage = tmp_path_factory.mktemp("pretrain-runs")
    common = reference_settings(curated.dataset_id, root, storage)
    run = run_pretraining(tiny_config(*common, "run_name=reference"))
    return {"run": run, "storage": storage, "root": root, "curated": curated, "common": common}


# The uninterrupted distillation run that the distillation end-to-end checks read and its
# crash-and-resume test compares against (tests/training/test_distill_crash_resume.py runs the
# same settings through pipelines/distill.py): sapiens2_tiny (the reference parity weights in the
# released layout) into sapiens2_nano, checkpoints at 2, 4 and 6, so a kill after step 3 has one
# behind it and three steps ahead.
DISTILL_TINY = REPO / "configs" / "distill_tiny.yaml"
DISTILL_STEPS, DISTILL_EVERY = 6, 2


def distill_settings(dataset_id: str, store: Path, storage: Path) -> list[str]:
    return [
        f"data.dataset={dataset_id}",
        f"tracking.uri=sqlite:///{store / 'mlflow.db'}",
        f"storage_path={storage}",
        f"steps={DISTILL_STEPS}",
        f"checkpoint.every={DISTILL_EVERY}",
        "record_batch_keys=true",
        "metrics.log_every=2",
        "ray.num_workers=2",
    ]


@pytest.fixture(scope="session")
def distill_reference(curated_demo, tmp_path_factory) -> dict:
    """The DAG's ``distill`` stage alone (``stages=[distill]``) on the curated demo, in this
    process: ``inputs.checkpoint`` is the teacher the chain hands on, as pretraining's export
    would be. Returns the DAG result, its distill outcome, the teacher file and the settings."""
    from infra.config import load_config
    from pipelines.chain import DagConfig, run_dag
    from training.distill_config import DistillConfig

    root, curated = curated_demo
    folder = tmp_path_factory.mktemp("distill-runs")
    teacher = released_tiny_backbone(folder / "teacher" / "sapiens2_tiny.safetensors")
    common = distill_settings(curated.dataset_id, root, folder / "runs")
    dag = load_config(
        DagConfig,
        None,
        [
            f"workspace={folder / 'ws'}",
            "stages=[distill]",
            f"inputs.dataset={curated.dataset_id}",
            f"inputs.checkpoint={teacher}",
            f"tracking.uri=sqlite:///{root / 'mlflow.db'}",
            "tracking.experiment=distill-tests",
        ],
    )
    dag.distill = load_config(DistillConfig, DISTILL_TINY, common)
    result = run_dag(dag)
    return {
        "dag": result,
        "outcome": result.outcomes[0],
        "teacher": teacher,
        "common": [*common, f"teacher.checkpoint={teacher}"],
        "root": root,
        "curated": curated,
        "folder": folder,
    }
