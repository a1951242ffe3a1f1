"""Curate raw web images into Humans-1B-style WebDataset shards.

python pipelines/curate.py --config configs/curate_demo.yaml input.uri=data/raw output_dir=runs/x
ray job submit --address http://127.0.0.1:8265 --working-dir . -- python pipelines/curate.py --config ...
"""

from __future__ import annotations

import sys

from curation.pipeline import run_curation
from curation.recipe import CurationConfig
from infra.cli import config_main


def curate(cfg: CurationConfig) -> str:
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
