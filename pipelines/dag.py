"""The chain: curate -> pretrain -> [finetune ->] probe [-> annotate] runs from one configuration (a contiguous part).

    python pipelines/dag.py --config configs/dag_demo.yaml [key=value ...]
    python pipelines/dag.py --config configs/dag_demo.yaml submit=ray_job job_address=http://127.0.0.1:8265

A stage whose inputs and settings did not change is reused; a failed one resumes.
"""

from __future__ import annotations

import sys

from infra.cli import config_main
from pipelines.chain import DagConfig, run_dag


def main(argv: list[str] | None = None) -> int:
    return config_main(
        __doc__,
        DagConfig,
        lambda cfg: run_dag(cfg).summary(),
        argv,
        config_help="YAML file: workspace, stages, and curate/pretrain/probe sections",
        overrides_example="probe.seg.steps=50",
    )


if __name__ == "__main__":
    sys.exit(main())
