"""Probe a frozen backbone on pose, body-part segmentation, pointmap, normal, albedo and k-NN.

    python pipelines/probe.py --config configs/probe_tiny.yaml backbone.checkpoint=runs/x/student.safetensors
    python pipelines/probe.py --config configs/probe_tiny.yaml tasks=[seg,normal] output_dir=runs/probe-random
    ray job submit --address http://127.0.0.1:8265 --working-dir . -- python pipelines/probe.py --config ...

Tasks without data paths run on the synthetic probe set, generated under the output folder.
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo this script ships in (ray job --working-dir)

from evaluation.config import ProbeConfig  # noqa: E402
from evaluation.run import run_probes  # noqa: E402
from infra.config import load_config  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="YAML file of settings (configs/probe_*.yaml)")
    parser.add_argument("overrides", nargs="*",
                        help="key=value settings, e.g. backbone.checkpoint=x.safetensors pose.steps=50")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        cfg = load_config(ProbeConfig, args.config, args.overrides)
        cfg.validate()
    except ValueError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    try:
        result = run_probes(cfg)
    except ValueError as err:  # bad data or weights, found before any training
        print(f"input error: {err}", file=sys.stderr)
        return 2
    print(result.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
