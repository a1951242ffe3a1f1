"""Output shapes and output contracts of every probing head."""

import pytest
import torch

from models import build_task_head

B, C, h, w = 2, 64, 4, 3


@pytest.mark.parametrize("num_keypoints", [17, 133, 308])
def test_pose_heatmaps_at_stride_4(num_keypoints):
    out = build_task_head("pose", C, num_keypoints=num_keypoints, hidden_dim=32)(torch.randn(B, C, h, w))
    assert out["heatmaps"].shape == (B, num_keypoints, 4 * h, 4 * w)


def test_segmentation_logits_29_classes_by_default():
    out = build_task_head("seg", C, hidden_dim=32)(torch.randn(B, C, h, w))
    assert out["logits"].shape == (B, 29, 4 * h, 4 * w)


def test_pointmap_xyz_at_full_resolution_and_positive_scale():
    out = build_task_head("pointmap", C, hidden_dim=32)(torch.randn(B, C, h, w))
    assert out["xyz"].shape == (B, 3, 16 * h, 16 * w)
    assert out["scale"].shape == (B, 1) and (out["scale"] > 0).all()


def test_normals_are_unit_vectors():
    normal = build_task_head("normal", C, hidden_dim=32)(torch.randn(B, C, h, w))["normal"]
    assert normal.shape == (B, 3, 16 * h, 16 * w)
    torch.testing.assert_close(normal.norm(dim=1), torch.ones(B, 16 * h, 16 * w))


def test_albedo_rgb_at_full_resolution():
    out = build_task_head("albedo", C, hidden_dim=32)(torch.randn(B, C, h, w))
    assert out["albedo"].shape == (B, 3, 16 * h, 16 * w)


def test_depth_positive_at_full_resolution():
    out = build_task_head("depth", C, hidden_dim=32)(torch.randn(B, C, h, w))
    assert out["depth"].shape == (B, 1, 16 * h, 16 * w) and (out["depth"] > 0).all()


def test_feature_lists_are_concatenated_and_4k_stride_upsamples_64x():
    head = build_task_head("normal", 2 * C, hidden_dim=32, upsample=64)
    out = head([torch.randn(1, C, 2, 2), torch.randn(1, C, 2, 2)])
    assert out["normal"].shape == (1, 3, 128, 128)


def test_bad_head_arguments():
    with pytest.raises(ValueError, match="unknown task"):
        build_task_head("mesh", C)
    with pytest.raises(ValueError, match="power of two"):
        build_task_head("albedo", C, upsample=12)
    with pytest.raises(ValueError, match="num_keypoints"):
        build_task_head("pose", C, num_keypoints=0)
