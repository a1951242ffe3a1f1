"""Annotating a curated dataset version with the Sapiens task models (pseudo-labels): pose,
body-part segmentation, normals, pointmaps, depth and albedo, one annotation shard per source
shard, on Ray Data actor pools, recorded in MLflow.

Entry point: ``run_annotation(cfg)`` (``pipelines/annotate.py`` from the command line); the
pieces are ``config`` (settings), ``models`` (what a checkpoint is; PyTorch or onnxruntime),
``tasks`` (each task's released pre- and post-processing), ``annotator`` (the work of one
process), ``shards`` (reading source shards, writing annotation shards), ``layout`` (the output
folder), ``job`` (the Ray Data job), ``record`` (MLflow), ``gallery`` (the HTML page) and
``stage`` (the chain's ``annotate`` stage).
"""

from evaluation.annotate.config import AnnotateConfig
from evaluation.annotate.job import AnnotationResult, TooManyErrors, run_annotation

__all__ = ["AnnotateConfig", "AnnotationResult", "TooManyErrors", "run_annotation"]
