"""Pretrain a Sapiens2 backbone (MAE + contrastive) on a curated dataset version, on Ray Train.

    python pipelines/pretrain.py --config configs/pretrain_tiny.yaml data.dataset=runs/demo/curated
    python pipelines/pretrain.py --config configs/pretrain_0.4b.yaml data.dataset=<version id> run_name=s2-04b
    ray job submit --address http://127.0.0.1:8265 --working-dir . -- python pipelines/pretrain.py --config ...

Re-running with the same run_name (and storage_path) resumes from its newest checkpoint.
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo this script ships in (ray job --working-dir)

from infra.config import load_config  # noqa: E402
from training.config import PretrainConfig  # noqa: E402
from training.run import run_pretraining  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="YAML file of settings (defaults: the Sapiens2 recipe, sapiens2_0.4b)")
    parser.add_argument("overrides", nargs="*", help="key=value settings, e.g. steps=1000 ray.num_workers=16")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        cfg = load_config(PretrainConfig, args.config, args.overrides)
        cfg.validate()
    except ValueError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    try:
        result = run_pretraining(cfg)
    except ValueError as err:  # a setting or a reference that cannot work (raised before training starts)
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(result.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
