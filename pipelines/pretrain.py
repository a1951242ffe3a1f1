"""Pretrain a Sapiens2 backbone (MAE + contrastive) on a curated dataset version, on Ray Train.

    python pipelines/pretrain.py --config configs/pretrain_tiny.yaml data.dataset=runs/demo/curated
    python pipelines/pretrain.py --config configs/pretrain_0.4b.yaml data.dataset=<version id> run_name=s2-04b
    ray job submit --address http://127.0.0.1:8265 --working-dir . -- python pipelines/pretrain.py --config ...

Re-running with the same run_name (and storage_path) resumes from its newest checkpoint.
"""

from __future__ import annotations

import sys

from infra.cli import config_main
from training.config import PretrainConfig
from training.run import run_pretraining


def main(argv: list[str] | None = None) -> int:
    return config_main(
        __doc__,
        PretrainConfig,
        lambda cfg: run_pretraining(cfg).summary(),
        argv,
        config_help="YAML file of settings (defaults: the Sapiens2 recipe, sapiens2_0.4b)",
        overrides_example="steps=1000 ray.num_workers=16",
    )


if __name__ == "__main__":
    sys.exit(main())
