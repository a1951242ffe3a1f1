"""Distil a frozen teacher backbone into a smaller student on a curated dataset version, on Ray Train.

    python pipelines/distill.py --config configs/distill_tiny.yaml data.dataset=runs/demo/curated \
        teacher.checkpoint=runs/demo/pretrain/<run>/export/student_backbone.safetensors \
        teacher.model=sapiens2_tiny student.model=sapiens2_nano storage_path=runs/distill steps=200
    python pipelines/distill.py --config configs/distill_tiny.yaml data.dataset=<version id> \
        teacher.checkpoint=sapiens2_1b_pretrain.safetensors teacher.model=sapiens2_1b student.model=sapiens2_0.1b

The teacher: a released Sapiens2 pretrain file (with or without a ``backbone.`` prefix) or a
platform export, checked against ``teacher.model``. The student exports in the official layout
(``<run>/export/student_backbone.safetensors``), which ``models.build_backbone(student.model,
weights=...)`` loads as fine-tuning and probing load any backbone; a task checkpoint on it goes
through ONNX export and annotation. Re-running with the same run_name (and storage_path)
resumes from its newest checkpoint.
"""

from __future__ import annotations

import sys

from infra.cli import config_main
from training.distill_config import DistillConfig
from training.run import run_distillation


def main(argv: list[str] | None = None) -> int:
    return config_main(
        __doc__,
        DistillConfig,
        lambda cfg: run_distillation(cfg).summary(),
        argv,
        config_help="YAML file of settings (configs/distill_*.yaml)",
        overrides_example="teacher.checkpoint=teacher.safetensors steps=1000",
    )


if __name__ == "__main__":
    sys.exit(main())
