"""The shard stream: split across ranks and loader workers, shuffled, and resumable to
the exact batch."""

import logging

import pytest
import torch

from tests.training.conftest import write_shards
from training.config import CropConfig, DataConfig, MaskingConfig
from training.data import RankSpec, ResumableLoader, ShardStream, SlotState, fresh_states

CROPS = CropConfig(global_size=(32, 32), local_size=(16, 16), num_global=2, num_local=2)
MASKING = MaskingConfig()


def loader(shards, *, rank=0, world=1, workers=2, buffer=4, state=None, seed=0):
    spec = RankSpec(rank=rank, world_size=world, batch_size=3, crops=CROPS, masking=MASKING, patch_stride=16, seed=seed)
    return ResumableLoader(tuple(shards), DataConfig(loader_workers=workers, shuffle_buffer=buffer), spec, state=state)


def take(it, n):
    return [next(it) for _ in range(n)]


def assert_same_batches(a, b):
    assert [x.keys for x in a] == [y.keys for y in b]
    for x, y in zip(a, b):
        assert torch.equal(x.global_crops, y.global_crops)
        assert torch.equal(x.local_crops, y.local_crops)
        assert torch.equal(x.masks, y.masks)


@pytest.mark.parametrize("rank,world", [(0, 1), (1, 2)])  # (1, 2): 4 slots > 3 shards -> split by sample
@pytest.mark.parametrize("stop", [1, 4])
def test_resumed_loader_continues_with_exactly_the_next_batches(synthetic_shards, rank, world, stop):
    reference = loader(synthetic_shards, rank=rank, world=world)
    expected = take(reference, stop + 5)
    reference.close()

    first = loader(synthetic_shards, rank=rank, world=world)
    assert_same_batches(take(first, stop), expected[:stop])
    state = first.state_dict()
    first.close()  # prefetched-but-unused batches die with the workers
    assert state["consumed"] == stop and len(state["slots"]) == 2

    resumed = loader(synthetic_shards, rank=rank, world=world, state=state)
    assert_same_batches(take(resumed, 5), expected[stop:])
    resumed.close()


def test_resume_works_without_loader_workers(synthetic_shards):
    expected = take(loader(synthetic_shards, workers=0), 6)
    first = loader(synthetic_shards, workers=0)
    take(first, 2)
    assert_same_batches(take(loader(synthetic_shards, workers=0, state=first.state_dict()), 4), expected[2:])


@pytest.mark.parametrize("world,workers", [(1, 2), (2, 2), (3, 1)])
def test_each_epoch_gives_every_sample_to_exactly_one_slot(synthetic_shards, world, workers):
    all_keys = []
    for rank in range(world):
        for state in fresh_states(3, rank=rank, world_size=world, loader_workers=workers):
            stream = ShardStream(tuple(synthetic_shards), state, seed=0, buffer_size=4)
            all_keys += list(stream.epoch_keys(0))
    assert len(all_keys) == 16 and len(set(all_keys)) == 16


def test_shard_order_changes_between_epochs_and_the_buffer_shuffles(synthetic_shards):
    state = fresh_states(3, rank=0, world_size=1, loader_workers=0)[0]
    stream = ShardStream(tuple(synthetic_shards), state, seed=0, buffer_size=4)
    orders = {tuple(stream.epoch_keys(e)) for e in range(6)}
    assert len(orders) > 1 and all(sorted(o) == sorted(next(iter(orders))) for o in orders)
    read_order = list(stream.epoch_keys(0))
    emitted = [key for key, _, _ in (next(it) for it in [iter(stream)] for _ in range(12))]
    assert sorted(emitted) != emitted and emitted != read_order[4:16]
    assert set(emitted) <= set(read_order)


def test_slot_state_is_small_and_holds_references_not_bytes(synthetic_shards):
    it = loader(synthetic_shards, workers=0, buffer=4)
    take(it, 3)
    state = it.state_dict()
    slot = state["slots"][0]
    assert len(slot["buffer"]) == 4
    shard, key, members = slot["buffer"][0]
    assert isinstance(key, str) and {m[0] for m in members} == {"jpg", "json"}
    assert len(ResumableLoader.dumps(state)) < 2000


def test_a_changed_world_size_restarts_at_a_new_epoch_with_a_warning(synthetic_shards, caplog):
    first = loader(synthetic_shards, workers=0)
    take(first, 2)
    with caplog.at_level(logging.WARNING):
        other = loader(synthetic_shards, world=2, workers=0, state=first.state_dict())
    assert "restarts at a new epoch" in caplog.text
    assert all(s.epoch == 1 for s in other.states)


def test_a_mismatched_shard_count_is_refused(synthetic_shards):
    state = SlotState(slot=0, num_slots=1, num_shards=5)
    with pytest.raises(ValueError, match="5 shards"):
        ShardStream(tuple(synthetic_shards), state, seed=0, buffer_size=2)


def test_shards_without_images_are_reported(tmp_path):
    import io
    import tarfile

    path = tmp_path / "empty.tar"
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo("a.json")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"{}"))
    state = fresh_states(1, rank=0, world_size=1, loader_workers=0)[0]
    with pytest.raises(ValueError, match="no image samples"):
        next(iter(ShardStream((str(path),), state, seed=0, buffer_size=2)))


def test_batches_are_view_major_with_exact_masks(synthetic_shards):
    batch = next(loader(synthetic_shards, workers=0))
    assert batch.global_crops.shape == (2 * 3, 3, 32, 32) and batch.local_crops.shape == (2 * 3, 3, 16, 16)
    assert batch.masks.shape == (6, 4) and (batch.masks.sum(1) == 3).all()
    assert len(set(batch.keys)) == 3
    # Rows b and B + b are the two global views of sample b: different crops of one picture.
    assert not torch.equal(batch.global_crops[0], batch.global_crops[3])


def test_write_shards_layout(tmp_path):
    import tarfile

    (path,) = write_shards(tmp_path, [2])
    with tarfile.open(path) as tar:
        assert tar.getnames() == ["s0_img000.jpg", "s0_img000.json", "s0_img001.jpg", "s0_img001.json"]
