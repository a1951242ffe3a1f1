"""Streaming WebDataset shards into multi-crop, masked training batches, resumably.

The stream is split into *slots*: ``world_size * max(1, loader_workers)`` independent
readers, one per DataLoader worker of every rank. In each epoch the shards are put in a
seeded order; with at least as many shards as slots, slot ``s`` reads shards
``order[s::slots]``, otherwise every slot reads every shard and keeps the samples whose
index in the epoch is ``s`` modulo the number of slots. A slot passes its samples (raw
bytes) through a shuffle buffer: once the buffer is full, each incoming sample replaces a
seeded random entry, which is emitted. Epochs follow one another without draining.

Sampling (``data.sampling``, ``training.sampling``). With a policy other than ``uniform``, a
slot that opens a shard reads the acceptance probability of each of its samples from the
shard's sidecar and keeps a sample only when a stateless draw from (seed, epoch, key) falls
below it; a rejected sample's bytes are never read, and the buffer, the draws and the views
work on the kept samples as they would on all. ``uniform`` reads no sidecar: the stream is the
one this module made before policies existed, batch for batch.

Resumable position. A slot's whole state is small and JSON-able: epoch, shard cursor,
byte offset of the next tar header, counters, and the buffer's entries as *references*
(shard, key, byte offset and size of each member), never their bytes. Restoring re-reads
the buffered members by offset. Every sample's augmentation and masks are drawn from a
generator seeded by (seed, slot, draw counter), so after a restart the next batches are
exactly those an uninterrupted run would have produced.

Loader workers each emit whole batches together with their state after that batch;
``ResumableLoader`` keeps the state of the last batch it *handed out* per worker
(prefetched batches are not counted) and rotates the list on save so that the worker
whose batch comes next becomes worker 0 of the restarted DataLoader, whose round-robin
order then continues where the old one stopped.

Shapes (a ``Batch``, B samples, G global and L local views, crop-major):
``global_crops`` (G*B, 3, H, W), ``local_crops`` (L*B, 3, h, w), ``masks`` (G*B, P) bool
(True = masked), row ``g * B + b`` being view ``g`` of sample ``b``.
"""

from __future__ import annotations

import json
import logging
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from curation.output import split_member
from infra import storage
from training.augment import MultiCrop
from training.config import CropConfig, DataConfig, MaskingConfig, PretrainConfig
from training.masking import MaskGenerator
from training.sampling import Sampler, accepted, mix64, sampler_of

log = logging.getLogger(__name__)

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")


def open_shard(uri: str):
    fs, path = storage.resolve(uri)
    if storage.is_local(fs):
        return open(path, "rb")
    return fs.open_input_file(path)


# --------------------------------------------------------------------------- one slot


@dataclass
class SlotState:
    """Position of one slot; ``buffer`` entries are [shard, key, [[ext, offset, size], ...]].
    ``offered`` / ``accepted``: this slot's image samples read and kept by the sampling policy."""

    slot: int
    num_slots: int
    num_shards: int
    epoch: int = 0
    shard_pos: int = 0
    offset: int = 0
    sample_index: int = 0
    draws: int = 0
    buffer: list = field(default_factory=list)
    offered: int = 0
    accepted: int = 0

    def to_dict(self) -> dict:
        """A snapshot. The buffer list is copied: a DataLoader worker pickles its batches in
        a feeder thread while it goes on filling the live buffer. (Entries are replaced,
        never mutated, so a shallow copy suffices.)"""
        return {**{k: getattr(self, k) for k in self.__dataclass_fields__}, "buffer": list(self.buffer)}

    @classmethod
    def from_dict(cls, d: dict) -> SlotState:
        return cls(**{**d, "buffer": [list(e) for e in d["buffer"]]})


class Read(NamedTuple):
    """One sample as a slot reads it: ``chance`` None when it is another slot's or has no image
    (not offered), else its acceptance probability; ``kept``: offered and accepted (only then
    are its bytes in ``blobs``)."""

    entry: list
    blobs: dict[str, bytes]
    next_offset: int
    chance: float | None
    kept: bool


class ShardStream:
    """One slot's endless, shuffled stream of ``(key, {ext: bytes}, draw)`` samples.

    ``draw`` is the sample's index in the slot's output (the seed of its augmentation).
    ``state`` (a ``SlotState``) is current at every yield. ``sampler``: the sampling policy
    (None: every sample, ``uniform``).
    """

    def __init__(
        self,
        shards: tuple[str, ...],
        state: SlotState,
        *,
        seed: int,
        buffer_size: int,
        sampler: Sampler | None = None,
    ) -> None:
        if state.num_shards != len(shards):
            raise ValueError(f"loader state is for {state.num_shards} shards, the dataset has {len(shards)}")
        self.shards, self.state, self.seed, self.buffer_size = shards, state, seed, buffer_size
        self.sampler = sampler

    def epoch_shards(self, epoch: int) -> tuple[list[int], bool]:
        """This slot's shards for ``epoch`` and whether it splits them by sample."""
        s = self.state
        order = np.random.default_rng([self.seed, epoch, 0x5EED]).permutation(s.num_shards).tolist()
        if s.num_shards >= s.num_slots:
            return order[s.slot :: s.num_slots], False
        return order, True

    def __iter__(self) -> Iterator[tuple[str, dict[str, bytes], int]]:
        s = self.state
        # The buffer holds bytes; the state holds references. Refill from the references.
        data = [self._read_ref(entry) for entry in s.buffer]
        empty_epochs = 0
        while True:
            shards, by_sample = self.epoch_shards(s.epoch)
            drawable = offered = False  # an offered sample with a chance > 0 / any offered sample
            while s.shard_pos < len(shards):
                shard = shards[s.shard_pos]
                for r in self._read_shard(shard, s.offset, by_sample, s.sample_index, s.epoch):
                    s.offset = r.next_offset
                    s.sample_index += 1
                    if r.chance is None:
                        continue
                    s.offered += 1
                    offered, drawable = True, drawable or r.chance > 0
                    if not r.kept:
                        continue
                    s.accepted += 1
                    if len(s.buffer) < self.buffer_size:
                        s.buffer.append(r.entry)
                        data.append(r.blobs)
                        continue
                    i = mix64(self.seed, s.slot, s.draws) % self.buffer_size
                    out_entry, out = s.buffer[i], data[i]
                    s.buffer[i], data[i] = r.entry, r.blobs
                    s.draws += 1
                    yield out_entry[1], out, s.draws - 1
                s.shard_pos += 1
                s.offset = 0
            s.epoch += 1
            s.shard_pos = 0
            s.sample_index = 0
            empty_epochs = 0 if drawable else empty_epochs + 1
            if empty_epochs >= 2 and not s.buffer:
                self._nothing_to_draw(offered)

    def _nothing_to_draw(self, offered: bool) -> None:
        s = self.state
        if offered:
            policy = self.sampler.cfg.policy if self.sampler else "uniform"
            raise ValueError(
                f"data.sampling.policy={policy} gives every image sample of slot {s.slot} of {s.num_slots} "
                "probability 0: loosen data.sampling.filter (or the weight's clip)"
            )
        raise ValueError(f"slot {s.slot} of {s.num_slots} found no image samples in {len(self.shards)} shards")

    def epoch_keys(self, epoch: int) -> Iterator[str]:
        """The keys this slot reads in ``epoch``, in reading order (before the shuffle buffer)."""
        shards, by_sample = self.epoch_shards(epoch)
        index = 0
        for shard in shards:
            for r in self._read_shard(shard, 0, by_sample, index, epoch):
                index += 1
                if r.kept:
                    yield r.entry[1]

    def _read_shard(self, shard: int, start: int, by_sample: bool, first_index: int, epoch: int) -> Iterator[Read]:
        """Each sample (``Read``) from byte ``start``, the first having index ``first_index`` in
        ``epoch``; a sample's bytes are read only when it is this slot's and accepted."""
        s = self.state
        index = first_index - 1
        chances = self.sampler.chances(self.shards[shard]) if self.sampler else None
        with open_shard(self.shards[shard]) as f:
            f.seek(start)
            tar = tarfile.open(fileobj=f, mode="r:")
            key, members, blobs, mine, keep, chance = None, [], {}, True, True, 1.0
            for m in iter(tar.next, None):
                parsed = split_member(m.name) if m.isfile() else None
                if parsed is None:
                    continue
                k, ext = parsed
                if key is not None and k != key:
                    yield _read([shard, key, members], blobs, m.offset, mine, keep, chance)
                    key, members, blobs = None, [], {}
                if key is None:
                    key = k
                    index += 1
                    mine = not by_sample or index % s.num_slots == s.slot
                    chance = self._chance(chances, key, shard) if mine else 0.0
                    keep = mine and accepted(self.seed, epoch, key, chance)
                members.append([ext, m.offset_data, m.size])
                if keep:
                    blobs[ext] = tar.extractfile(m).read()
            if key is not None:
                yield _read([shard, key, members], blobs, tar.offset, mine, keep, chance)

    def _chance(self, chances: dict[str, float] | None, key: str, shard: int) -> float:
        if chances is None:
            return 1.0
        if key not in chances:
            raise ValueError(f"sample {key!r} of shard {self.shards[shard]} has no row in the shard's sidecar")
        return chances[key]

    def _read_ref(self, entry: list) -> dict[str, bytes]:
        shard, _, members = entry
        out = {}
        with open_shard(self.shards[shard]) as f:
            for ext, offset, size in members:
                f.seek(offset)
                out[ext] = f.read(size)
        return out


def _read(entry: list, blobs: dict[str, bytes], next_offset: int, mine: bool, keep: bool, chance: float) -> Read:
    """A finished sample: offered when it is this slot's and has an image member."""
    image = any(ext in IMAGE_EXTS for ext, _, _ in entry[2])
    offered = mine and image
    return Read(entry, blobs, next_offset, chance if offered else None, keep and image)


# --------------------------------------------------------------------------- batches


@dataclass
class Batch:
    global_crops: torch.Tensor
    local_crops: torch.Tensor
    masks: torch.Tensor
    keys: list[str]
    state: dict | None = None

    @property
    def size(self) -> int:
        return len(self.keys)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        return Batch(
            self.global_crops.to(device, non_blocking=non_blocking),
            self.local_crops.to(device, non_blocking=non_blocking),
            self.masks.to(device, non_blocking=non_blocking),
            self.keys,
            self.state,
        )

    def pin_memory(self) -> Batch:
        return Batch(
            self.global_crops.pin_memory(),
            self.local_crops.pin_memory(),
            self.masks.pin_memory(),
            self.keys,
            self.state,
        )


def _identity(x):
    return x


def _worker_init(_worker_id: int) -> None:
    torch.set_num_threads(1)  # decode/augment processes must not compete with training for cores


@dataclass(frozen=True, kw_only=True)
class RankSpec:
    """What one rank's loader makes (the stream settings come from ``DataConfig``): its place
    among ``world_size`` ranks, batches of ``batch_size`` samples cropped and masked for a
    model of patch size ``patch_stride``, draws seeded by ``seed``."""

    rank: int
    world_size: int
    batch_size: int
    crops: CropConfig
    masking: MaskingConfig
    patch_stride: int
    seed: int
    pin_memory: bool = False

    @classmethod
    def of(
        cls, cfg: PretrainConfig, *, rank: int, world_size: int, patch_stride: int, pin_memory: bool = False
    ) -> RankSpec:
        return cls(
            rank=rank,
            world_size=world_size,
            batch_size=cfg.batch_size_per_worker,
            crops=cfg.crops,
            masking=cfg.masking,
            patch_stride=patch_stride,
            seed=cfg.seed,
            pin_memory=pin_memory,
        )


class BatchStream(IterableDataset):
    """Batches of one rank. Each loader worker (or the process itself with 0 workers)
    plays the slot whose state ``states[worker_id]`` holds."""

    def __init__(
        self,
        shards: tuple[str, ...],
        states: list[SlotState],
        spec: RankSpec,
        *,
        buffer_size: int,
        sampler: Sampler | None = None,
    ) -> None:
        super().__init__()
        self.shards, self.states, self.sampler = shards, states, sampler
        self.batch_size, self.seed, self.buffer_size = spec.batch_size, spec.seed, buffer_size
        self.crops = spec.crops
        h, w = spec.crops.global_size
        self.grid_hw = (h // spec.patch_stride, w // spec.patch_stride)
        self.masking = spec.masking

    def __iter__(self) -> Iterator[Batch]:
        info = get_worker_info()
        state = SlotState.from_dict(self.states[info.id if info else 0].to_dict())
        stream = iter(
            ShardStream(self.shards, state, seed=self.seed, buffer_size=self.buffer_size, sampler=self.sampler)
        )
        make_views = MultiCrop(self.crops)
        m = self.masking
        masker = MaskGenerator(
            self.grid_hw,
            ratio=m.ratio,
            block_prob=m.block_prob,
            min_block_patches=m.min_block_patches,
            max_block_fraction=m.max_block_fraction,
            block_aspect=m.block_aspect,
        )
        while True:
            globals_, locals_, masks, keys = [], [], [], []
            while len(keys) < self.batch_size:
                key, blobs, draw = next(stream)
                rng = np.random.default_rng([self.seed, state.slot, draw])
                image = next(blobs[ext] for ext in IMAGE_EXTS if ext in blobs)
                try:
                    g, l_ = make_views(image, rng)
                except OSError as err:  # curated shards hold decodable images; say which one is not
                    raise ValueError(f"sample {key!r} (slot {state.slot}) does not decode: {err}") from err
                globals_.append(g)
                locals_.append(l_)
                masks.append(torch.from_numpy(np.stack([masker(rng) for _ in range(len(g))])))
                keys.append(key)
            yield Batch(
                global_crops=torch.stack(globals_, 1).flatten(0, 1),
                local_crops=torch.stack(locals_, 1).flatten(0, 1),
                masks=torch.stack(masks, 1).flatten(0, 1),
                keys=keys,
                state=state.to_dict(),
            )


def fresh_states(num_shards: int, *, rank: int, world_size: int, loader_workers: int) -> list[SlotState]:
    per_rank = max(1, loader_workers)
    return [
        SlotState(slot=rank * per_rank + w, num_slots=world_size * per_rank, num_shards=num_shards)
        for w in range(per_rank)
    ]


def _restart(state: dict | None, num_shards: int, spec: RankSpec, loader_workers: int) -> list[SlotState]:
    """Fresh slot states; after a ``state`` saved for another layout, at the epoch after its last."""
    world_size = spec.world_size
    if state is not None:
        log.warning(
            "data position was saved for %s ranks x %s loader workers, this run has %s x %s: "
            "the stream restarts at a new epoch (the exact sample order cannot carry over)",
            state["world_size"],
            state["loader_workers"],
            world_size,
            loader_workers,
        )
    states = fresh_states(num_shards, rank=spec.rank, world_size=world_size, loader_workers=loader_workers)
    if state is not None:
        next_epoch = 1 + max(s["epoch"] for s in state["slots"])
        for s in states:
            s.epoch = next_epoch
    return states


class ResumableLoader:
    """Iterates a rank's ``BatchStream`` through a DataLoader and knows its position.

    ``state_dict()`` -> ``{"world_size", "loader_workers", "consumed", "slots"}``; give it
    back as ``state`` to continue exactly after the last batch this loader handed out.
    ``dataset_uri``: the version's folder, whose sidecars a sampling policy reads (not needed
    for ``uniform``).
    """

    def __init__(
        self,
        shards: tuple[str, ...],
        data: DataConfig,
        spec: RankSpec,
        *,
        state: dict | None = None,
        dataset_uri: str | None = None,
    ) -> None:
        if not shards:
            raise ValueError("the dataset version has no shards")
        self.sampler = sampler_of(data.sampling, dataset_uri)
        world_size, loader_workers = spec.world_size, data.loader_workers
        self.world_size, self.loader_workers = world_size, loader_workers
        self.consumed = 0
        if state is not None and (state["world_size"], state["loader_workers"]) == (world_size, loader_workers):
            self.states = [SlotState.from_dict(s) for s in state["slots"]]
            self.consumed = state["consumed"]
        else:
            self.states = _restart(state, len(shards), spec, loader_workers)
        self.dataset = BatchStream(
            tuple(shards), self.states, spec, buffer_size=data.shuffle_buffer, sampler=self.sampler
        )
        kwargs = {}
        if loader_workers > 0:
            kwargs = dict(
                num_workers=loader_workers,
                prefetch_factor=data.prefetch_factor,
                persistent_workers=False,
                multiprocessing_context=data.mp_context,
                worker_init_fn=_worker_init,
            )
        self.loader = DataLoader(
            self.dataset, batch_size=None, collate_fn=_identity, pin_memory=spec.pin_memory, **kwargs
        )
        self._iter: Iterator[Batch] | None = None
        self._handed = 0  # batches handed out since this loader started (worker = _handed % workers)

    def __iter__(self) -> ResumableLoader:
        return self

    def __next__(self) -> Batch:
        if self._iter is None:
            self._iter = iter(self.loader)
        batch = next(self._iter)
        worker = self._handed % len(self.states)
        self.states[worker] = SlotState.from_dict(batch.state)
        self._handed += 1
        self.consumed += 1
        return batch

    def metrics(self) -> dict[str, float]:
        """``data_acceptance``: the share of the image samples this rank's slots read that the
        sampling policy kept, as of the last batch handed out (nothing for ``uniform``)."""
        offered = sum(s.offered for s in self.states)
        if self.sampler is None or not offered:
            return {}
        return {"data_acceptance": sum(s.accepted for s in self.states) / offered}

    def state_dict(self) -> dict:
        n = len(self.states)
        rotated = [self.states[(self._handed + i) % n].to_dict() for i in range(n)]
        return {
            "world_size": self.world_size,
            "loader_workers": self.loader_workers,
            "consumed": self.consumed,
            "slots": rotated,
        }

    def close(self) -> None:
        self._iter = None  # ends the worker processes

    @staticmethod
    def dumps(state: dict) -> str:
        return json.dumps(state, separators=(",", ":"))
