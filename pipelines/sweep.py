"""Which data makes a better model: variants of a DAG configuration, each at several seeds,
with a fixed budget, compared on one page.

    python pipelines/sweep.py --config configs/sweep_demo.yaml [key=value ...]

Each variant overrides the DAG configuration (curation settings, ``pretrain.data.sampling``);
stages an earlier variant, seed or sweep finished are reused. Writes ``<output_dir>/comparison.html``
(probe metrics over seeds against the baseline, each dataset's audit diff against the baseline's),
``sweep.json``, and an MLflow parent run with one child run per variant.
"""

from __future__ import annotations

import sys

from infra.cli import config_main
from pipelines.sweeper import SweepConfig, run_sweep


def main(argv: list[str] | None = None) -> int:
    return config_main(
        __doc__,
        SweepConfig,
        lambda cfg: run_sweep(cfg).summary(),
        argv,
        config_help="YAML file: the DAG config, the variants (overrides) and the seeds",
        overrides_example="seeds=[0,1,2]",
    )


if __name__ == "__main__":
    sys.exit(main())
