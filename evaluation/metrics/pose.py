"""Keypoint metrics: OKS, and COCO keypoint AP/AR through pycocotools.

OKS (COCO): ``mean_i exp(-d_i^2 / (2 s^2 k_i^2))`` over the labelled keypoints (v > 0),
with ``s^2`` the object area and ``k_i = 2 sigma_i``. AP/AR are pycocotools' own numbers
(``COCOeval(..., "keypoints")`` with ``params.kpt_oks_sigmas`` set to the data set's sigmas).
"""

from __future__ import annotations

import builtins
import contextlib
import copy

import numpy as np

from models.vocab import keypoint_vocab, list_vocabs

# COCO-17 (pycocotools' defaults) and COCO-WholeBody-133 (jin-s13/COCO-WholeBody), from the
# vocabulary files (models/vocab/*.json); every set with known sigmas by its keypoint count.
COCO17_SIGMAS = keypoint_vocab("coco_17").sigmas
WHOLEBODY133_SIGMAS = keypoint_vocab("coco_wholebody_133").sigmas
KNOWN_SIGMAS = {keypoint_vocab(n).num_keypoints: keypoint_vocab(n).sigmas for n in list_vocabs("keypoints")}

# pycocotools' keypoint summary, in its order (no "small" range for keypoints).
COCO_KEYPOINT_STATS = ("AP", "AP50", "AP75", "APm", "APl", "AR", "AR50", "AR75", "ARm", "ARl")


def oks(gt_K3: np.ndarray, area: float, pred_K2: np.ndarray, sigmas_K: np.ndarray) -> float:
    """Object keypoint similarity of one prediction to one ground truth with labelled keypoints."""
    gt_K3, pred_K2, sigmas_K = np.asarray(gt_K3, float), np.asarray(pred_K2, float), np.asarray(sigmas_K, float)
    visible = gt_K3[:, 2] > 0
    if not visible.any():
        raise ValueError("OKS needs at least one labelled keypoint (v > 0)")
    d2 = ((pred_K2[:, :2] - gt_K3[:, :2]) ** 2).sum(axis=1)
    e = d2 / (2 * (2 * sigmas_K) ** 2 * (area + np.spacing(1)))
    return float(np.exp(-e[visible]).mean())


def coco_keypoint_ap(gt: dict, results: list[dict], sigmas: np.ndarray | list[float]) -> dict[str, float]:
    """pycocotools keypoint AP/AR of ``results`` (COCO result dicts: image_id, category_id,
    keypoints [x, y, v] * K, score) against the COCO ``gt`` dict. A range without any ground
    truth (pycocotools' -1) is left out. No results at all scores 0."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    if not results:
        return {name: 0.0 for name in ("AP", "AP50", "AP75", "AR", "AR50", "AR75")}
    with _quiet():
        coco_gt = COCO()
        coco_gt.dataset = copy.deepcopy(gt)
        coco_gt.createIndex()
        # loadRes fills area/bbox/id into the dicts it gets: give it copies.
        coco_dt = coco_gt.loadRes(copy.deepcopy(results))
        ev = COCOeval(coco_gt, coco_dt, "keypoints")
        ev.params.kpt_oks_sigmas = np.asarray(sigmas, dtype=float)
        ev.params.imgIds = sorted(coco_gt.getImgIds())
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return {name: float(v) for name, v in zip(COCO_KEYPOINT_STATS, ev.stats) if v > -1}


@contextlib.contextmanager
def _quiet():
    """Silence pycocotools' progress prints (Ray Train re-routes ``print`` to its logger,
    so redirecting stdout alone is not enough)."""
    saved = builtins.print
    builtins.print = lambda *args, **kwargs: None
    try:
        yield
    finally:
        builtins.print = saved
