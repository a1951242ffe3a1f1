"""docs/scale_plan.md: the figures it computes are recomputed here, so the page cannot drift from
its own formulas or from the model's FLOP counts."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import SHARED
from tests.infra.validation import REPO

DOC = (REPO / "docs" / "scale_plan.md").read_text()

# Forward FLOPs of Sapiens2-5B per view, in TFLOP (checked against count_flops in the slow test).
VIEWS = {
    "full": ((1024, 768), 36.38042068992),
    "masked": ((512, 384), 8.199535939584),
    "local": ((256, 192), 2.05801949184),
}
DECODER = 0.313013846016  # 8 x 512 transformer blocks over 3,081 tokens + the 512 -> 16*16*3 pixel head
ITERATIONS, BATCH, PEAK = 500_000, 4096, 989e12


def per_sample() -> dict[str, float]:
    student_fwd = 2 * VIEWS["masked"][1] + 4 * VIEWS["local"][1] + 2 * DECODER
    teacher = 2 * VIEWS["full"][1]
    return {
        "student_fwd": student_fwd,
        "student": 3 * student_fwd,
        "teacher": teacher,
        "total": 3 * student_fwd + teacher,
    }


def test_tokens_per_image():
    patches = (1024 // 16) * (768 // 16)
    assert patches == 3072 and f"{patches:,} patches" in DOC and f"{patches + 9:,} tokens" in DOC


def test_full_view_flops_match_the_official_backbone():
    reference = json.loads((SHARED / "reference" / "sapiens2_reference.json").read_text())
    assert reference["sapiens2_5b"]["flops_fwd_1x1024x768"] == pytest.approx(VIEWS["full"][1] * 1e12, rel=1e-12)
    assert "| 36.38 TFLOP |" in DOC


def test_per_sample_flops_in_the_doc():
    f = per_sample()
    for view, (_hw, tflop) in VIEWS.items():
        assert f"| {tflop:.2f} TFLOP |" in DOC, view
    assert f"| {DECODER:.2f} TFLOP |" in DOC
    assert f"| {f['student_fwd']:.2f} TFLOP |" in DOC
    assert f"| {f['student']:.2f} TFLOP |" in DOC
    assert f"| {f['teacher']:.2f} TFLOP |" in DOC
    assert f"**{f['total']:.2f} TFLOP** ({f['total'] / VIEWS['full'][1]:.2f} x one full forward)" in DOC


def test_gpu_hours_table_in_the_doc():
    total = ITERATIONS * BATCH * per_sample()["total"] * 1e12
    assert f"**{total / 1e23:.2f} x 10^23 FLOPs**" in DOC
    for mfu in (0.25, 0.33, 0.39):
        gpu_hours = total / (PEAK * mfu) / 3600
        per_gpu = PEAK * mfu / (per_sample()["total"] * 1e12)
        row = f"| {per_gpu:.2f} | {gpu_hours:,.0f} | {gpu_hours / 8:,.0f} | {gpu_hours / 1024 / 24:.1f} |"
        assert row in DOC, row
    half = ITERATIONS * 2048 * per_sample()["total"] * 1e12 / (PEAK * 0.33) / 3600
    assert f"{half:,.0f} GPU-hours at 33% MFU" in DOC


def test_placeholders_name_their_benchmark():
    placeholders = [p for p in re.findall(r"<measured: ([^>]*)>", DOC) if p != "..."]
    assert len(placeholders) >= 6
    for text in placeholders:
        assert re.search(r"benchmarks/\w+\.py|stats\.json|GPU run|per H100", text), text


@pytest.mark.slow
def test_view_flops_are_the_models_count():
    """The per-view FLOPs above, recounted on the meta device (~10 s on 2 cores)."""
    import torch
    from torch import nn
    from torch.utils.flop_counter import FlopCounterMode

    from models.registry import count_flops

    for view, (hw, tflop) in VIEWS.items():
        assert count_flops("sapiens2_5b", hw=hw) == pytest.approx(tflop * 1e12, rel=1e-9), view
    layer = nn.TransformerEncoderLayer(512, 16, 2048, batch_first=True, norm_first=True, dropout=0.0)
    with torch.device("meta"):
        decoder = nn.TransformerEncoder(layer, 8, enable_nested_tensor=False).to("meta")
        x = torch.empty(1, 3081, 512)
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            decoder(x)
    pixel_head = 2 * 3072 * 512 * (16 * 16 * 3)
    assert counter.get_total_flops() + pixel_head == pytest.approx(DECODER * 1e12, rel=1e-9)
