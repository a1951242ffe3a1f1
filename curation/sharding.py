"""Shards of one size with sources mixed: where each kept sample goes, as a pure function.

With ``shards.samples_per_shard = N`` the run's K kept samples are numbered in one global
order (partitions by id, each partition's kept keys sorted: ``first_numbers`` gives each
partition's first number from the kept counts of the partitions before it) and a seeded
bijection of ``[0, K)`` (``permute``) turns a sample's number into its rank in a shuffled
run; rank ``r`` goes to shard ``r // N`` at position ``r % N``. So every shard but the last
holds exactly N samples, drawn from all over the run, and each read task places its own
partition's samples knowing only its first number, K, N and the seed: nothing corpus-sized is
gathered anywhere, and the same kept set, N and seed give the same layout on any cluster.
The samples then travel to their shard in one Ray Data shuffle (``curation.writer``).

``permute`` is a balanced Feistel network (6 rounds, splitmix64 as the round function) on
the smallest even number of bits covering K, restricted to ``[0, K)`` by cycle walking (a
value outside is permuted again until it falls inside; the result is still a bijection, and
the domain is under 4K, so fewer than 4 walks are expected).
"""

from __future__ import annotations

import dataclasses

import numpy as np

ROUNDS = 6
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise on uint64 (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _round_keys(seed: int) -> list[np.uint64]:
    return [_mix(np.array([seed * ROUNDS + r], np.uint64))[0] for r in range(ROUNDS)]


def _feistel(x: np.ndarray, half_bits: int, keys: list[np.uint64]) -> np.ndarray:
    half, mask = np.uint64(half_bits), np.uint64((1 << half_bits) - 1)
    left, right = x >> half, x & mask
    for key in keys:
        left, right = right, left ^ (_mix(right ^ key) & mask)
    return (left << half) | right


def permute(index: np.ndarray, total: int, seed: int) -> np.ndarray:
    """The images of ``index`` (values in ``[0, total)``) under the seeded bijection of ``[0, total)``."""
    if total < 1:
        return np.zeros(0, np.uint64)
    half_bits = max(1, ((total - 1).bit_length() + 1) // 2)
    keys = _round_keys(seed)
    out = _feistel(np.asarray(index, np.uint64), half_bits, keys)
    outside = out >= np.uint64(total)
    while outside.any():
        out[outside] = _feistel(out[outside], half_bits, keys)
        outside = out >= np.uint64(total)
    return out


@dataclasses.dataclass(frozen=True)
class Layout:
    """The shards of a run of ``total`` kept samples, ``samples_per_shard`` each (the last: the rest)."""

    samples_per_shard: int
    total: int
    seed: int = 0

    @property
    def num_shards(self) -> int:
        return -(-self.total // self.samples_per_shard)

    def size(self, shard: int) -> int:
        return min(self.samples_per_shard, self.total - shard * self.samples_per_shard)

    def stem(self, shard: int) -> str:
        """The shard's file name without extension: its index, zero-padded so names sort in index order."""
        return f"{shard:0{max(6, len(str(max(0, self.num_shards - 1))))}d}"

    def place(self, first: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """(shard, position in the shard) of the samples numbered ``first .. first + count - 1``."""
        rank = permute(np.arange(first, first + count, dtype=np.uint64), self.total, self.seed).astype(np.int64)
        return rank // self.samples_per_shard, rank % self.samples_per_shard


def first_numbers(kept: dict[str, int]) -> dict[str, int]:
    """Each partition's first sample number, from the kept count of every partition (by id)."""
    out, n = {}, 0
    for pid in sorted(kept):
        out[pid], n = n, n + kept[pid]
    return out
