"""Probe a frozen backbone on pose, body-part segmentation, pointmap, normal, albedo and k-NN.

    python pipelines/probe.py --config configs/probe_tiny.yaml backbone.checkpoint=runs/x/student.safetensors
    python pipelines/probe.py --config configs/probe_tiny.yaml tasks=[seg,normal] output_dir=runs/probe-random
    ray job submit --address http://127.0.0.1:8265 --working-dir . -- python pipelines/probe.py --config ...

Tasks without data paths run on the synthetic probe set, generated under the output folder.
"""

from __future__ import annotations

import sys

from evaluation.config import ProbeConfig
from evaluation.run import run_probes
from infra.cli import config_main


def main(argv: list[str] | None = None) -> int:
    return config_main(
        __doc__,
        ProbeConfig,
        lambda cfg: run_probes(cfg).summary(),
        argv,
        config_help="YAML file of settings (configs/probe_*.yaml)",
        overrides_example="backbone.checkpoint=x.safetensors pose.steps=50",
    )


if __name__ == "__main__":
    sys.exit(main())
