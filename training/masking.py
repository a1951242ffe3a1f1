"""MAE masks for the student's global views: blockwise (BEiT style) or patchwise.

Every mask hides exactly ``round(ratio * P)`` of the P grid patches, so all views of a
batch keep the same number of visible tokens (the backbone's masked forward needs that).
Blockwise masks are rectangles of ``min_block_patches`` to ``max_block_fraction * P``
patches with aspect (h/w) in ``block_aspect``, added until no more fit under the target;
any shortfall is topped up with random single patches. Randomness comes only from the
``numpy.random.Generator`` passed in, so a mask is a pure function of its seed.

Shape legend: P grid patches (h * w); masks are (P,) bool, True = masked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class MaskBlock:
    top: int
    left: int
    height: int
    width: int


class MaskGenerator:
    """``MaskGenerator(grid_hw, ratio=0.75, block_prob=0.4)(rng) -> mask_P``."""

    def __init__(
        self,
        grid_hw: tuple[int, int],
        *,
        ratio: float = 0.75,
        block_prob: float = 0.4,
        min_block_patches: int = 4,
        max_block_fraction: float = 0.5,
        block_aspect: tuple[float, float] = (0.3, 1 / 0.3),
        max_attempts: int = 10,
    ) -> None:
        self.h, self.w = grid_hw
        self.num_patches = self.h * self.w
        self.num_masked = int(round(ratio * self.num_patches))
        if not 0 < self.num_masked < self.num_patches:
            raise ValueError(
                f"mask ratio {ratio} on a {self.h}x{self.w} grid masks {self.num_masked} patches: "
                "it must mask at least one and leave at least one visible"
            )
        self.block_prob = block_prob
        self.min_block = min_block_patches
        self.max_block = max(min_block_patches, int(max_block_fraction * self.num_patches))
        self.log_aspect = (math.log(block_aspect[0]), math.log(block_aspect[1]))
        self.max_attempts = max_attempts

    def __call__(self, rng: np.random.Generator) -> np.ndarray:
        if rng.random() < self.block_prob:
            return self.block_mask(rng)[0]
        return self.patch_mask(rng)

    def patch_mask(self, rng: np.random.Generator) -> np.ndarray:
        mask = np.zeros(self.num_patches, dtype=bool)
        mask[rng.permutation(self.num_patches)[: self.num_masked]] = True
        return mask

    def block_mask(self, rng: np.random.Generator) -> tuple[np.ndarray, list[MaskBlock]]:
        """The mask and the rectangles it was built from (before the random top-up)."""
        grid = np.zeros((self.h, self.w), dtype=bool)
        blocks: list[MaskBlock] = []
        count = 0
        while count < self.num_masked:
            block = self._place_block(rng, grid, self.num_masked - count)
            if block is None:
                break
            grid[block.top : block.top + block.height, block.left : block.left + block.width] = True
            blocks.append(block)
            count = int(grid.sum())
        mask = grid.reshape(-1)
        if count < self.num_masked:  # top up with single patches: the count is exact
            free = np.flatnonzero(~mask)
            mask[rng.choice(free, self.num_masked - count, replace=False)] = True
        return mask, blocks

    def _place_block(self, rng: np.random.Generator, grid: np.ndarray, budget: int) -> MaskBlock | None:
        # BEiT's rule: a block may overlap earlier ones, but only if the cells it adds
        # stay within the remaining budget.
        for _ in range(self.max_attempts):
            area = rng.uniform(self.min_block, min(self.max_block, max(budget, self.min_block)))
            aspect = math.exp(rng.uniform(*self.log_aspect))
            height = int(round(math.sqrt(area * aspect)))
            width = int(round(math.sqrt(area / aspect)))
            if not (1 <= height <= self.h and 1 <= width <= self.w):
                continue
            # Rounding may leave the drawn ranges: such a draw is rejected, so every block
            # obeys the stated area and aspect bounds exactly.
            if not self.min_block <= height * width <= self.max_block:
                continue
            if not self.log_aspect[0] <= math.log(height / width) <= self.log_aspect[1]:
                continue
            top = int(rng.integers(0, self.h - height + 1))
            left = int(rng.integers(0, self.w - width + 1))
            new = height * width - int(grid[top : top + height, left : left + width].sum())
            if 0 < new <= budget:
                return MaskBlock(top, left, height, width)
        return None
