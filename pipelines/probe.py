"""Probe a frozen backbone on pose, body-part segmentation, pointmap, normal, albedo and k-NN.

    python pipelines/probe.py --config configs/probe_tiny.yaml backbone.checkpoint=runs/x/student.safetensors
    python pipelines/probe.py --config configs/probe_tiny.yaml tasks=[seg,normal] output_dir=runs/probe-random
    ray job submit --address http://127.0.0.1:8265 --working-dir . -- python pipelines/probe.py --config ...

Tasks without data paths run on the synthetic probe set, generated under the output folder.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo this script ships in (ray job --working-dir)

from evaluation.config import ProbeConfig  # noqa: E402
from evaluation.run import run_probes  # noqa: E402
from infra.cli import config_main  # noqa: E402


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
