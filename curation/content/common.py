"""Pieces the content-filter stages share: start-up checks, devices, decoding, weight files, linear heads.

Nothing here imports torch at module level: stages import their heavy libraries in ``setup()``
so that building the pipeline on the driver stays cheap.

Shapes: N images, D embedding width, K head outputs.
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
from PIL import Image

from curation import schema

EMBEDDING_COLUMN = "clip_embedding"
DEVICES = ("auto", "cpu", "cuda")


class WeightsUnavailableError(FileNotFoundError, ValueError):
    """An enabled content filter whose weights are not configured or not on disk (raised at start-up).

    It is both a ``FileNotFoundError`` and a ``ValueError`` (a configuration error), so callers
    that catch either see it.
    """


def require_file(path: str, setting: str, enabled_setting: str, what: str) -> Path:
    """The weights file at ``path``, or a ``WeightsUnavailableError`` saying which setting to fix."""
    fix = (f"Set {setting}=/path/to/file, or disable the filter with {enabled_setting}=false "
           f"(the run's stats and MLflow then record it as not applied).")
    if not path:
        raise WeightsUnavailableError(f"{setting} is not set: {what} is needed. {fix}")
    p = Path(path).expanduser()
    if not p.is_file():
        raise WeightsUnavailableError(f"{setting}={path!r}: no such file ({what}). {fix}")
    return p


def check_placement(device: str, num_gpus: float, num_cpus: float, batch_size: int,
                    num_actors: int, where: str) -> None:
    """Start-up checks of a model stage's resource settings."""
    if device not in DEVICES:
        raise ValueError(f"{where}.device={device!r}: expected one of {list(DEVICES)}")
    if num_gpus < 0 or num_cpus < 0:
        raise ValueError(f"{where}: num_gpus and num_cpus must be >= 0")
    if batch_size < 1 or num_actors < 1:
        raise ValueError(f"{where}: batch_size and num_actors must be >= 1")
    if device == "cuda" and num_gpus == 0:
        # Ray hides every GPU from an actor that reserved none: it would fail on its first batch.
        raise ValueError(f"{where}.device=cuda needs {where}.num_gpus > 0 (e.g. 0.25 to share one GPU "
                         f"between 4 actors), or set {where}.device=auto/cpu")


def resolve_device(device: str, where: str) -> str:
    """``auto`` -> ``cuda`` when this worker sees a GPU, else ``cpu``; ``cuda`` without one is an error."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"{where}.device=cuda but this worker sees no CUDA device "
                           f"(check {where}.num_gpus and the cluster's GPUs, or set {where}.device=auto)")
    return device


def decode_rgb(data: bytes, min_side: int | None = None, max_side: int | None = None) -> Image.Image:
    """Decode normalised image bytes to RGB, cheaply downscaled.

    ``min_side``: JPEG draft decoding keeps both sides >= this (for models that resize to a fixed
    input anyway). ``max_side``: the longer side is then shrunk to at most this.
    """
    img = Image.open(io.BytesIO(data))
    target = max_side or min_side
    if target and img.format == "JPEG":
        img.draft("RGB", (target, target))  # DCT-domain downscale; never below the requested size
    img = img.convert("RGB")
    if max_side and max(img.size) > max_side:
        img.thumbnail((max_side, max_side), Image.Resampling.BICUBIC)
    return img


def decode_pending(table: pa.Table, mask: list[bool], min_side: int | None = None,
                   max_side: int | None = None) -> tuple[dict[int, Image.Image], dict[int, str]]:
    """Decoded images of the rows in ``mask`` by row index, and per-row decode errors."""
    images: dict[int, Image.Image] = {}
    errors: dict[int, str] = {}
    column = table.column("image")
    for i, pending in enumerate(mask):
        if not pending:
            continue
        data = column[i].as_py()
        try:
            if data is None:
                raise ValueError("row has no image bytes")
            images[i] = decode_rgb(data, min_side=min_side, max_side=max_side)
        except Exception as err:  # one bad row must not fail the batch
            errors[i] = f"{type(err).__name__}: {err}"
    return images, errors


def mark_failed(table: pa.Table, errors: dict[int, str], stage: str) -> pa.Table:
    """Give rows this stage could not decode the ``decode_failed`` reason and an error message."""
    if not errors:
        return table
    reasons = [schema.DECODE_FAILED if i in errors else None for i in range(table.num_rows)]
    table = schema.set_reasons(table, reasons)
    messages = table.column("error_message").to_pylist()
    for i, msg in errors.items():
        messages[i] = messages[i] or f"{stage}: {msg}"
    return schema.with_columns(table, {"error_message": pa.array(messages, type=pa.string())})


def embeddings_of(table: pa.Table, mask: list[bool], stage: str) -> tuple[list[int], np.ndarray]:
    """Rows in ``mask`` that carry a CLIP embedding, and those embeddings as float32 [N, D]."""
    if EMBEDDING_COLUMN not in table.column_names:
        raise ValueError(f"{stage} reads the {EMBEDDING_COLUMN!r} column: run ClipEmbeddingStage before it "
                         "(build_content_stages orders them)")
    values = table.column(EMBEDDING_COLUMN).to_pylist()
    rows = [i for i, pending in enumerate(mask) if pending and values[i] is not None]
    if not rows:
        return [], np.zeros((0, 0), np.float32)
    return rows, np.asarray([values[i] for i in rows], dtype=np.float32)


def load_state_file(path: str | Path) -> dict:
    """A state dict from ``.safetensors`` or a torch file loaded with ``weights_only=True``."""
    import torch

    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(path), device="cpu")
    else:
        state = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not state:
        raise ValueError(f"{path}: expected a state dict (name -> tensor), got {type(state).__name__}")
    if all(k.startswith("module.") for k in state):  # saved from DistributedDataParallel
        state = {k[len("module."):]: v for k, v in state.items()}
    return state


class LinearHead:
    """A trained linear probe on CLIP embeddings giving P(positive class) per image.

    The file holds ``weight`` [K, D] (or [D]) and ``bias`` [K] (a common prefix such as ``fc.`` is
    fine). K = 1: a logistic-regression logit, P = sigmoid. K = 2: logits ordered
    [negative, positive], P = softmax[:, 1].
    """

    def __init__(self, weight_KD: np.ndarray, bias_K: np.ndarray, source: str = "") -> None:
        weight_KD = np.atleast_2d(np.asarray(weight_KD, np.float32))
        bias_K = np.asarray(bias_K, np.float32).reshape(-1)
        if weight_KD.shape[0] not in (1, 2) or bias_K.shape != (weight_KD.shape[0],):
            raise ValueError(f"linear head {source}: expected weight [1|2, D] and bias [1|2], "
                             f"got {tuple(weight_KD.shape)} and {tuple(bias_K.shape)}")
        self.weight_KD, self.bias_K, self.source = weight_KD, bias_K, source

    @property
    def dim(self) -> int:
        return self.weight_KD.shape[1]

    @classmethod
    def load(cls, path: str | Path) -> LinearHead:
        state = load_state_file(path)
        weights = [k for k in state if k == "weight" or k.endswith(".weight")]
        biases = [k for k in state if k == "bias" or k.endswith(".bias")]
        if len(weights) != 1 or len(biases) != 1 or len(state) != 2:
            raise ValueError(f"{path}: a linear head file holds exactly one weight and one bias tensor, "
                             f"found keys {sorted(state)}")
        return cls(state[weights[0]].float().numpy(), state[biases[0]].float().numpy(), str(path))

    def predict(self, emb_ND: np.ndarray) -> np.ndarray:
        if emb_ND.shape[1] != self.dim:
            raise ValueError(f"linear head {self.source} expects {self.dim}-d embeddings, the CLIP model "
                             f"gives {emb_ND.shape[1]}-d: it was trained on another CLIP model")
        logits_NK = emb_ND @ self.weight_KD.T + self.bias_K
        if logits_NK.shape[1] == 1:
            return (1.0 / (1.0 + np.exp(-logits_NK[:, 0]))).astype(np.float32)
        z = logits_NK - logits_NK.max(axis=1, keepdims=True)
        p = np.exp(z)
        return (p[:, 1] / p.sum(axis=1)).astype(np.float32)


def scatter(n: int, rows: list[int], values) -> list:
    """A column of ``n`` values: ``values`` at ``rows``, null elsewhere."""
    out: list = [None] * n
    for i, v in zip(rows, values, strict=True):
        out[i] = v
    return out
