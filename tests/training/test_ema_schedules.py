"""The EMA teacher update and the per-step schedules."""

import math

import pytest
import torch
from torch import nn

from tests.training.conftest import tiny_config
from training.ema import copy_params, update_ema
from training.schedules import cosine, values_at, warmup_cosine


def test_ema_update_is_m_teacher_plus_one_minus_m_student():
    teacher = [torch.tensor([1.0, 2.0]), torch.tensor([[4.0]])]
    student = [torch.tensor([3.0, 0.0]), torch.tensor([[0.0]])]
    update_ema(teacher, student, 0.9)
    torch.testing.assert_close(teacher[0], torch.tensor([0.9 * 1 + 0.1 * 3, 0.9 * 2]))
    torch.testing.assert_close(teacher[1], torch.tensor([[3.6]]))
    assert torch.equal(student[0], torch.tensor([3.0, 0.0]))  # the student is untouched


def test_ema_with_momentum_one_leaves_the_teacher_and_zero_copies_the_student():
    teacher, student = [torch.tensor([1.0])], [torch.tensor([5.0])]
    update_ema(teacher, student, 1.0)
    assert teacher[0].item() == 1.0
    update_ema(teacher, student, 0.0)
    assert teacher[0].item() == 5.0


def test_ema_refuses_mismatched_parameter_lists():
    with pytest.raises(ValueError):
        update_ema([torch.zeros(2)], [torch.zeros(3)], 0.5)


def test_copy_params_copies_parameters_and_buffers():
    a, b = nn.BatchNorm1d(3), nn.BatchNorm1d(3)
    with torch.no_grad():
        a.weight.fill_(2.0)
        a.running_mean.fill_(7.0)
    copy_params(b, a)
    assert torch.equal(b.weight, a.weight) and torch.equal(b.running_mean, a.running_mean)


def test_teacher_momentum_rises_from_0992_to_one():
    cfg = tiny_config("steps=101")
    m = [values_at(cfg, s).momentum for s in range(101)]
    assert m[0] == pytest.approx(0.992) and m[-1] == pytest.approx(1.0)
    assert all(b >= a for a, b in zip(m, m[1:]))
    assert m[50] == pytest.approx(0.996)


def test_learning_rate_warms_up_linearly_then_follows_a_cosine():
    lrs = [warmup_cosine(s, total=20, warmup=5, peak=1.0, final=0.1) for s in range(20)]
    assert lrs[:5] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    assert lrs[5] == pytest.approx(1.0) and lrs[-1] == pytest.approx(0.1)
    assert all(b <= a for a, b in zip(lrs[5:], lrs[6:]))
    assert cosine(5, 10, 1.0, 0.0) == pytest.approx(0.5)


def test_teacher_temperature_warms_up():
    cfg = tiny_config("loss.teacher_temp_warmup_steps=10", "loss.warmup_teacher_temp=0.04", "loss.teacher_temp=0.07")
    assert values_at(cfg, 0).teacher_temp == pytest.approx(0.04)
    assert values_at(cfg, 5).teacher_temp == pytest.approx(0.055)
    assert values_at(cfg, 10).teacher_temp == pytest.approx(0.07)
    assert (
        values_at(cfg, 0).freeze_last_layer and not values_at(cfg, cfg.loss.freeze_last_layer_steps).freeze_last_layer
    )
    assert math.isfinite(values_at(cfg, 10**6).lr)
