"""Staged curate -> pretrain -> probe runs from one configuration (any prefix or suffix).

    python pipelines/dag.py --config configs/dag_demo.yaml [key=value ...]
    python pipelines/dag.py --config configs/dag_demo.yaml submit=ray_job job_address=http://127.0.0.1:8265

A stage whose inputs and settings did not change is reused; a failed one resumes.
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo this script ships in (ray job --working-dir)

from infra.config import load_config  # noqa: E402
from infra.dag import DagConfig, run_dag  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="YAML file: workspace, stages, and curate/pretrain/probe sections")
    parser.add_argument("overrides", nargs="*", help="key=value settings, e.g. probe.seg.steps=50")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        cfg = load_config(DagConfig, args.config, args.overrides)
        cfg.validate()
    except ValueError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    print(run_dag(cfg).summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
