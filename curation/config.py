"""Settings of a curation run. Defaults are the Humans-1B recipe; YAML files under configs/ override them."""
from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Literal

from curation.content import ContentFiltersConfig
from curation.dedup.near import NearDupConfig
from curation.dedup.semantic import SemanticDupConfig


def weightless_content_filters(text: bool = True, num_cpus: float = 0.5) -> ContentFiltersConfig:
    """Content filters that need no model weights from outside: only OCR (rapidocr ships its models).

    The CLIP, artistic and watermark filters are explicitly disabled, which stats.json and
    MLflow record as "not applied". For laptops, demos and tests.
    """
    cfg = ContentFiltersConfig()
    cfg.embedding.enabled = cfg.artistic.enabled = cfg.watermark.enabled = False
    cfg.text.enabled = text
    cfg.text.num_cpus = num_cpus
    return cfg

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff")


@dataclasses.dataclass(kw_only=True)
class InputConfig:
    """Where the raw images are and how they are cut into partitions (one output shard each)."""

    uri: str = ""                      # folder, a tar/parquet file, or a folder of them; local or s3://, gs://
    format: Literal["auto", "folder", "webdataset", "parquet"] = "auto"
    images_per_partition: int = 1000   # folder inputs and Parquet with a path column
    extensions: list[str] = field(default_factory=lambda: list(IMAGE_EXTENSIONS))
    parquet_image_column: str | None = None  # auto: first of image, jpg, png, webp, bytes
    parquet_path_column: str | None = None   # auto: first of path, uri, url, file
    parquet_key_column: str | None = None    # auto: "key" when present
    num_cpus: float = 1.0              # per read task; reading is mostly I/O, so 0.25-0.5 leaves cores to the stages

    def __post_init__(self) -> None:
        if self.images_per_partition < 1:
            raise ValueError(f"input.images_per_partition must be >= 1, got {self.images_per_partition}")
        if self.num_cpus <= 0:
            raise ValueError(f"input.num_cpus must be > 0, got {self.num_cpus}")


@dataclasses.dataclass(kw_only=True)
class DecodeConfig:
    max_pixels: int = 89_478_485       # Pillow's own warning limit; larger headers are rejected undecoded
    max_bytes: int = 64 * 2**20        # larger files are recorded as file_too_large without being read
    alpha_background: list[int] = field(default_factory=lambda: [255, 255, 255])
    max_side: int = 0                  # 0 keeps full resolution; else the long side is resized down to it
    reencode: Literal["if_needed", "always"] = "if_needed"  # if_needed keeps untouched RGB JPEG bytes
    jpeg_quality: int = 95
    batch_size: int = 16
    num_cpus: float = 1.0

    def __post_init__(self) -> None:
        if self.max_pixels < 1 or self.max_bytes < 1:
            raise ValueError("decode.max_pixels and decode.max_bytes must be positive")
        if len(self.alpha_background) != 3 or not all(0 <= c <= 255 for c in self.alpha_background):
            raise ValueError(f"decode.alpha_background must be three values in 0..255, got {self.alpha_background}")
        if not 1 <= self.jpeg_quality <= 100:
            raise ValueError(f"decode.jpeg_quality must be in 1..100, got {self.jpeg_quality}")


@dataclasses.dataclass(kw_only=True)
class FilterConfig:
    """Cheap geometric filters applied right after decode."""

    min_short_side: int = 300
    max_aspect_ratio: float = 3.0      # long side / short side

    def __post_init__(self) -> None:
        if self.min_short_side < 0:
            raise ValueError("filters.min_short_side must be >= 0")
        if self.max_aspect_ratio < 1:
            raise ValueError(f"filters.max_aspect_ratio must be >= 1, got {self.max_aspect_ratio}")


# Detector scores are calibrated differently: the Sapiens rule (> 0.9) assumes a YOLO-like
# detector; the CenterNet asset scores real people 0.38-0.86 (shared/assets/PROVENANCE.md).
DEFAULT_SCORE_THRESHOLDS = {"ultralytics": 0.9, "centernet_onnx": 0.3}
DEFAULT_INPUT_SIZES = {"ultralytics": 640, "centernet_onnx": 512}


@dataclasses.dataclass(kw_only=True)
class DetectorConfig:
    """Salient-person detection: keep an image with >= 1 person box scoring >= score_threshold
    whose size (measured as ``box_size_measure``) is >= ``min_box_size`` pixels."""

    backend: Literal["centernet_onnx", "ultralytics", "none"] = "centernet_onnx"
    weights: str = ""                  # .onnx for centernet_onnx; .pt/.onnx file or a folder holding one for ultralytics
    score_threshold: float | None = None  # None: the backend's default (DEFAULT_SCORE_THRESHOLDS)
    min_box_size: int = 300
    box_size_measure: Literal["height", "long_side", "short_side"] = "height"
    record_threshold: float = 0.2      # every person box at or above this score goes into the metadata
    input_size: int | None = None      # None: the backend's default (DEFAULT_INPUT_SIZES)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    batch_size: int = 8
    num_actors: int = 1
    num_cpus: float = 1.0
    num_gpus: float = 0.0              # fractional GPUs per actor on a cluster, e.g. 0.25
    intra_op_threads: int = 1          # ONNX Runtime threads per actor on CPU

    def __post_init__(self) -> None:
        if self.score_threshold is not None and not 0 <= self.score_threshold <= 1:
            raise ValueError(f"detector.score_threshold must be in [0, 1], got {self.score_threshold}")
        if not 0 <= self.record_threshold <= 1:
            raise ValueError("detector.record_threshold must be in [0, 1]")

    @property
    def threshold(self) -> float:
        return self.score_threshold if self.score_threshold is not None else DEFAULT_SCORE_THRESHOLDS.get(self.backend, 0.5)

    @property
    def size(self) -> int:
        return self.input_size or DEFAULT_INPUT_SIZES.get(self.backend, 640)


@dataclasses.dataclass(kw_only=True)
class DedupConfig:
    """Global dedup over the whole run, on metadata (hashes, embeddings) only."""

    exact: bool = True                 # identical input bytes keep one copy, across the whole run
    near: NearDupConfig = field(default_factory=NearDupConfig)          # PHash within max_distance bits
    semantic: SemanticDupConfig = field(default_factory=SemanticDupConfig)  # CLIP cosine (needs content.embedding)
    engine: Literal["local", "ray"] = "local"  # ray: the shuffles run as Ray Data jobs
    against: str | None = None         # an earlier curation output: dedup incrementally against its kept images


@dataclasses.dataclass(kw_only=True)
class TrackingConfig:
    enabled: bool = True
    uri: str | None = None             # None: $MLFLOW_TRACKING_URI, else sqlite:///<output parent>/mlflow.db
    experiment: str = "curation"
    run_name: str | None = None        # None: the output folder's name
    dataset_name: str | None = None    # None: the output folder's name


@dataclasses.dataclass(kw_only=True)
class RayConfig:
    address: str | None = None         # None: the job's cluster under `ray job submit`, else a local one
    num_cpus: int | None = None        # local cluster only
    progress_bars: Literal["auto", "on", "off"] = "auto"  # auto: on when the terminal is interactive
    object_store_memory: int | None = None  # local cluster only, bytes
    temp_dir: str | None = None        # local cluster only: Ray's session folder root (short path)
    # Model stages' actor pools: "fixed" starts every one of a stage's num_actors at once (measured on
    # 2 CPUs: 2 detector actors 18.3 images/s fixed vs 12.7 when Ray Data was left to grow the pool,
    # which kept one busy); "autoscaling" starts one and lets Ray Data add up to num_actors.
    actor_pools: Literal["fixed", "autoscaling"] = "fixed"


@dataclasses.dataclass(kw_only=True)
class CurationConfig:
    name: str = "curation"
    input: InputConfig = field(default_factory=InputConfig)
    output_dir: str = ""
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    filters: FilterConfig = field(default_factory=FilterConfig)
    detector: DetectorConfig = field(default_factory=DetectorConfig)
    content: ContentFiltersConfig = field(default_factory=ContentFiltersConfig)
    dedup: DedupConfig = field(default_factory=DedupConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    ray: RayConfig = field(default_factory=RayConfig)

    def validate(self) -> None:
        """Checks that need the whole config (called before any work starts)."""
        if not self.input.uri:
            raise ValueError("input.uri is required: a folder, tar or parquet file (or folder of them), e.g. input.uri=data/raw")
        if not self.output_dir:
            raise ValueError("output_dir is required, e.g. output_dir=runs/curate")
        if self.dedup.semantic.enabled and not self.content.embedding.enabled:
            raise ValueError("dedup.semantic compares CLIP embeddings: enable content.embedding "
                             "or set dedup.semantic.enabled=false")
        if self.detector.backend != "none" and not self.detector.weights:
            raise ValueError(f"detector.weights is required for backend {self.detector.backend!r} (a local model "
                             "file), or set detector.backend=none to run without person detection")
