"""``init``: a run starting from weight files (no Ray here; ``test_pretrain_init`` runs one).

The backbone files are the official module's own weights of the reference parity vectors
(``sapiens2_tiny``, group ``plain``) in the released layout, a sparse file with the official
``sapiens2_0.4b`` keys and shapes, and the v1 parity weights in the released pretrain layout."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from models.registry import build_backbone
from pipelines.pretrain import main as pretrain_main
from tests.training.conftest import reference_file, released_tiny_backbone, shaped_zeros_file, tiny_config
from training import checkpoint
from training.init import check_backbone_file, check_weight_files, initialise, weight_digest, weight_digests
from training.meta_arch import MAEMetaArch, SSLMetaArch
from training.optim import build_optimizer
from training.run import _check_resumable
from training.stage import PretrainStage

ONE_LINE_04B = "file holds a sapiens2_0.4b backbone (dim 1024, 24 blocks); model is sapiens2_tiny (dim 64, 18 blocks)"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("init-files")
    return {
        "plain": released_tiny_backbone(folder / "sapiens2_tiny.safetensors"),
        "prefixed": released_tiny_backbone(folder / "task_like.safetensors", prefix="backbone."),
        "0.4b": shaped_zeros_file(folder / "sapiens2_0.4b.safetensors", "sapiens2_0.4b"),
    }


def fresh(cfg):
    torch.manual_seed(cfg.seed)
    return SSLMetaArch(cfg)


@pytest.mark.parametrize("kind", ["plain", "prefixed"])
def test_a_released_backbone_starts_student_and_teacher(files, kind):
    cfg = tiny_config(f"init.backbone={files[kind]}", "data.dataset=v")
    check_weight_files(cfg, resuming=False)
    arch = fresh(cfg)
    before = {k: v.clone() for k, v in arch.student.state_dict().items()}
    initialise(arch, cfg)
    arch.materialize_teacher("cpu")
    released = {k.removeprefix("backbone."): v for k, v in load_file(files[kind]).items()}
    for role in ("student", "teacher"):
        state = getattr(arch, role)["backbone"].state_dict()
        assert state.keys() == released.keys() and all(torch.equal(state[k], released[k]) for k in released), role
    # the heads the file does not hold start as a run without init starts them
    after = arch.student.state_dict()
    heads = [k for k in before if not k.startswith("backbone.")]
    assert heads and all(torch.equal(before[k], after[k]) for k in heads)


def test_a_file_of_another_size_is_refused_in_one_line_before_any_work(files, tmp_path, capsys):
    with pytest.raises(ValueError) as err:
        check_backbone_file("init.backbone", str(files["0.4b"]), "sapiens2_tiny")
    assert str(err.value) == f"init.backbone={files['0.4b']}: {ONE_LINE_04B}"
    # through the entry point: exit 2, one line, before the dataset is even looked up
    args = ["--config", "configs/pretrain_tiny.yaml", f"init.backbone={files['0.4b']}"]
    assert pretrain_main([*args, f"storage_path={tmp_path}", "data.dataset=no-such-version"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"error: init.backbone={files['0.4b'].resolve()}: {ONE_LINE_04B}"]


def test_a_file_of_another_family_or_with_other_keys_is_refused_in_one_line(files, tmp_path):
    v1 = load_file(reference_file("sapiens1_parity_tiny.safetensors"))
    save_file(
        {k.removeprefix("model/"): v for k, v in v1.items() if k.startswith("model/")}, tmp_path / "v1.safetensors"
    )
    held = r"file holds a sapiens_tiny backbone \(dim 64, 4 blocks\); model is sapiens2_tiny"
    with pytest.raises(ValueError, match=rf"^init.backbone=.*v1.safetensors: {held}") as err:
        check_backbone_file("init.backbone", str(tmp_path / "v1.safetensors"), "sapiens2_tiny")
    assert "\n" not in str(err.value)
    state = load_file(files["plain"])
    del state["blocks.3.attn.wq.weight"]
    state["blocks.0.extra"] = torch.zeros(1)
    save_file(state, tmp_path / "edited.safetensors")
    with pytest.raises(ValueError) as err:
        check_backbone_file("init.backbone", str(tmp_path / "edited.safetensors"), "sapiens2_tiny")
    assert str(err.value).endswith(
        "1 keys missing (blocks.3.attn.wq.weight); 1 unexpected keys (blocks.0.extra) for sapiens2_tiny"
    )
    with pytest.raises(ValueError, match=r"^init.backbone='/no/such.safetensors': no such file$"):
        check_backbone_file("init.backbone", "/no/such.safetensors", "sapiens2_tiny")


def test_a_v1_pretrain_file_starts_the_mae_student_with_its_table_resized(tmp_path):
    v1 = load_file(reference_file("sapiens1_parity_tiny.safetensors"))
    path = tmp_path / "sapiens_tiny_clean.safetensors"
    save_file({k.removeprefix("model/"): v for k, v in v1.items() if k.startswith("model/")}, path)
    cfg = tiny_config(
        "model=sapiens_tiny", "crops.num_global=1", "crops.num_local=0", f"init.backbone={path}", "data.dataset=v"
    )
    check_weight_files(cfg, resuming=False)
    torch.manual_seed(0)
    arch = MAEMetaArch(cfg)
    initialise(arch, cfg)
    # the released load path itself: CLS kept, the 4x4 table bicubic-resized to the 6x4 grid of 96x64 crops
    want = build_backbone(arch.student["backbone"].config, weights=path).state_dict()
    got = arch.student["backbone"].state_dict()
    assert got["pos_embed"].shape == (1, 1 + 6 * 4, 64)
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_heads_start_from_a_platform_checkpoint_and_are_checked_first(files, tmp_path):
    cfg = tiny_config("data.dataset=v")
    trained = fresh(cfg)
    for p in trained.student.parameters():  # heads unlike any fresh init
        p.data.add_(0.5)
    trained.materialize_teacher("cpu")
    optimizer = build_optimizer(trained.student, cfg.optim)
    checkpoint.save(tmp_path / "ckpt", trained, optimizer, step=3, rank=0, data_state={})
    cfg_heads = tiny_config(f"init.heads={tmp_path / 'ckpt'}", f"init.backbone={files['plain']}", "data.dataset=v")
    check_weight_files(cfg_heads, resuming=False)
    arch = fresh(cfg_heads)
    initialise(arch, cfg_heads)
    got, want = arch.student.state_dict(), trained.student.state_dict()
    heads = [k for k in want if not k.startswith("backbone.")]
    assert all(torch.equal(got[k], want[k]) for k in heads)
    assert torch.equal(got["backbone.ln1.weight"], load_file(files["plain"])["ln1.weight"])  # not the checkpoint's
    # a run whose MAE decoder is another shape is refused before any work, in one line
    other = tiny_config(f"init.heads={tmp_path / 'ckpt'}", "decoder.depth=3", "data.dataset=v")
    with pytest.raises(ValueError, match=r"^init.heads=.*: \d+ keys missing \(student.mae_decoder.blocks.2.") as err:
        check_weight_files(other, resuming=False)
    assert "\n" not in str(err.value)
    # a resumed run reads neither file, so neither is checked then
    check_weight_files(other, resuming=True)


def test_weight_files_enter_identities_by_content_not_path(files, tmp_path):
    moved = shutil.copy(files["plain"], tmp_path / "elsewhere.safetensors")
    base = tiny_config("data.dataset=v")
    a, b = (tiny_config(f"init.backbone={f}", "data.dataset=v") for f in (files["plain"], moved))
    other = tiny_config(f"init.backbone={files['prefixed']}", "data.dataset=v")
    stage = PretrainStage()
    assert stage.identity(a, "d") == stage.identity(b, "d") != stage.identity(other, "d")
    assert stage.identity(a, "d") != stage.identity(base, "d")
    # without init the stage identity is the one recorded before init existed (the same recipe)
    from infra.stage import stage_digest
    from training.config import identity_digest

    assert stage.identity(base, "d") == stage_digest("pretrain", identity_digest(base), "d")
    # a folder's digest is its files' names and contents, not where it lies
    (tmp_path / "f1" / "sub").mkdir(parents=True)
    (tmp_path / "f1" / "sub" / "x").write_bytes(b"1")
    shutil.copytree(tmp_path / "f1", tmp_path / "f2")
    assert weight_digest(tmp_path / "f1") == weight_digest(tmp_path / "f2")
    (tmp_path / "f2" / "sub" / "x").write_bytes(b"2")
    assert weight_digest(tmp_path / "f1") != weight_digest(tmp_path / "f2")


def test_a_resumed_run_must_read_the_content_it_started_from(files):
    from training.config import identity_digest

    cfg = tiny_config(f"init.backbone={files['plain']}", "data.dataset=v")
    started = weight_digests(cfg)
    record = {"identity_digest": identity_digest(cfg), "identity": {}, "dataset": {"id": "d"}, "weights": started}
    _check_resumable(cfg, record, identity_digest(cfg), "d", started)
    other = weight_digests(tiny_config(f"init.backbone={files['prefixed']}", "data.dataset=v"))
    with pytest.raises(ValueError, match=r"^init.backbone: run '' started from a file of sha256 [0-9a-f]{64}, this"):
        _check_resumable(cfg, record, identity_digest(cfg), "d", other)
    # an init file that is gone is not read by a resumed run: its recorded digest stands
    gone = tiny_config("init.backbone=/no/longer/there.safetensors", "data.dataset=v")
    assert weight_digests(gone, recorded=started) == started
    with pytest.raises(ValueError, match="no such file"):
        weight_digests(gone)
