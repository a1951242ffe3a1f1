"""Curate raw web images into Humans-1B-style WebDataset shards.

python pipelines/curate.py --config configs/curate_demo.yaml input.uri=data/raw output_dir=runs/x
ray job submit --address http://127.0.0.1:8265 --working-dir . -- python pipelines/curate.py --config ...
"""

from __future__ import annotations

import functools
import sys

from curation.filters.backbone_embedding import BackboneCode, provide_backbone_code
from curation.pipeline import run_curation
from curation.recipe import CurationConfig
from infra.cli import config_main


def provide_model_code() -> None:
    """Give curation's backbone embedding step (``backbone_embedding``) the Sapiens backbones of
    ``models``: the two share a floor and never import each other, so the entry points pass it in."""
    from models import build_backbone, check_weights_file, get_config
    from models.sapiens_processing import normalize_image

    provide_backbone_code(
        BackboneCode(build_backbone, check_weights_file, get_config, functools.partial(normalize_image, bgr=False))
    )


def curate(cfg: CurationConfig) -> str:
    if cfg.backbone_embedding.enabled:  # (models imports torch: only when the step runs)
        provide_model_code()
    result = run_curation(cfg)
    return ("already complete (nothing re-run)\n" if result.skipped else "") + result.summary()


def main(argv: list[str] | None = None) -> int:
    return config_main(
        __doc__,
        CurationConfig,
        curate,
        argv,
        config_help="YAML file of settings (defaults: the Humans-1B recipe)",
        overrides_example="detector.score_threshold=0.5",
    )


if __name__ == "__main__":
    sys.exit(main())
