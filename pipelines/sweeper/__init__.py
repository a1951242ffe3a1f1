"""Curation and sampling experiments as DAG sweeps: which data makes a better model.

A sweep runs variants of one DAG configuration (``configs/dag_*.yaml``), each a list of
overrides (curation settings, the sampling policy), at several seeds, all with the same
budget: the same model trained on as many images, probed alike (DataComp's fixed-compute
protocol). Stages are reused across variants, seeds and sweeps by their identity
(``pipelines.chain``), so a sweep costs only the stages that differ.

- ``config``: the settings, the DAG configuration of each variant and seed, the budget check;
- ``run``: the invocations (a failure is recorded, the others go on) and the outputs;
- ``compare``: metrics over seeds against the baseline (the noise rule), datasets against the
  baseline's (the curation audit's diff);
- ``page``: the comparison page; ``record``: the MLflow parent run and one child per variant.

Entry point: ``python pipelines/sweep.py --config configs/sweep_demo.yaml``.
"""

from pipelines.sweeper.config import SweepConfig, VariantConfig
from pipelines.sweeper.run import SweepResult, run_sweep

__all__ = ["SweepConfig", "SweepResult", "VariantConfig", "run_sweep"]
