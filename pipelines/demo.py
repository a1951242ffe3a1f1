"""The demo: build the demo corpus (real photos + planted bad cases), then run the whole
curate -> pretrain -> probe DAG on it with tiny settings, and say where every result is.

    make demo          # or: python pipelines/demo.py [key=value overrides of configs/dag_demo.yaml]
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipelines.demo_corpus import build_demo_corpus  # noqa: E402
from infra.config import load_config  # noqa: E402
from pipelines.staged import DagConfig, run_dag  # noqa: E402


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    raw = REPO / "runs" / "demo" / "raw"
    expected = build_demo_corpus(raw)  # deterministic: rebuilding gives the same files, so stages are reused
    print(f"demo corpus: {len(expected)} images in {raw}")
    cfg = load_config(DagConfig, REPO / "configs" / "dag_demo.yaml", [f"curate.input.uri={raw}", *argv])
    result = run_dag(cfg)
    print(result.summary())
    print(f"browse: mlflow ui --backend-store-uri {result.tracking_uri}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
