"""Curate raw web images into Humans-1B-style WebDataset shards.

    python pipelines/curate.py --config configs/curate_demo.yaml input.uri=data/raw output_dir=runs/x
    ray job submit --address http://127.0.0.1:8265 --working-dir . -- python pipelines/curate.py --config ...
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo this script ships in (ray job --working-dir)

from curation.config import CurationConfig
from curation.pipeline import run_curation
from infra.config import load_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="YAML file of settings (defaults: the Humans-1B recipe)")
    parser.add_argument("overrides", nargs="*", help="key=value settings, e.g. detector.score_threshold=0.5")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        cfg = load_config(CurationConfig, args.config, args.overrides)
        cfg.validate()
    except ValueError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    result = run_curation(cfg)
    print(("already complete (nothing re-run)\n" if result.skipped else "") + result.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
