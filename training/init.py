"""Weight files a run reads: where a new run starts from (``init.backbone``, ``init.heads``) and a
distillation's frozen teacher (``teacher.checkpoint``).

On the driver, before any Ray work:

- ``check_weight_files(cfg, resuming=...)``: every file the run will read exists and fits. A
  backbone file is recognised by its keys (with or without a ``backbone.`` prefix); another
  family or size is refused in one line saying what the file holds, then its keys and shapes are
  checked strictly against the model (one line again). A heads checkpoint (a platform DCP folder)
  must hold every student head the run trains, at the model's shapes. A resumed run takes its
  state from its own checkpoint and never reads ``init`` again, so those are not checked then.
- ``weight_digests(cfg, recorded=...)``: each file's sha256 by setting (a folder: of its files'
  names and contents), what the run's identity, name, record and MLflow params carry. A resumed
  run whose ``init`` file is gone keeps the digest it recorded.

On each worker, before sharding: ``initialise(arch, cfg)`` loads ``init.backbone`` into the
student backbone (the EMA teacher is then materialised from the student) and ``init.heads``
into the student's other modules.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import torch
from torch import nn

from models.io import StateDictMismatchError, weight_shapes
from models.registry import (
    BackboneConfig,
    backbone_prefix,
    build_backbone,
    check_weights_file,
    describe_weights,
    family_of,
    get_config,
)
from training.checkpoint import sha256_file
from training.config import TrainConfig

RESUME_OPTIONAL = ("init.backbone", "init.heads")  # read by a new run only


def local_file(setting: str, path: str, *, folder: bool = False) -> Path:
    """``path`` as an existing local file (or folder); a one-line ``ValueError`` naming ``setting`` if not."""
    if "://" in path:
        raise ValueError(f"{setting}={path!r}: weights are read from a local (or mounted) path, not a URI")
    p = Path(path).expanduser()
    if not (p.is_dir() if folder else p.is_file()):
        raise ValueError(f"{setting}={path!r}: no such {'folder' if folder else 'file'}")
    return p


def _dims(dim: int | None, depth: int, tokenizer: bool) -> str:
    return f"dim {dim}, {depth} blocks{', 4K tokenizer' if tokenizer else ''}"


def check_backbone_file(setting: str, path: str, name: str, config: BackboneConfig | None = None) -> None:
    """Family, size, keys and shapes of the backbone file ``path`` against model ``name``
    (``config``: its exact configuration, default the registry's), from the file's header only."""
    config = config or get_config(name)
    file = local_file(setting, path)
    shapes = weight_shapes(file)
    prefix = backbone_prefix(shapes)
    state = {k[len(prefix) :]: torch.empty(s, device="meta") for k, s in shapes.items() if k.startswith(prefix)}
    seen = describe_weights(state)
    tokenizer = bool(getattr(config, "use_tokenizer", False))
    if seen is None:
        raise ValueError(f"{setting}={path}: the file holds no Sapiens backbone keys; model is {name}")
    if (seen.family, seen.embed_dim, seen.depth, seen.tokenizer) != (
        family_of(config),
        config.embed_dim,
        config.depth,
        tokenizer,
    ):
        held = _dims(seen.embed_dim, seen.depth, seen.tokenizer)
        raise ValueError(
            f"{setting}={path}: file holds a {seen.label} backbone ({held}); "
            f"model is {name} ({_dims(config.embed_dim, config.depth, tokenizer)})"
        )
    try:
        check_weights_file(config, file, prefix)
    except StateDictMismatchError as err:
        raise ValueError(f"{setting}={path}: {mismatch_line(err)} for {name}") from None


def mismatch_line(err: StateDictMismatchError, shown: int = 3) -> str:
    """``StateDictMismatchError``'s lists in one line (the first ``shown`` of each)."""

    def few(items: list) -> str:
        return ", ".join(map(str, items[:shown])) + (", ..." if len(items) > shown else "")

    parts = []
    if err.missing:
        parts.append(f"{len(err.missing)} keys missing ({few(err.missing)})")
    if err.unexpected:
        parts.append(f"{len(err.unexpected)} unexpected keys ({few(err.unexpected)})")
    if err.mismatched:
        shapes = [f"{k} file {tuple(got)} vs model {tuple(want)}" for k, want, got in err.mismatched]
        parts.append(f"{len(shapes)} keys of another shape ({few(shapes)})")
    return "; ".join(parts)


def head_shapes(student: nn.ModuleDict) -> dict[str, tuple[int, ...]]:
    """DCP key -> shape of every student module but the backbone (as ``training.checkpoint`` saves them)."""
    return {
        f"model.student.{name}.{key}": tuple(t.shape)
        for name, module in student.items()
        if name != "backbone"
        for key, t in module.state_dict().items()
    }


def check_heads_checkpoint(setting: str, path: str, student: nn.ModuleDict) -> None:
    """The DCP checkpoint folder ``path`` holds every head of ``student`` (a meta-device copy
    will do) at its shapes, from the checkpoint's metadata alone."""
    from torch.distributed.checkpoint import FileSystemReader

    folder = local_file(setting, path, folder=True)
    try:
        saved = FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    except (OSError, ValueError, RuntimeError) as err:  # not a DCP checkpoint folder
        raise ValueError(f"{setting}={path}: not a training checkpoint folder (checkpoint_<step>): {err}") from None
    want = head_shapes(student)
    missing = sorted(k for k in want if k not in saved)
    bad = [(k, want[k], tuple(saved[k].size)) for k in sorted(want) if k in saved and tuple(saved[k].size) != want[k]]
    if missing or bad:
        err = StateDictMismatchError([k.removeprefix("model.") for k in missing], [], bad)
        raise ValueError(f"{setting}={path}: {mismatch_line(err)} for this run's heads")


def check_weight_files(cfg: TrainConfig, *, resuming: bool) -> None:
    """Every weight file the run reads fits (see the module docstring); ``resuming``: ``init`` is not read."""
    from training.meta_arch import meta_arch_class, student_backbone_config

    for setting, (path, name) in cfg.backbone_files().items():
        if not (resuming and setting in RESUME_OPTIONAL):
            config = student_backbone_config(cfg) if setting == "init.backbone" else None
            check_backbone_file(setting, path, name, config)
    if cfg.init.heads and not resuming:
        with torch.device("meta"):
            student = meta_arch_class(cfg).build_student(cfg)
        check_heads_checkpoint("init.heads", cfg.init.heads, student)


@functools.lru_cache(maxsize=16)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    return sha256_file(path)


def weight_digest(path: str | Path) -> str:
    """sha256 of a file (cached per path, size and modification time); of a folder, the sha256
    of its files' relative names and digests in name order."""
    p = Path(path)
    if p.is_dir():
        h = hashlib.sha256()
        for f in sorted(q for q in p.rglob("*") if q.is_file()):
            h.update(f"{f.relative_to(p).as_posix()}\0{weight_digest(f)}\n".encode())
        return h.hexdigest()
    st = p.stat()
    return _digest(str(p.resolve()), st.st_size, st.st_mtime_ns)


def weight_digests(cfg: TrainConfig, recorded: dict[str, str] | None = None) -> dict[str, str]:
    """setting -> sha256 of each weight file the run names. ``recorded``: a resumed run's
    recorded digests, kept for an ``init`` file that is no longer there (it is not read again)."""
    out = {}
    for setting, path in cfg.weight_files().items():
        if recorded and setting in recorded and setting in RESUME_OPTIONAL and not Path(path).exists():
            out[setting] = recorded[setting]
        else:
            out[setting] = weight_digest(local_file(setting, path, folder=setting == "init.heads"))
    return out


def initialise(arch: nn.Module, cfg: TrainConfig) -> None:
    """Load ``init.backbone`` into the (unsharded) student backbone and ``init.heads`` into the
    student's other modules, in place; nothing when neither is set."""
    from training.meta_arch import student_backbone_config

    student = arch.student
    if cfg.init.backbone:
        prefix = backbone_prefix(weight_shapes(cfg.init.backbone))
        loaded = build_backbone(
            student_backbone_config(cfg), weights=cfg.init.backbone, weights_prefix=prefix, dtype=torch.float32
        )
        student["backbone"].load_state_dict(loaded.state_dict())
    if cfg.init.heads:
        import torch.distributed.checkpoint as dcp

        state = {
            f"student.{name}.{key}": t
            for name, module in student.items()
            if name != "backbone"
            for key, t in module.state_dict().items()
        }
        dcp.load({"model": state}, checkpoint_id=cfg.init.heads, no_dist=True)
