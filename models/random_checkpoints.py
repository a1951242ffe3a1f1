"""Released-layout task checkpoints with random weights, for the task models no weights are
released for (the tiny configurations) or that cannot be downloaded here: tests, benchmarks and
the annotation demo load them exactly like released files.

    python -m models.random_checkpoints runs/demo/task_models     # sapiens2_tiny_{pose,seg,normal,pointmap,albedo}
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from models.io import save_state_dict_file
from models.task_models import build_task_model

TINY = tuple(f"sapiens2_tiny_{task}" for task in ("pose", "seg", "normal", "pointmap", "albedo"))


def save_random_task_checkpoint(name: str, path: str | Path, *, seed: int = 0) -> Path:
    """Task model ``name`` freshly initialised from ``seed``, saved in the released layout
    (``backbone.`` + head keys) at ``path`` (``.safetensors`` or ``.pt``)."""
    torch.manual_seed(seed)
    return save_state_dict_file(build_task_model(name).state_dict(), path)


def save_random_task_checkpoints(folder: str | Path, names: tuple[str, ...] = TINY, *, seed: int = 0) -> list[Path]:
    """``<folder>/<name>.safetensors`` for each of ``names`` (files already there are kept)."""
    out = []
    for name in names:
        path = Path(folder) / f"{name}.safetensors"
        out.append(path if path.is_file() else save_random_task_checkpoint(name, path, seed=seed))
    return out


if __name__ == "__main__":
    for p in save_random_task_checkpoints(sys.argv[1] if len(sys.argv) > 1 else "runs/demo/task_models"):
        print(p)
