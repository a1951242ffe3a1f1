"""Pretrain a Sapiens2 backbone (MAE + contrastive) on a curated dataset version, on Ray Train.

    python pipelines/pretrain.py --config configs/pretrain_tiny.yaml data.dataset=runs/demo/curated
    python pipelines/pretrain.py --config configs/pretrain_0.4b.yaml data.dataset=<version id> run_name=s2-04b
    python pipelines/pretrain.py --config configs/pretrain_0.4b.yaml data.dataset=<domain version> \
        init.backbone=sapiens2_0.4b_pretrain.safetensors steps=5000     # continue from the released weights
    ray job submit --address http://127.0.0.1:8265 --working-dir . -- python pipelines/pretrain.py --config ...

Re-running with the same run_name (and storage_path) resumes from its newest checkpoint.
``init.backbone``: a released Sapiens2 or v1 pretrain file (or a platform export) that student and
teacher start from, checked against ``model`` (another size or family is refused in one line);
``init.heads``: a platform checkpoint folder for the DINO head and MAE decoder (else fresh).
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
