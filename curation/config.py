"""The job-level settings of a curation run and the sections of its reader and decoder.

The job's whole config class (``curation.recipe.CurationConfig``) is derived from the recipe:
these job settings plus one section per step, each step's settings dataclass living beside
the step. Defaults are the Humans-1B recipe; YAML files under configs/ override them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Literal

from infra.ray_runtime import RayConfig, ray_section
from infra.tracking import TrackingConfig, tracking_section

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff")


@dataclasses.dataclass(kw_only=True)
class InputConfig:
    """Where the raw images are and how they are cut into partitions (one output shard each)."""

    uri: str = ""  # folder, a tar/parquet file, or a folder of them; local or s3://, gs://
    format: Literal["auto", "folder", "webdataset", "parquet"] = "auto"
    images_per_partition: int = 1000  # folder inputs and Parquet with a path column
    extensions: list[str] = field(default_factory=lambda: list(IMAGE_EXTENSIONS))
    parquet_image_column: str | None = None  # auto: first of image, jpg, png, webp, bytes
    parquet_path_column: str | None = None  # auto: first of path, uri, url, file
    parquet_key_column: str | None = None  # auto: "key" when present
    num_cpus: float = 1.0  # per read task; reading is mostly I/O, so 0.25-0.5 leaves cores to the row steps

    def __post_init__(self) -> None:
        if self.images_per_partition < 1:
            raise ValueError(f"input.images_per_partition must be >= 1, got {self.images_per_partition}")
        if self.num_cpus <= 0:
            raise ValueError(f"input.num_cpus must be > 0, got {self.num_cpus}")


@dataclasses.dataclass(kw_only=True)
class DecodeConfig:
    """Safe decoding (``decode``): a header over ``max_pixels`` (Pillow's own warning limit) or a
    file over ``max_bytes`` is recorded (``decompression_bomb``, ``file_too_large``) without being
    decoded; transparency is flattened on ``alpha_background``; ``max_side`` > 0 resizes the long
    side down to it; ``reencode: if_needed`` keeps untouched RGB JPEG bytes, else re-encodes at
    ``jpeg_quality``."""

    max_pixels: int = 89_478_485  # Pillow's own warning limit; larger headers are rejected undecoded
    max_bytes: int = 64 * 2**20  # larger files are recorded as file_too_large without being read
    alpha_background: list[int] = field(default_factory=lambda: [255, 255, 255])
    max_side: int = 0  # 0 keeps full resolution; else the long side is resized down to it
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
class ShardsConfig:
    """The ``shards`` section: how the kept samples are cut into WebDataset shards.

    ``samples_per_shard=0``: one shard per input partition, its kept samples by key (shard size
    follows the partition's keep rate; committed partition by partition, no shuffle). ``N > 0``:
    every shard but the last holds exactly N samples, drawn from the whole run by a seeded
    shuffle (``curation.sharding``), so sources mix and shards are of one size.
    """

    samples_per_shard: int = 0
    seed: int = 0  # the shuffle's seed (samples_per_shard > 0)

    def __post_init__(self) -> None:
        if self.samples_per_shard < 0:
            raise ValueError(
                f"shards.samples_per_shard must be >= 0 (0: one per partition), got {self.samples_per_shard}"
            )
        if self.seed < 0:
            raise ValueError(f"shards.seed must be >= 0, got {self.seed}")


@dataclasses.dataclass(kw_only=True)
class DedupConfig:
    """Settings the global dedup steps share (the ``dedup`` section beside exact/near/semantic)."""

    engine: Literal["local", "ray"] = "local"  # ray: the shuffles run as Ray Data jobs
    against: str | None = None  # an earlier curation output: dedup incrementally against its kept images


@dataclasses.dataclass(kw_only=True)
class JobConfig:
    """What a curation job is called, where it writes, how it is tracked and where Ray runs."""

    name: str = "curate"
    output_dir: str = ""
    dataset_name: str | None = None  # None: the output folder's name
    tracking: TrackingConfig = tracking_section("curate")
    ray: RayConfig = ray_section()

    def validate(self) -> None:
        """Checks that need the whole config (called before any work starts)."""
        if not self.input.uri:
            raise ValueError(
                "input.uri is required: a folder, tar or parquet file (or folder of them), e.g. input.uri=data/raw"
            )
        if not self.output_dir:
            raise ValueError("output_dir is required, e.g. output_dir=runs/curate")
