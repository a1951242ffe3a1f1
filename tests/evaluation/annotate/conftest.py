"""Fixtures of the annotation tests: tiny task checkpoints (random weights in the released layout),
handmade curated-layout versions, and one annotation of the session's curated demo version.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from evaluation.annotate.config import AnnotateConfig
from infra.config import from_dict
from tests.conftest import IMAGES

TINY = {
    "pose": "sapiens2_tiny_pose",
    "seg": "sapiens2_tiny_seg",
    "normal": "sapiens2_tiny_normal",
    "pointmap": "sapiens2_tiny_pointmap",
    "albedo": "sapiens2_tiny_albedo",
    "depth": "sapiens_tiny_depth",
}
DEMO_TASKS = ("pose", "seg", "normal", "pointmap")


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    """task -> a tiny released-layout checkpoint with random weights (seed 0)."""
    from models.random_checkpoints import save_random_task_checkpoint

    folder = tmp_path_factory.mktemp("task-models")
    return {t: save_random_task_checkpoint(name, folder / f"{name}.safetensors") for t, name in TINY.items()}


def annotate_config(dataset: str, out: Path, models: dict[str, Path], tasks=DEMO_TASKS, **settings) -> AnnotateConfig:
    """Every task of ``tasks`` on its tiny model; pose on boxes scoring >= 0.3 (the demo
    detector's threshold), at most 3 people; MLflow in ``out``'s folder; ``settings``: dotted
    overrides as ``load_config`` takes them (``{"actors.num_actors": 1}``)."""
    data = {
        "output_dir": str(out),
        "data": {"dataset": str(dataset)},
        "tasks": {t: {"checkpoint": str(models[t])} for t in tasks},
        "actors": {"num_actors": 2, "num_cpus": 1, "batch_size": 4},
        "gallery": {"samples": 6},
        "tracking": {"uri": f"sqlite:///{out.parent / 'mlflow.db'}", "experiment": "test-annotate"},
    }
    if "pose" in tasks:
        data["tasks"]["pose"].update(min_box_score=0.3, max_people=3)
    for dotted, value in settings.items():
        node = data
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return from_dict(AnnotateConfig, data)


def photo(name: str, scale: float = 0.5) -> tuple[bytes, int, int]:
    """A shared real photo, rescaled, as JPEG bytes and its size."""
    im = Image.open(IMAGES / name).convert("RGB")
    im = im.resize((int(im.width * scale), int(im.height * scale)))
    out = io.BytesIO()
    im.save(out, "JPEG", quality=90)
    return out.getvalue(), im.width, im.height


def write_version(folder: Path, shards: list[list[dict]], *, in_tar=None) -> str:
    """A finished curated-layout output (``curation.output``): each shard's samples (``key``,
    ``image`` bytes, ``width``, ``height``, ``person_boxes``, ``person_scores``) in its tar and
    sidecar; ``in_tar(key)`` False leaves a sample out of its tar (a missing sample)."""
    import pyarrow as pa

    from curation.output import SUCCESS_FILE, shard_path, sidecar_path
    from curation.writer import write_tar
    from infra import storage

    fs = storage.resolve(str(folder))[0]
    for i, samples in enumerate(shards):
        pid = f"{i:06d}"
        rows = [{**s, "image_ext": "jpg"} for s in samples]
        write_tar(fs, shard_path(str(folder), pid), [r for r in rows if in_tar is None or in_tar(r["key"])])
        side = pa.Table.from_pylist([{k: v for k, v in r.items() if k not in ("image", "image_ext")} for r in rows])
        storage.write_parquet(fs, sidecar_path(str(folder), pid), side)
    kept = sum(len(s) for s in shards)
    (folder / SUCCESS_FILE).write_text(
        json.dumps({"dataset_id": f"handmade-{kept}", "dataset_name": folder.name, "kept": kept})
    )
    return str(folder)


def sample(key: str, name: str, boxes: list, scores: list, scale: float = 0.5) -> dict:
    data, w, h = photo(name, scale)
    b = [[x1 * w, y1 * h, x2 * w, y2 * h] for x1, y1, x2, y2 in boxes]  # boxes given in image fractions
    return {"key": key, "image": data, "width": w, "height": h, "person_boxes": b, "person_scores": scores}


@pytest.fixture(scope="session")
def annotated(demo_curated, tiny_models, tmp_path_factory, ray_local):
    """The session's curated demo version annotated once (pose, seg, normal, pointmap), in this
    process: ``(cfg, result, curated)``."""
    from evaluation.annotate import run_annotation

    _, _, curate_cfg, _ = demo_curated
    out = tmp_path_factory.mktemp("annotated") / "out"
    cfg = annotate_config(curate_cfg.output_dir, out, tiny_models)
    return cfg, run_annotation(cfg), Path(curate_cfg.output_dir)


def npy(data: bytes) -> np.ndarray:
    return np.load(io.BytesIO(data), allow_pickle=False)
