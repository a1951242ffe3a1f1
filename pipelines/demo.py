"""The demo: build the demo corpus from real photos (plus planted bad cases), curate it, say where everything is.

    make demo          # or: python pipelines/demo.py [key=value overrides for the curation]
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from curation.config import CurationConfig  # noqa: E402
from curation.demo import build_demo_corpus  # noqa: E402
from curation.pipeline import run_curation  # noqa: E402
from infra.config import load_config  # noqa: E402


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    workspace = REPO / "runs" / "demo"
    raw = workspace / "raw"
    if not raw.exists():
        expected = build_demo_corpus(raw)
        print(f"demo corpus: {len(expected)} images in {raw}")
    cfg = load_config(CurationConfig, REPO / "configs" / "curate_demo.yaml",
                      [f"input.uri={raw}", f"output_dir={workspace / 'curated'}", *argv])
    result = run_curation(cfg)
    print(result.summary())
    print(f"mlflow:   sqlite:///{workspace / 'mlflow.db'}  (mlflow ui --backend-store-uri sqlite:///{workspace / 'mlflow.db'})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
