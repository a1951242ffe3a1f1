"""Pre- and post-processing of the released task models, on small handmade inputs."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

from models.sapiens_processing import (
    MEAN_RGB,
    STD_RGB,
    Padding,
    albedo_to_image,
    bbox_center_scale,
    crop_person,
    fix_aspect_ratio,
    flip_back,
    flip_test,
    heatmap_maximum,
    keypoints_to_image,
    metric_pointmap,
    normalize_image,
    normals_to_image,
    pointmap_to_image,
    resize_pad,
    resize_plain,
    seg_labels,
    udp_decode,
    udp_warp_matrix,
    unpad,
    warp_interpolation,
)


def test_normalisation_is_rgb_mean_std_in_0_255_units():
    bgr = np.array([[[0, 0, 255], [10, 20, 30]]], dtype=np.uint8)  # (1, 2, 3): a red pixel, then B10 G20 R30
    x = normalize_image(bgr)
    assert x.shape == (3, 1, 2) and x.dtype == torch.float32
    mean, std = np.float32(MEAN_RGB), np.float32(STD_RGB)
    assert x[:, 0, 0].tolist() == ((np.float32([255, 0, 0]) - mean) / std).tolist()
    assert x[:, 0, 1].tolist() == ((np.float32([30, 20, 10]) - mean) / std).tolist()
    assert torch.equal(normalize_image(bgr[..., ::-1], bgr=False), x)


def test_bbox_padding_and_aspect_fix():
    center, scale = bbox_center_scale((10, 20, 110, 220))
    assert center.tolist() == [60, 120] and scale.tolist() == [125, 250]
    assert fix_aspect_ratio(scale).tolist() == [187.5, 250]  # too narrow: widened to 0.75 * h
    assert fix_aspect_ratio(np.float32([375, 125])).tolist() == [375, 500]  # too wide: heightened to w / 0.75


def test_warp_interpolation_follows_the_scale():
    shrink = udp_warp_matrix(np.float32([500, 500]), np.float32([1535, 2047]), (768, 1024))
    enlarge = udp_warp_matrix(np.float32([50, 50]), np.float32([76.7, 102.3]), (768, 1024))
    assert warp_interpolation(shrink) == cv2.INTER_AREA and warp_interpolation(enlarge) == cv2.INTER_CUBIC


def test_crop_then_decode_conventions_map_a_point_back_to_itself():
    image = np.zeros((300, 200, 3), dtype=np.uint8)
    crop = crop_person(image, (40, 30, 140, 250), input_hw=(256, 192))
    assert crop.image.shape == (256, 192, 3)
    matrix = udp_warp_matrix(crop.center, crop.scale, (192, 256)).astype(np.float64)
    points = np.array([[40.0, 30.0], [97.5, 141.25], [139.0, 249.0]])
    in_crop = points @ matrix[:, :2].T + matrix[:, 2]
    heatmap_px = in_crop * np.array([47 / 191, 63 / 255])  # UDP: heatmap (48x64) corners = crop corners
    as_decoded = heatmap_px / np.array([47, 63]) * np.array([192, 256])  # udp_decode's crop convention
    back = keypoints_to_image(as_decoded[None], crop.center, crop.scale, (192, 256))[0]
    np.testing.assert_allclose(back, points, atol=1e-3)


def test_crop_puts_the_image_where_the_warp_says():
    image = np.zeros((120, 80, 3), dtype=np.uint8)
    image[59:62, 29:32] = 255  # a bright 3x3 square centred on (x, y) = (30, 60)
    crop = crop_person(image, None, input_hw=(256, 192))  # the whole image; enlarging: INTER_CUBIC
    matrix = udp_warp_matrix(crop.center, crop.scale, (192, 256))
    want = matrix[:, :2] @ np.float32([30, 60]) + matrix[:, 2]
    ys, xs = np.nonzero(crop.image[..., 0] > 127)  # the enlarged square
    assert np.abs(np.float32([xs.mean(), ys.mean()]) - want).max() <= 0.5


def test_flip_test_flips_back_and_reorders_channels():
    x = torch.arange(2 * 3 * 2 * 4, dtype=torch.float32).reshape(2, 3, 2, 4)
    flip_indices = [0, 2, 1]
    assert torch.equal(flip_back(x.flip(-1), flip_indices), x[:, [0, 2, 1]])
    assert torch.equal(flip_test(lambda t: t, x, flip_indices), (x + x[:, [0, 2, 1]]) / 2)


def _gaussian(h: int, w: int, x0: float, y0: float, sigma: float = 2.0) -> np.ndarray:
    ys, xs = np.mgrid[0:h, 0:w]
    return np.exp(-((xs - x0) ** 2 + (ys - y0) ** 2) / (2 * sigma**2)).astype(np.float32)


def test_udp_decode_finds_a_known_peak():
    heatmaps = np.stack([_gaussian(64, 48, 12, 40), _gaussian(64, 48, 20.3, 30.6), np.zeros((64, 48), np.float32)])
    keypoints, scores = udp_decode(heatmaps, (192, 256))
    scale = np.array([192 / 47, 256 / 63])
    assert keypoints.shape == (1, 3, 2) and scores.shape == (1, 3)
    np.testing.assert_allclose(keypoints[0, 0], np.array([12, 40]) * scale, atol=1e-4)  # symmetric: no shift
    np.testing.assert_allclose(keypoints[0, 1] / scale, [20.3, 30.6], atol=0.05)  # DARK: sub-pixel
    assert scores[0, 0] == 1.0 and scores[0, 2] == 0.0
    locs, _ = heatmap_maximum(heatmaps)
    assert locs[2].tolist() == [-1, -1]  # no positive maximum


def test_resize_pad_centres_and_unpad_undoes_it():
    image = np.full((100, 50, 3), 200, dtype=np.uint8)
    out, pad = resize_pad(image, (64, 48))
    assert out.shape == (64, 48, 3) and pad == Padding(left=8, right=8, top=0, bottom=0)
    assert (out[:, :8] == 0).all() and (out[:, 8:40] == 200).all() and (out[:, 40:] == 0).all()
    out, pad = resize_pad(np.zeros((30, 40, 3), np.uint8), (64, 48))
    assert pad == Padding(left=0, right=0, top=14, bottom=14)
    x = torch.arange(64 * 48, dtype=torch.float32).reshape(1, 1, 64, 48)
    assert torch.equal(unpad(x, pad), x[..., 14:50, :])


def test_seg_resize_ignores_the_aspect():
    image = np.zeros((100, 60, 3), np.uint8)
    assert resize_plain(image, (64, 48)).shape == (64, 48, 3)
    assert np.array_equal(resize_plain(image, (64, 48)), cv2.resize(image, (48, 64), interpolation=cv2.INTER_AREA))


def test_seg_labels_resize_logits_then_argmax():
    logits = torch.zeros(1, 3, 2, 2)
    logits[0, 0, :, 0] = 5  # left column: class 0
    logits[0, 1, :, 1] = 5  # right column: class 1
    labels = seg_labels(logits, (4, 4))
    assert labels.tolist() == [[[0, 0, 1, 1]] * 4]


def test_normals_are_unit_before_resizing_and_zero_stays_zero():
    normal = torch.zeros(1, 3, 1, 2)
    normal[0, :, 0, 0] = torch.tensor([3.0, 4.0, 0.0])
    out = normals_to_image(normal, (1, 2))
    assert out[0, :, 0, 0].tolist() == pytest.approx([0.6, 0.8, 0.0]) and out[0, :, 0, 1].tolist() == [0, 0, 0]
    padded = torch.ones(1, 3, 4, 4)
    assert normals_to_image(padded, (2, 2), Padding(1, 1, 1, 1)).shape == (1, 3, 2, 2)


def test_metric_pointmap_divides_each_sample_by_its_own_scale():
    pointmap = torch.ones(2, 3, 2, 2)
    scale = torch.tensor([[2.0], [4.0]])
    metric = metric_pointmap(pointmap, scale)
    assert metric[0].unique().tolist() == [0.5] and metric[1].unique().tolist() == [0.25]
    assert pointmap_to_image(pointmap, scale, (8, 8)).shape == (2, 3, 8, 8)
    impulse = torch.zeros(1, 3, 4, 4)
    impulse[..., 1, 1] = 1
    one = torch.ones(1, 1)
    assert not torch.equal(
        pointmap_to_image(impulse, one, (8, 8)), pointmap_to_image(impulse, one, (8, 8), smooth=False)
    )
    assert torch.equal(pointmap_to_image(impulse, one, (2, 2)), pointmap_to_image(impulse, one, (2, 2), smooth=False))


def test_albedo_is_clamped_to_the_unit_range():
    albedo = torch.tensor([-1.0, 0.5, 2.0]).reshape(1, 3, 1, 1)
    assert albedo_to_image(albedo, (1, 1)).flatten().tolist() == [0.0, 0.5, 1.0]
