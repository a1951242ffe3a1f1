"""Multi-crop views: shapes, no colour change on global views, box rules, determinism."""

import io

import numpy as np
import pytest
import torch
from PIL import Image

from training.augment import MEAN, STD, MultiCrop, decode_for, random_resized_box
from training.config import CropConfig

CFG = CropConfig(global_size=(96, 64), local_size=(48, 32), num_global=2, num_local=4)


def jpeg(pixels: np.ndarray, quality=95) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def photo(h=300, w=200, seed=0) -> bytes:
    rng = np.random.default_rng(seed)
    small = (rng.random((h // 10, w // 10, 3)) * 255).astype(np.uint8)
    return jpeg(np.asarray(Image.fromarray(small).resize((w, h), Image.Resampling.BILINEAR)))


def test_views_have_the_configured_shapes_and_normalisation():
    g, l_ = MultiCrop(CFG)(photo(), np.random.default_rng(0))
    assert g.shape == (2, 3, 96, 64) and l_.shape == (4, 3, 48, 32)
    assert g.dtype == torch.float32
    lo = (0 - torch.tensor(MEAN)) / torch.tensor(STD)
    hi = (1 - torch.tensor(MEAN)) / torch.tensor(STD)
    assert (g.amin(dim=(0, 2, 3)) >= lo - 1e-5).all() and (g.amax(dim=(0, 2, 3)) <= hi + 1e-5).all()


def test_global_views_carry_no_colour_jitter_and_local_views_do():
    cfg = CropConfig(
        global_size=(96, 64),
        local_size=(48, 32),
        local_jitter_prob=1.0,
        local_grayscale_prob=0.0,
        local_blur_prob=0.0,
        brightness=0.4,
    )
    crop = MultiCrop(cfg)
    globals_, locals_ = crop.plan(np.random.default_rng(0), 200, 300)
    assert all(p.color is None for p in globals_)
    assert all(p.color is not None and p.color.order for p in locals_)
    # A flat orange picture: every global view is exactly that colour, the jittered locals are not.
    flat = np.zeros((300, 200, 3), dtype=np.uint8)
    flat[...] = (200, 120, 40)
    data = io.BytesIO()
    Image.fromarray(flat).save(data, format="PNG")
    g, l_ = crop(data.getvalue(), np.random.default_rng(0))
    expected = (torch.tensor([200, 120, 40]) / 255.0 - torch.tensor(MEAN)) / torch.tensor(STD)
    torch.testing.assert_close(g, expected.view(1, 3, 1, 1).expand_as(g), rtol=0, atol=1e-6)
    assert all((v - expected.view(3, 1, 1)).abs().max() > 0.01 for v in l_)


def test_local_grayscale_gives_equal_channels():
    cfg = CropConfig(
        global_size=(96, 64), local_size=(48, 32), local_jitter_prob=0.0, local_grayscale_prob=1.0, local_blur_prob=0.0
    )
    _, l_ = MultiCrop(cfg)(photo(), np.random.default_rng(3))
    pixels = l_ * torch.tensor(STD).view(1, 3, 1, 1) + torch.tensor(MEAN).view(1, 3, 1, 1)
    torch.testing.assert_close(pixels[:, 0], pixels[:, 1], rtol=0, atol=1e-5)


@pytest.mark.parametrize("scale", [(0.32, 1.0), (0.05, 0.32)])
def test_random_resized_boxes_respect_scale_ratio_and_bounds(scale):
    rng = np.random.default_rng(0)
    for _ in range(200):
        left, top, right, bottom = random_resized_box(rng, 200, 300, scale, (0.75 * 2 / 3, 4 / 3 * 2 / 3))
        w, h = right - left, bottom - top
        assert 0 <= left and right <= 200 + 1e-9 and 0 <= top and bottom <= 300 + 1e-9
        frac = w * h / (200 * 300)
        if frac < 1 - 1e-9:  # not the centred fallback
            assert scale[0] - 1e-9 <= frac <= scale[1] + 1e-9
            assert 0.5 - 1e-9 <= w / h <= 8 / 9 + 1e-9


def test_views_are_a_pure_function_of_the_seed():
    crop, data = MultiCrop(CFG), photo()
    a, b, c = (crop(data, np.random.default_rng(s)) for s in (5, 5, 6))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_large_jpegs_are_decoded_at_reduced_scale():
    data = photo(h=1600, w=1200)
    crop = MultiCrop(CFG)
    globals_, locals_ = crop.plan(np.random.default_rng(0), 1200, 1600)
    image, sx, sy = decode_for(Image.open(io.BytesIO(data)), globals_ + locals_)
    assert sx < 1 and sy < 1 and image.mode == "RGB"
    # ... and each crop still has at least its output resolution.
    for p in globals_ + locals_:
        assert (p.box[2] - p.box[0]) * sx >= p.out_hw[1] - 1e-6 and (p.box[3] - p.box[1]) * sy >= p.out_hw[0] - 1e-6
