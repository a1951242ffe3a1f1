"""Streaming WebDataset shards into multi-crop, masked training batches, resumably.

The stream is split into *slots*: ``world_size * max(1, loader_workers)`` independent
readers, one per DataLoader worker of every rank. In each epoch the shards are put in a
seeded order; with at least as many shards as slots, slot ``s`` reads shards
``order[s::slots]``, otherwise every slot reads every shard and keeps the samples whose
index in the epoch is ``s`` modulo the number of slots. A slot passes its samples (raw
bytes) through a shuffle buffer: once the buffer is full, each incoming sample replaces a
seeded random entry, which is emitted. Epochs follow one another without draining.

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

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from curation.output import split_member
from infra import storage
from training.augment import MultiCrop
from training.config import CropConfig, DataConfig, MaskingConfig, PretrainConfig
from training.masking import MaskGenerator

log = logging.getLogger(__name__)

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")
_MASK64 = (1 << 64) - 1


def mix64(*values: int) -> int:
    """A stateless 64-bit hash of integers (splitmix64 steps): seeded draws without RNG state."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (v & _MASK64)) & _MASK64
        h = (h + 0x9E3779B97F4A7C15) & _MASK64
        z = h
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        h = z ^ (z >> 31)
    return h


def open_shard(uri: str):
    fs, path = storage.resolve(uri)
    if storage.is_local(fs):
        return open(path, "rb")
    return fs.open_input_file(path)


# --------------------------------------------------------------------------- one slot


@dataclass
class SlotState:
    """Position of one slot; ``buffer`` entries are [shard, key, [[ext, offset, size], ...]]."""

    slot: int
    num_slots: int
    num_shards: int
    epoch: int = 0
    shard_pos: int = 0
    offset: int = 0
    sample_index: int = 0
    draws: int = 0
    buffer: list = field(default_factory=list)

    def to_dict(self) -> dict:
        """A snapshot. The buffer list is copied: a DataLoader worker pickles its batches in
        a feeder thread while it goes on filling the live buffer. (Entries are replaced,
        never mutated, so a shallow copy suffices.)"""
        return {**{k: getattr(self, k) for k in self.__dataclass_fields__}, "buffer": list(self.buffer)}

    @classmethod
    def from_dict(cls, d: dict) -> SlotState:
        return cls(**{**d, "buffer": [list(e) for e in d["buffer"]]})


class ShardStream:
    """One slot's endless, shuffled stream of ``(key, {ext: bytes}, draw)`` samples.

    ``draw`` is the sample's index in the slot's output (the seed of its augmentation).
    ``state`` (a ``SlotState``) is current at every yield.
    """

    def __init__(self, shards: tuple[str, ...], state: SlotState, *, seed: int, buffer_size: int) -> None:
        if state.num_shards != len(shards):
            raise ValueError(f"loader state is for {state.num_shards} shards, the dataset has {len(shards)}")
        self.shards, self.state, self.seed, self.buffer_size = shards, state, seed, buffer_size

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
            got_any = False
            while s.shard_pos < len(shards):
                shard = shards[s.shard_pos]
                for entry, sample, next_offset, keep in self._read_shard(shard, s.offset, by_sample, s.sample_index):
                    s.offset = next_offset
                    s.sample_index += 1
                    if not keep:
                        continue
                    got_any = True
                    if len(s.buffer) < self.buffer_size:
                        s.buffer.append(entry)
                        data.append(sample)
                        continue
                    i = mix64(self.seed, s.slot, s.draws) % self.buffer_size
                    out_entry, out = s.buffer[i], data[i]
                    s.buffer[i], data[i] = entry, sample
                    s.draws += 1
                    yield out_entry[1], out, s.draws - 1
                s.shard_pos += 1
                s.offset = 0
            s.epoch += 1
            s.shard_pos = 0
            s.sample_index = 0
            empty_epochs = 0 if got_any else empty_epochs + 1
            if empty_epochs >= 2 and not s.buffer:
                raise ValueError(f"slot {s.slot} of {s.num_slots} found no image samples in {len(self.shards)} shards")

    def epoch_keys(self, epoch: int) -> Iterator[str]:
        """The keys this slot reads in ``epoch``, in reading order (before the shuffle buffer)."""
        shards, by_sample = self.epoch_shards(epoch)
        index = 0
        for shard in shards:
            for entry, _, _, keep in self._read_shard(shard, 0, by_sample, index):
                index += 1
                if keep:
                    yield entry[1]

    def _read_shard(self, shard: int, start: int, by_sample: bool, first_index: int):
        """``(entry, {ext: bytes}, offset of the next sample, keep)`` per sample from byte
        ``start``, the first sample having index ``first_index`` in the epoch."""
        s = self.state
        index = first_index - 1
        with open_shard(self.shards[shard]) as f:
            f.seek(start)
            tar = tarfile.open(fileobj=f, mode="r:")
            key, members, blobs, keep = None, [], {}, True
            for m in iter(tar.next, None):
                parsed = split_member(m.name) if m.isfile() else None
                if parsed is None:
                    continue
                k, ext = parsed
                if key is not None and k != key:
                    yield [shard, key, members], blobs, m.offset, keep and _has_image(blobs)
                    key, members, blobs = None, [], {}
                if key is None:
                    key = k
                    index += 1
                    keep = not by_sample or index % s.num_slots == s.slot
                members.append([ext, m.offset_data, m.size])
                if keep:
                    blobs[ext] = tar.extractfile(m).read()
            if key is not None:
                yield [shard, key, members], blobs, tar.offset, keep and _has_image(blobs)

    def _read_ref(self, entry: list) -> dict[str, bytes]:
        shard, _, members = entry
        out = {}
        with open_shard(self.shards[shard]) as f:
            for ext, offset, size in members:
                f.seek(offset)
                out[ext] = f.read(size)
        return out


def _has_image(blobs: dict[str, bytes]) -> bool:
    return any(ext in blobs for ext in IMAGE_EXTS)


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

    def __init__(self, shards: tuple[str, ...], states: list[SlotState], spec: RankSpec, *, buffer_size: int) -> None:
        super().__init__()
        self.shards, self.states = shards, states
        self.batch_size, self.seed, self.buffer_size = spec.batch_size, spec.seed, buffer_size
        self.crops = spec.crops
        h, w = spec.crops.global_size
        self.grid_hw = (h // spec.patch_stride, w // spec.patch_stride)
        self.masking = spec.masking

    def __iter__(self) -> Iterator[Batch]:
        info = get_worker_info()
        state = SlotState.from_dict(self.states[info.id if info else 0].to_dict())
        stream = iter(ShardStream(self.shards, state, seed=self.seed, buffer_size=self.buffer_size))
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


class ResumableLoader:
    """Iterates a rank's ``BatchStream`` through a DataLoader and knows its position.

    ``state_dict()`` -> ``{"world_size", "loader_workers", "consumed", "slots"}``; give it
    back as ``state`` to continue exactly after the last batch this loader handed out.
    """

    def __init__(self, shards: tuple[str, ...], data: DataConfig, spec: RankSpec, *, state: dict | None = None) -> None:
        if not shards:
            raise ValueError("the dataset version has no shards")
        world_size, loader_workers = spec.world_size, data.loader_workers
        self.world_size, self.loader_workers = world_size, loader_workers
        self.consumed = 0
        if state is not None and (state["world_size"], state["loader_workers"]) == (world_size, loader_workers):
            self.states = [SlotState.from_dict(s) for s in state["slots"]]
            self.consumed = state["consumed"]
        else:
            if state is not None:
                log.warning(
                    "data position was saved for %s ranks x %s loader workers, this run has %s x %s: "
                    "the stream restarts at a new epoch (the exact sample order cannot carry over)",
                    state["world_size"],
                    state["loader_workers"],
                    world_size,
                    loader_workers,
                )
            self.states = fresh_states(
                len(shards), rank=spec.rank, world_size=world_size, loader_workers=loader_workers
            )
            if state is not None:
                next_epoch = 1 + max(s["epoch"] for s in state["slots"])
                for s in self.states:
                    s.epoch = next_epoch
        self.dataset = BatchStream(tuple(shards), self.states, spec, buffer_size=data.shuffle_buffer)
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
