"""Staged curate -> pretrain -> probe runs from one configuration (any prefix or suffix).

    python pipelines/dag.py --config configs/dag_demo.yaml [key=value ...]
    python pipelines/dag.py --config configs/dag_demo.yaml submit=ray_job job_address=http://127.0.0.1:8265

A stage whose inputs and settings did not change is reused; a failed one resumes.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo this script ships in (ray job --working-dir)

from infra.cli import config_main  # noqa: E402
from pipelines.staged import DagConfig, run_dag  # noqa: E402


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
