"""Frozen-backbone probing: dense probes for pose, body-part segmentation, pointmap, normal
and albedo, and k-NN on the CLS token, trained with Ray Train and recorded in MLflow.

Entry point: ``run_probes(cfg)`` (``pipelines/probe.py`` from the command line); the pieces
are ``evaluation.datasets`` (COCO keypoints, PNG masks, float maps, labelled images;
``evaluation.coco_keypoints`` reads the COCO files),
``evaluation.metrics``, ``evaluation.tasks`` (head + loss + evaluator per task),
``evaluation.probe_trainer`` (one probe head; the Ray Train worker), ``evaluation.spec``
(what the worker is given), ``evaluation.synthetic`` (the
offline probe set) and ``evaluation.lineage`` (checkpoint digest and pretraining run).
"""

from evaluation.config import ProbeConfig
from evaluation.run import ProbeRunResult, run_probes

__all__ = ["ProbeConfig", "ProbeRunResult", "run_probes"]
