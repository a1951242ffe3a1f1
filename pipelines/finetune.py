"""Fine-tune a backbone end to end (backbone + light task head) on pose, body-part segmentation,
depth, normal, pointmap or albedo, on Ray Train with FSDP2, layer-wise lr decay and DCP checkpoints.

    python pipelines/finetune.py --config configs/finetune_tiny.yaml backbone.checkpoint=runs/x/student_backbone.safetensors
    python pipelines/finetune.py --config configs/finetune_tiny.yaml tasks=[pose,seg] output_dir=runs/ft
    ray job submit --address http://127.0.0.1:8265 --working-dir . -- python pipelines/finetune.py --config ...

Tasks without data paths use the synthetic probe set, generated under the output folder.
Re-running the same command resumes unfinished tasks from their newest checkpoint.
"""

from __future__ import annotations

import sys

from evaluation.finetune.config import FinetuneConfig
from evaluation.finetune.run import run_finetune
from infra.cli import config_main


def main(argv: list[str] | None = None) -> int:
    return config_main(
        __doc__,
        FinetuneConfig,
        lambda cfg: run_finetune(cfg).summary(),
        argv,
        config_help="YAML file of settings (configs/finetune_*.yaml)",
        overrides_example="backbone.checkpoint=x.safetensors tasks=[seg,normal] steps=100",
    )


if __name__ == "__main__":
    sys.exit(main())
