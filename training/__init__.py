"""Training on Ray Train with FSDP2, from the WebDataset shards of a curated dataset version.
Two objectives on one machinery: pretraining, Sapiens2 (MAE + DINO CLS loss + KoLeo) or Sapiens
v1 (MAE only) by the model's family, optionally continued from released weights (``init``); and
distillation of a frozen teacher's features into a smaller student.

Entry points: ``run_pretraining(cfg)`` and ``run_distillation(cfg)`` (``pipelines/pretrain.py``,
``pipelines/distill.py`` on the command line). Pieces: ``config`` / ``distill_config``
(settings), ``init`` (weight files: checks, digests, loading), ``data`` (resumable shard
stream), ``augment`` (multi-crop), ``masking``, ``losses``, ``meta_arch``
(student/teacher/heads/losses of each objective), ``parallelize`` (FSDP2, activation
checkpointing, compile), ``step`` (one optimisation step), ``checkpoint`` (DCP + exports),
``loop`` (the Ray Train worker), ``run`` (the driver), ``stage`` (the chain's stages),
``visualize`` (the MAE reconstruction grid). MLflow calls go through ``infra.tracking``.
"""

from training.config import PretrainConfig
from training.distill_config import DistillConfig

__all__ = ["DistillConfig", "PretrainConfig", "TrainingResult", "run_distillation", "run_pretraining"]


def __getattr__(name: str):
    # The driver pulls in Ray and MLflow; import it only when asked for.
    if name in ("TrainingResult", "run_distillation", "run_pretraining"):
        from training import run

        return getattr(run, name)
    raise AttributeError(name)
