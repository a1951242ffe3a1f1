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
def curated_demo(tmp_path_factory, ray_local, centernet_path):
    """The demo corpus curated by the real pipeline (CenterNet detector), with the curation
    tests' own settings minus OCR (not needed here, and the slowest stage): a dataset
    version registered in ``<root>/mlflow.db``. Returns (root, CurationResult)."""
    import dataclasses

    from curation.pipeline import run_curation
    from pipelines.demo_corpus import build_demo_corpus

    # The curation tests' settings, with their helper for weightless content filters (wherever
    # curation keeps it).
    from tests.curation import test_pipeline as curation_tests

    root = tmp_path_factory.mktemp("pretrain-demo")
    build_demo_corpus(root / "raw")
    cfg = curation_tests.demo_config(root / "raw", root / "curated", centernet_path)
    cfg = dataclasses.replace(cfg, content=curation_tests.weightless_content_filters(text=False))
    return root, run_curation(cfg)
