"""Curate raw web images into Humans-1B-style WebDataset shards.

python pipelines/curate.py --config configs/curate_demo.yaml input.uri=data/raw output_dir=runs/x
ray job submit --address http://127.0.0.1:8265 --working-dir . -- python pipelines/curate.py --config ...
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo this script ships in (ray job --working-dir)

from curation.pipeline import run_curation  # noqa: E402
from curation.recipe import CurationConfig  # noqa: E402
from infra.cli import config_main  # noqa: E402


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
