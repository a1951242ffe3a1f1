"""The base of every model step (person detector, CLIP, artistic, watermark, text) and its helpers.

``ModelStep`` owns what the model steps share: placement (one ``Placement`` settings base:
device, num_gpus, num_cpus, batch_size, num_actors) and the resources it asks Ray for, device
choice, the start-up check of the settings and of the weight files (a missing file is a
one-line ``WeightsUnavailableError`` naming the setting, before any Ray work), where the
threshold it drops rows by comes from (``curation.filters.thresholds``: a warning at start-up
when it says nowhere), decoding the pending rows for the model, batching, writing typed score
columns, and marking rows it could not decode. A concrete step implements only ``load`` (once per actor), ``score`` (a chunk of
rows -> one dict of column values per row) and ``reason`` (scores -> drop reason or None).

Nothing here imports torch at module level: steps import their heavy libraries in ``load()``
so that building the pipeline on the driver stays cheap.

Shapes: N images, D embedding width, K head outputs.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import io
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from PIL import Image

from curation import schema
from curation.filters.thresholds import NOT_MEASURED, Published, calibrate_hint, threshold_source, warn_unmeasured
from curation.steps import Resources, RowStep

EMBEDDING_COLUMN = "clip_embedding"
DEVICES = ("auto", "cpu", "cuda")


class WeightsUnavailableError(FileNotFoundError, ValueError):
    """A model step whose weights are not configured or not on disk (raised at start-up).

    It is both a ``FileNotFoundError`` and a ``ValueError`` (a configuration error: one line
    on stderr and exit 2 from the entry points), so callers that catch either see it.
    """


@dataclasses.dataclass(kw_only=True)
class Placement:
    """Where a model step runs. Every model step's settings extend this (same keys everywhere)."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    num_gpus: float = 0.0  # per actor; fractional shares one GPU between actors
    num_cpus: float = 1.0
    batch_size: int = 16
    num_actors: int = 1


def require_file(path: str, setting: str, what: str, disable: str) -> Path:
    """The weights file at ``path``, or a ``WeightsUnavailableError`` saying which setting to fix."""
    fix = (
        f"Set {setting}=/path/to/file, or disable the step with {disable} "
        f"(the run's stats and MLflow then record it as not applied)."
    )
    if not path:
        raise WeightsUnavailableError(f"{setting} is not set: {what} is needed. {fix}")
    p = Path(path).expanduser()
    if not p.is_file():
        raise WeightsUnavailableError(f"{setting}={path!r}: no such file ({what}). {fix}")
    return p


def check_placement(cfg: Placement, where: str) -> None:
    """Start-up checks of a model step's placement settings."""
    if cfg.device not in DEVICES:
        raise ValueError(f"{where}.device={cfg.device!r}: expected one of {list(DEVICES)}")
    if cfg.num_gpus < 0 or cfg.num_cpus < 0:
        raise ValueError(f"{where}: num_gpus and num_cpus must be >= 0")
    if cfg.batch_size < 1 or cfg.num_actors < 1:
        raise ValueError(f"{where}: batch_size and num_actors must be >= 1")
    if cfg.device == "cuda" and cfg.num_gpus == 0:
        # Ray hides every GPU from an actor that reserved none: it would fail on its first batch.
        raise ValueError(
            f"{where}.device=cuda needs {where}.num_gpus > 0 (e.g. 0.25 to share one GPU "
            f"between 4 actors), or set {where}.device=auto/cpu"
        )


def resolve_device(device: str, where: str) -> str:
    """``auto`` -> ``cuda`` when this worker sees a GPU, else ``cpu``; ``cuda`` without one is an error."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            f"{where}.device=cuda but this worker sees no CUDA device "
            f"(check {where}.num_gpus and the cluster's GPUs, or set {where}.device=auto)"
        )
    return device


def autocast(precision: str, device: str):
    """The inference autocast context for a precision setting (``auto``: bf16 on GPU, fp32 on CPU)."""
    import torch

    if precision == "auto":
        precision = "bf16" if device == "cuda" else "fp32"
    dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    return contextlib.nullcontext() if dtype is None else torch.autocast(device_type=device, dtype=dtype)


class ModelStep(RowStep):
    """A step that scores pending rows with a model loaded once per actor (see the module doc)."""

    uses_model = True
    needs_images: ClassVar[bool] = True  # decode pending rows' images for ``score``
    threshold_setting: ClassVar[str | None] = None  # the setting a score is compared with to drop a row
    published: ClassVar[Published | None] = None  # values of it with a source (``thresholds.Published``)

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.device = "cpu"

    def resources(self) -> Resources:
        c = self.cfg
        return Resources(num_cpus=c.num_cpus, num_gpus=c.num_gpus, batch_size=c.batch_size, num_actors=c.num_actors)

    def check(self) -> None:
        check_placement(self.cfg, self.section)
        self.check_settings()
        for setting, (path, what) in self.required_files().items():
            require_file(path, f"{self.section}.{setting}", what, self.disable_hint())
        self.check_threshold()

    def threshold_value(self) -> float | None:
        """The threshold the step drops rows by (None: it drops none)."""
        return getattr(self.cfg, self.threshold_setting)

    def published_threshold(self) -> Published | None:
        """The published values of the threshold for the configured model (default: ``published``)."""
        return self.published

    def threshold_source(self) -> str | None:
        """Where the configured threshold comes from (``thresholds.threshold_source``)."""
        calibration = getattr(self.cfg, "calibration", "")
        return threshold_source(self.threshold_value(), calibration, self.published_threshold())

    def calibration_hint(self) -> str:
        """How to calibrate the threshold, for the start-up warning."""
        return calibrate_hint(self.section.rpartition(".")[2], self.section)

    def check_threshold(self) -> None:
        """Warn at start-up when the threshold says nowhere what it was measured on."""
        if self.threshold_setting and self.threshold_source() is None:
            setting = f"{self.section}.{self.threshold_setting}"
            warn_unmeasured(setting, self.threshold_value(), f"{self.section}.calibration", self.calibration_hint())

    def describe(self) -> dict:
        out = super().describe()
        if out["applied"] and self.threshold_setting:
            out["threshold_source"] = self.threshold_source() or NOT_MEASURED
        return out

    def check_settings(self) -> None:
        """Range checks of the step's own settings (raise ``ValueError`` naming the setting)."""

    def required_files(self) -> dict[str, tuple[str, str]]:
        """Weight files that must exist: setting -> (path, what it is)."""
        return {}

    def weight_files(self) -> dict[str, str]:
        return {f"{self.section}.{k}": path for k, (path, _) in self.required_files().items() if path}

    def disable_hint(self) -> str:
        return f"{self.section}.enabled=false"

    def setup(self) -> None:
        self.device = resolve_device(self.cfg.device, self.section)
        self.load()

    @abc.abstractmethod
    def load(self) -> None:
        """Load the model(s) onto ``self.device`` (once per actor)."""

    def decode_size(self) -> dict:
        """``decode_rgb`` keywords for this model's input (``min_side`` / ``max_side``)."""
        return {}

    @abc.abstractmethod
    def score(self, batch: pa.Table, rows: list[int], images: list) -> list[dict | None]:
        """Column values for each of ``rows`` (None: not scored); ``images`` are theirs when ``needs_images``."""

    def reason(self, scores: dict) -> str | None:
        """The drop reason these scores give, or None to keep the row."""
        return None

    def process(self, batch: pa.Table) -> pa.Table:
        n = batch.num_rows
        mask = schema.pending_mask(batch)
        images, errors = decode_pending(batch, mask, **self.decode_size()) if self.needs_images else ({}, {})
        rows = sorted(images) if self.needs_images else [i for i in range(n) if mask[i]]
        values: dict[str, list] = {f.name: [None] * n for f in self.fields}
        reasons: list[str | None] = [None] * n
        for start in range(0, len(rows), self.cfg.batch_size):
            chunk = rows[start : start + self.cfg.batch_size]
            for i, scores in zip(chunk, self.score(batch, chunk, [images.get(i) for i in chunk]), strict=True):
                if scores is None:
                    continue
                for name, column in values.items():  # other keys are the step's own, for ``reason``
                    column[i] = scores.get(name)
                reasons[i] = self.reason(scores)
        batch = schema.set_reasons(schema.typed_columns(batch, self.fields, values), reasons)
        return mark_failed(batch, errors, self.name)


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


def decode_pending(
    table: pa.Table, mask: list[bool], min_side: int | None = None, max_side: int | None = None
) -> tuple[dict[int, Image.Image], dict[int, str]]:
    """Decoded images of the rows in ``mask`` by row index, and per-row decode errors (what Pillow
    raises on a row's bytes; a ``MemoryError`` fails the batch: ``curation.decode.pillow_error``)."""
    from curation.decode import pillow_error

    images: dict[int, Image.Image] = {}
    errors: dict[int, str] = {}
    column = table.column("image")
    for i, pending in enumerate(mask):
        if not pending:
            continue
        data = column[i].as_py()
        if data is None:
            errors[i] = "ValueError: row has no image bytes"
            continue
        try:
            images[i] = decode_rgb(data, min_side=min_side, max_side=max_side)
        except Exception as err:  # noqa: BLE001 - one bad row must not fail the batch
            errors[i] = str(pillow_error(schema.DECODE_FAILED, err))
    return images, errors


def mark_failed(table: pa.Table, errors: dict[int, str], step: str) -> pa.Table:
    """Give rows this step could not decode the ``decode_failed`` reason and an error message."""
    if not errors:
        return table
    reasons = [schema.DECODE_FAILED if i in errors else None for i in range(table.num_rows)]
    table = schema.set_reasons(table, reasons)
    messages = table.column("error_message").to_pylist()
    for i, msg in errors.items():
        messages[i] = messages[i] or f"{step}: {msg}"
    return schema.with_columns(table, {"error_message": pa.array(messages, type=pa.string())})


def embeddings_of(table: pa.Table, mask: list[bool], step: str) -> tuple[list[int], np.ndarray]:
    """Rows in ``mask`` that carry a CLIP embedding, and those embeddings as float32 [N, D]."""
    if EMBEDDING_COLUMN not in table.column_names:
        raise ValueError(
            f"{step} reads the {EMBEDDING_COLUMN!r} column: the recipe runs the CLIP embedding step before it"
        )
    wanted = [i for i, pending in enumerate(mask) if pending]
    column = table.column(EMBEDDING_COLUMN).take(pa.array(wanted, pa.int64()))
    valid = column.is_valid().to_numpy(zero_copy_only=False) if wanted else np.zeros(0, bool)
    rows = [i for i, ok in zip(wanted, valid) if ok]
    if not rows:
        return [], np.zeros((0, 0), np.float32)
    # through Arrow's flat values, not a Python list per row: the cost of a head is mostly this
    lists = column.filter(pa.array(valid)).combine_chunks()
    widths = pc.min_max(pc.list_value_length(lists)).as_py()
    if widths["min"] != widths["max"]:
        raise ValueError(f"{step}: the {EMBEDDING_COLUMN!r} rows have {widths['min']} to {widths['max']} values")
    flat = lists.flatten().to_numpy(zero_copy_only=False)
    return rows, np.array(flat, dtype=np.float32).reshape(len(rows), -1)  # a writable copy


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
        state = {k[len("module.") :]: v for k, v in state.items()}
    return state


def describe_state(state: dict, limit: int = 6) -> str:
    """What a state dict holds, in one line: its tensors' names and shapes (the first ``limit``),
    for the error that says a weights file is not the layout a step loads."""
    items = [f"{k} {list(getattr(v, 'shape', ()))}" for k, v in state.items()]
    more = f", ... ({len(items)} tensors)" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


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
            raise ValueError(
                f"linear head {source}: expected weight [1|2, D] and bias [1|2], "
                f"got {tuple(weight_KD.shape)} and {tuple(bias_K.shape)}"
            )
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
            raise ValueError(
                f"{path}: a linear head file holds exactly one weight and one bias tensor, found keys {sorted(state)}"
            )
        return cls(state[weights[0]].float().numpy(), state[biases[0]].float().numpy(), str(path))

    def predict(self, emb_ND: np.ndarray) -> np.ndarray:
        if emb_ND.shape[1] != self.dim:
            raise ValueError(
                f"linear head {self.source} expects {self.dim}-d embeddings, the CLIP model "
                f"gives {emb_ND.shape[1]}-d: it was trained on another CLIP model"
            )
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
