"""Top-down geometry: box crops, UDP heatmap encoding and its decoding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from evaluation.heatmaps import apply_affine, box_to_affine, decode_heatmaps, encode_heatmaps, invert_affine


def test_padded_box_just_fits_the_crop():
    # A 20 x 80 (w x h) box grown by 1.25 is 25 x 100: its height limits the scale,
    # 127 / 100, so it spans the crop's rows 0..127, centred on the crop's centre.
    M = box_to_affine([10, 20, 20, 80], (128, 96), padding=1.25)
    centre = apply_affine(M, np.array([[20.0, 60.0]]))
    np.testing.assert_allclose(centre, [[47.5, 63.5]])
    top, bottom = apply_affine(M, np.array([[20.0, 60 - 50.0], [20.0, 60 + 50.0]]))
    np.testing.assert_allclose([top[1], bottom[1]], [0, 127], atol=1e-9)
    np.testing.assert_allclose(apply_affine(invert_affine(M), centre), [[20.0, 60.0]])


@pytest.mark.parametrize("xy", [(10.0, 20.0), (33.3, 71.9), (0.4, 126.2)])
def test_encode_then_decode_recovers_subpixel_keypoints(xy):
    target, weight = encode_heatmaps(np.array([xy]), np.array([True]), (128, 96), (32, 24), sigma=1.5)
    assert target.shape == (1, 32, 24) and weight.tolist() == [1.0]
    decoded, score = decode_heatmaps(torch.from_numpy(target)[None], (128, 96))
    # DARK is exact for a Gaussian peak away from the border; at the border the arg-max is kept.
    tol = 1e-3 if 1 < xy[0] * 23 / 95 < 22 else 4 * 95 / 23 / 2
    np.testing.assert_allclose(decoded[0, 0].numpy(), xy, atol=tol)
    assert 0.7 < float(score[0, 0]) <= 1.0


def test_unlabelled_and_outside_keypoints_weigh_nothing():
    xy = np.array([[10.0, 10.0], [10.0, 10.0], [200.0, 10.0]])
    target, weight = encode_heatmaps(xy, np.array([True, False, True]), (128, 96), (32, 24), sigma=2.0)
    assert weight.tolist() == [1.0, 0.0, 0.0]
    assert target[1].max() == 0 and target[2].max() == 0 and target[0].max() > 0.5
