"""Fixtures for the pretraining tests: small WebDataset shards written here (fast unit
tests) and real curated demo shards (session-scoped, for the Ray Train runs)."""

from __future__ import annotations

import io
import json
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
