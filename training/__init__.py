"""Pretraining on Ray Train with FSDP2, from the WebDataset shards of a curated dataset
version: Sapiens2 (MAE + DINO CLS loss + KoLeo) or Sapiens v1 (MAE only), by the model's family.

Entry point: ``run_pretraining(cfg)`` (``pipelines/pretrain.py`` on the command line).
Pieces: ``config`` (settings), ``data`` (resumable shard stream), ``augment`` (multi-crop),
``masking``, ``losses``, ``meta_arch`` (student/teacher/heads/losses), ``parallelize``
(FSDP2, activation checkpointing, compile), ``step`` (one optimisation step),
``checkpoint`` (DCP + exports), ``loop`` (the Ray Train worker), ``run`` (the driver),
``visualize`` (the MAE reconstruction grid). MLflow calls go through ``infra.tracking``.
"""

from training.config import PretrainConfig

__all__ = ["PretrainConfig", "TrainingResult", "run_pretraining"]


def __getattr__(name: str):
    # The driver pulls in Ray and MLflow; import it only when asked for.
    if name in ("TrainingResult", "run_pretraining"):
        from training import run

        return getattr(run, name)
    raise AttributeError(name)
