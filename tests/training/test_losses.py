"""Each loss against values worked out by hand on small tensors."""

import math

import pytest
import torch
import torch.nn.functional as F

from models.pretrain_heads import normalized_pixel_targets
from training.losses import DINOLoss, KoLeoLoss, MAELoss

# ----------------------------------------------------------------------------- MAE


def test_mae_loss_of_a_zero_prediction_is_one_per_masked_patch():
    images = torch.rand(2, 3, 32, 32)
    masked = torch.tensor([[True, False, True, False], [False, False, False, True]])
    loss = MAELoss(16)(torch.zeros(2, 4, 768), images, masked)
    # normalised targets have unit variance per patch: mean squared value 1 (up to eps)
    torch.testing.assert_close(loss, torch.tensor(1.0), rtol=0, atol=1e-4)


def test_mae_loss_counts_masked_patches_only():
    torch.manual_seed(0)
    images = torch.rand(1, 3, 32, 32)
    targets = normalized_pixel_targets(images, 16)
    masked = torch.tensor([[True, False, False, True]])
    pred = targets.clone()
    pred[0, 0] += 1.0  # masked: error 1 per pixel value
    pred[0, 3] += 2.0  # masked: error 4 per pixel value
    pred[0, 1] += 100.0  # visible: must not count
    loss = MAELoss(16)(pred, images, masked)
    torch.testing.assert_close(loss, torch.tensor((1.0 + 4.0) / 2), rtol=0, atol=1e-5)
    summed = MAELoss(16, pixel_reduction="sum")(pred, images, masked)
    torch.testing.assert_close(summed, torch.tensor((768 * 1.0 + 768 * 4.0) / 2), rtol=1e-5, atol=0)


def test_mae_loss_without_norm_pix_uses_raw_pixels():
    images = torch.full((1, 3, 16, 16), 0.5)
    loss = MAELoss(16, norm_pix=False)(torch.zeros(1, 1, 768), images, torch.tensor([[True]]))
    torch.testing.assert_close(loss, torch.tensor(0.25))


# ----------------------------------------------------------------------------- KoLeo


def test_koleo_of_orthonormal_points():
    # Each of 3 orthonormal vectors has its nearest neighbour at distance sqrt(2).
    loss = KoLeoLoss()(torch.eye(3) * 5.0)  # scale does not matter: features are normalised
    torch.testing.assert_close(loss, torch.tensor(-math.log(math.sqrt(2))), rtol=0, atol=1e-6)


def test_koleo_uses_the_nearest_neighbour():
    x = torch.tensor([[1.0, 0.0], [math.cos(0.1), math.sin(0.1)], [-1.0, 0.0]])
    # neighbours: 0<->1 at chord 2 sin(0.05); 2 -> 1 (angle pi - 0.1): chord 2 cos(0.05)
    d01, d21 = 2 * math.sin(0.05), 2 * math.cos(0.05)
    expected = -(math.log(d01) * 2 + math.log(d21)) / 3
    torch.testing.assert_close(KoLeoLoss()(x), torch.tensor(expected), rtol=1e-5, atol=1e-6)


def test_koleo_pushes_close_points_apart():
    x = torch.tensor([[1.0, 0.0], [1.0, 0.05], [0.0, 1.0]], requires_grad=True)
    KoLeoLoss()(x).backward()
    assert x.grad[1, 1] < 0  # moving point 1 away from point 0 lowers the loss (gradient descent raises y)


# ----------------------------------------------------------------------------- DINO


def test_dino_loss_pairs_each_teacher_view_with_every_other_student_view():
    K = 4
    loss_fn = DINOLoss(K, student_temp=1.0)
    s = [torch.randn(2, K) for _ in range(4)]  # 2 global + 2 local views
    p = [F.softmax(torch.randn(2, K), -1) for _ in range(2)]
    expected, pairs = 0.0, 0
    for i in range(2):
        for j in range(4):
            if i != j:
                expected += (-(p[i] * F.log_softmax(s[j], -1)).sum(-1)).mean()
                pairs += 1
    assert pairs == 6
    torch.testing.assert_close(loss_fn(s, p), expected / pairs)


def test_dino_loss_known_value_uniform_teacher():
    # A uniform teacher against any student logits that are equal across prototypes: CE = log K.
    K = 8
    loss = DINOLoss(K)([torch.zeros(3, K)] * 3, [torch.full((3, K), 1 / K)] * 2)
    torch.testing.assert_close(loss, torch.tensor(math.log(K)))


def test_teacher_probs_are_centred_and_sharpened():
    loss_fn = DINOLoss(3)
    loss_fn.center.copy_(torch.tensor([[1.0, 0.0, 0.0]]))
    probs = loss_fn.teacher_probs(torch.tensor([[1.0, 0.0, math.log(2)]]), teacher_temp=1.0)
    # centred logits [0, 0, log 2] -> probabilities [1, 1, 2] / 4
    torch.testing.assert_close(probs, torch.tensor([[0.25, 0.25, 0.5]]))
    sharp = loss_fn.teacher_probs(torch.tensor([[1.0, 0.0, math.log(2)]]), teacher_temp=0.5)
    torch.testing.assert_close(sharp, torch.tensor([[1 / 6, 1 / 6, 4 / 6]]))


def test_center_is_an_ema_of_the_teacher_batch_mean():
    loss_fn = DINOLoss(2, center_momentum=0.9)
    loss_fn.update_center(torch.tensor([[1.0, 3.0], [3.0, 5.0]]))
    torch.testing.assert_close(loss_fn.center, torch.tensor([[0.2, 0.4]]))
    loss_fn.update_center(torch.tensor([[1.0, 3.0], [3.0, 5.0]]))
    torch.testing.assert_close(loss_fn.center, torch.tensor([[0.38, 0.76]]))
    assert "center" in loss_fn.state_dict()  # checkpointed with the model


def test_dino_loss_needs_pairs():
    with pytest.raises(ValueError):
        DINOLoss(2)([torch.zeros(1, 2)], [torch.full((1, 2), 0.5)])
