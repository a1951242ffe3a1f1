"""Resumable training batches: the batch of step ``s`` is a pure function of (seed, s).

The sample order is an endless stream of epochs, each a permutation of the training set drawn
from (seed, epoch); step ``s`` takes the stream's items ``s*B .. s*B + B - 1`` (B = the global
batch), rank ``r`` of ``W`` the slots ``r, r + W, ...`` of them. Each sample's augmentation is
drawn from a generator seeded with (seed, step, slot). A run resumed at step ``s`` therefore
sees exactly the batches an uninterrupted run saw: no loader state to checkpoint.
"""

from __future__ import annotations

import functools
from functools import partial

import numpy as np
from torch.utils.data import DataLoader, Dataset, Sampler

from evaluation.finetune import augment
from evaluation.finetune.config import AugmentConfig


@functools.lru_cache(maxsize=4)
def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, 7, epoch]).permutation(n)


def step_indices(n: int, global_batch: int, seed: int, step: int) -> list[int]:
    """The ``global_batch`` training-set indices of 0-based ``step``."""
    out = []
    for pos in range(step * global_batch, (step + 1) * global_batch):
        epoch, k = divmod(pos, n)
        out.append(int(epoch_order(n, seed, epoch)[k]))
    return out


class StepBatchSampler(Sampler):
    """Yields this rank's (index, step, slot) keys for steps ``start .. stop - 1``."""

    def __init__(self, n: int, global_batch: int, seed: int, start: int, stop: int, rank: int = 0, world: int = 1):
        self.n, self.global_batch, self.seed = n, global_batch, seed
        self.start, self.stop, self.rank, self.world = start, stop, rank, world

    def __len__(self) -> int:
        return max(0, self.stop - self.start)

    def __iter__(self):
        for step in range(self.start, self.stop):
            idx = step_indices(self.n, self.global_batch, self.seed, step)
            yield [(i, step, slot) for slot, i in enumerate(idx) if slot % self.world == self.rank]


class TrainSet(Dataset):
    """Augmented training items of ``base`` (a probe data set), keyed by (index, step, slot)."""

    def __init__(self, task: str, base, aug: AugmentConfig, vocab, seed: int) -> None:
        self.task, self.base, self.aug, self.vocab, self.seed = task, base, aug, vocab, seed
        self.backgrounds = augment.Backgrounds(aug.backgrounds if aug.enabled else "")
        if task != "pose":
            base.with_image = False  # the augmenter reads the image itself

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, key: tuple[int, int, int]) -> dict:
        i, step, slot = key
        rng = np.random.default_rng([self.seed, step, slot])
        if self.task == "pose":
            return augment.pose_item(self.base, i, rng, self.aug, self.vocab)
        if self.task == "seg":
            return augment.seg_item(self.base, i, rng, self.aug, self.vocab, self.backgrounds)
        return augment.dense_item(self.base, i, rng, self.aug, self.backgrounds)


def train_loader(
    train: TrainSet, *, global_batch: int, seed: int, start: int, stop: int, rank: int, world: int, workers: int
) -> DataLoader:
    sampler = StepBatchSampler(len(train), global_batch, seed, start, stop, rank, world)
    return DataLoader(
        train,
        batch_sampler=sampler,
        num_workers=workers,
        persistent_workers=False,
        worker_init_fn=partial(_quiet_worker) if workers else None,
    )


def _quiet_worker(_: int) -> None:
    import torch

    torch.set_num_threads(1)
