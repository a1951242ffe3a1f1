"""The Sapiens v1 depth target (``evaluation.depth``): per-image min-max normalised foreground
depth, 0 nearest / 1 farthest, -1 background; only pixels with target > eps count."""

from __future__ import annotations

import numpy as np
import torch

from evaluation.depth import DEPTH_EPS, relative_depth_target
from evaluation.losses import silog_loss
from evaluation.metrics import DepthMetrics


def test_min_max_over_the_foreground_with_background_minus_one():
    depth = np.array([[2.0, 3.0, 4.0], [6.0, 100.0, np.nan]])
    valid = np.array([[True, True, True], [True, False, True]])  # 100 is background, NaN is not a depth
    target, counted = relative_depth_target(depth, valid)
    assert target.dtype == np.float32
    np.testing.assert_allclose(target, [[0.0, 0.25, 0.5], [1.0, -1.0, -1.0]])
    # the nearest pixel (0) does not count, as in the reference's SiLog loss (target > eps)
    assert counted.tolist() == [[False, True, True], [True, False, False]]


def test_zero_is_the_nearest_pixel_and_the_map_is_scale_and_shift_invariant():
    rng = np.random.default_rng(0)
    depth = rng.uniform(2.0, 5.0, (6, 5))
    valid = rng.random((6, 5)) > 0.3
    target, counted = relative_depth_target(depth, valid)
    near = np.unravel_index(np.where(valid, depth, np.inf).argmin(), depth.shape)
    far = np.unravel_index(np.where(valid, depth, -np.inf).argmax(), depth.shape)
    assert target[near] == 0.0 and target[far] == 1.0 and not counted[near] and counted[far]
    # the figure's distance is not part of the target: 3x farther plus an offset, same target
    again, counted_again = relative_depth_target(3.0 * depth + 7.0, valid)
    np.testing.assert_allclose(again, target, atol=1e-6)
    assert np.array_equal(counted_again, counted)


def test_a_constant_depth_image_has_no_counted_pixels_and_an_empty_one_is_all_background():
    valid = np.array([[True, False], [True, True]])
    target, counted = relative_depth_target(np.full((2, 2), 3.0), valid)
    assert target.tolist() == [[0.0, -1.0], [0.0, 0.0]] and not counted.any()
    target, counted = relative_depth_target(np.ones((2, 2)), np.zeros((2, 2), bool))
    assert (target == -1).all() and not counted.any()


def test_loss_and_metrics_count_the_same_pixels():
    gt = torch.tensor([[[[0.0, 0.5e-6, 0.5, 1.0]]]])  # the first two are at or under eps
    mask = torch.ones(1, 1, 4, dtype=torch.bool)
    pred = torch.tensor([[[[9.0, 9.0, 0.5, 1.0]]]])  # wrong only where nothing counts
    assert float(silog_loss(pred, gt, mask)) < 1e-5
    m = DepthMetrics()
    m.update(pred.numpy(), gt.numpy(), mask.numpy())
    out = m.compute()
    assert out["rmse"] == 0.0 and out["abs_rel"] == 0.0 and out["delta1"] == 100.0 and m.count == 2
    assert DEPTH_EPS == 1e-6
