"""The MAE mask generator: exact ratio, block shapes, the block/patch mix, determinism."""

import math

import numpy as np
import pytest

from training.masking import MaskGenerator


@pytest.mark.parametrize("grid", [(6, 4), (14, 10), (64, 48)])
def test_every_mask_hides_exactly_the_ratio(grid):
    gen = MaskGenerator(grid, ratio=0.75, block_prob=0.4)
    rng = np.random.default_rng(0)
    expected = round(0.75 * grid[0] * grid[1])
    for _ in range(50):
        mask = gen(rng)
        assert mask.dtype == bool and mask.shape == (grid[0] * grid[1],)
        assert mask.sum() == expected
    assert gen.block_mask(rng)[0].sum() == gen.patch_mask(rng).sum() == expected


def test_blocks_are_rectangles_within_the_area_and_aspect_bounds():
    gen = MaskGenerator((14, 10), ratio=0.75, min_block_patches=4, max_block_fraction=0.5, block_aspect=(0.3, 1 / 0.3))
    rng = np.random.default_rng(1)
    for _ in range(30):
        mask, blocks = gen.block_mask(rng)
        grid = mask.reshape(14, 10)
        assert blocks
        for b in blocks:
            assert 4 <= b.height * b.width <= 70
            assert 0.3 - 1e-9 <= b.height / b.width <= 1 / 0.3 + 1e-9
            assert 0 <= b.top and b.top + b.height <= 14 and 0 <= b.left and b.left + b.width <= 10
            assert grid[b.top : b.top + b.height, b.left : b.left + b.width].all()  # blocks are fully masked
        covered = np.zeros((14, 10), dtype=bool)
        for b in blocks:
            covered[b.top : b.top + b.height, b.left : b.left + b.width] = True
        # Blocks never overshoot the target; anything else masked is the single-patch top-up.
        assert covered.sum() <= gen.num_masked and (grid | covered).sum() == grid.sum()


def test_block_masks_are_spatially_coherent_and_patch_masks_are_not():
    gen = MaskGenerator((14, 10), ratio=0.75)
    rng = np.random.default_rng(2)

    def masked_neighbour_fraction(mask):
        g = mask.reshape(14, 10).astype(int)
        pairs = (g[1:] == g[:-1]).sum() + (g[:, 1:] == g[:, :-1]).sum()
        return pairs / (13 * 10 + 14 * 9)

    block = np.mean([masked_neighbour_fraction(gen.block_mask(rng)[0]) for _ in range(20)])
    patch = np.mean([masked_neighbour_fraction(gen.patch_mask(rng)) for _ in range(20)])
    assert block > patch + 0.1


def test_the_mix_is_blockwise_with_probability_block_prob():
    gen = MaskGenerator((14, 10), ratio=0.75, block_prob=0.4)
    kinds = []
    for seed in range(400):
        rng = np.random.default_rng(seed)
        first = rng.random()  # what the generator draws first decides the kind
        kinds.append(first < 0.4)
        rng2 = np.random.default_rng(seed)
        mask = gen(rng2)
        expected = gen.block_mask(_skip_one(seed))[0] if first < 0.4 else gen.patch_mask(_skip_one(seed))
        assert np.array_equal(mask, expected)
    assert 0.33 < np.mean(kinds) < 0.47
    assert all(MaskGenerator((6, 4), block_prob=0.0)(np.random.default_rng(s)).sum() == 18 for s in range(5))


def _skip_one(seed):
    rng = np.random.default_rng(seed)
    rng.random()
    return rng


def test_masks_are_a_pure_function_of_the_seed():
    gen = MaskGenerator((14, 10))
    a = [gen(np.random.default_rng([7, i])) for i in range(10)]
    b = [gen(np.random.default_rng([7, i])) for i in range(10)]
    c = [gen(np.random.default_rng([8, i])) for i in range(10)]
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_impossible_ratios_are_refused():
    with pytest.raises(ValueError, match="at least one visible"):
        MaskGenerator((2, 2), ratio=0.9)
    with pytest.raises(ValueError):
        MaskGenerator((4, 3), ratio=0.01)
    assert math.isclose(MaskGenerator((4, 3), ratio=0.75).num_masked, 9)
