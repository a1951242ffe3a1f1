"""Sharded (DCP) checkpoints of the whole training state, and backbone exports.

A checkpoint directory holds the DCP files of every rank (model: student, teacher and
the DINO centre, less what the meta-architecture's ``checkpoint_excludes`` names: a frozen
teacher that every session reloads from its file; optimiser), ``train_state.json`` (step, digests; rank 0) and
``data/rank_<r>.json`` (each rank's loader position). Every rank writes its part into a
local temporary directory and reports it with ``ray.train.report``; Ray merges them into
one checkpoint folder in storage.

Exports are official-layout ``.safetensors`` of the student and teacher backbones
(``models.registry.build_backbone(name, weights=path)`` loads them).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

TRAIN_STATE = "train_state.json"
DATA_DIR = "data"


def save(
    directory: str | Path,
    arch: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    step: int,
    rank: int,
    data_state: dict,
    meta: dict | None = None,
) -> None:
    directory = Path(directory)
    model_sd, optim_sd = _state_dicts(arch, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(directory))
    (directory / DATA_DIR).mkdir(parents=True, exist_ok=True)
    (directory / DATA_DIR / f"rank_{rank:05d}.json").write_text(json.dumps(data_state, separators=(",", ":")))
    if rank == 0:
        (directory / TRAIN_STATE).write_text(json.dumps({"step": step, **(meta or {})}, indent=2))


def load(
    directory: str | Path, arch: nn.Module, optimizer: torch.optim.Optimizer, *, rank: int
) -> tuple[int, dict | None, dict]:
    """Restore model and optimiser in place; returns (step, this rank's data state or None, train state)."""
    directory = Path(directory)
    model_sd, optim_sd = _state_dicts(arch, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(directory))
    # strict unless part of the model is left out of checkpoints on purpose
    options = StateDictOptions(strict=not getattr(arch, "checkpoint_excludes", ()))
    set_state_dict(arch, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"], options=options)
    train_state = json.loads((directory / TRAIN_STATE).read_text())
    data_file = directory / DATA_DIR / f"rank_{rank:05d}.json"
    data_state = json.loads(data_file.read_text()) if data_file.is_file() else None
    return int(train_state["step"]), data_state, train_state


def _state_dicts(arch: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """Model and optimiser state dicts, without the keys under ``arch.checkpoint_excludes``."""
    model_sd, optim_sd = get_state_dict(arch, optimizer)
    excludes = tuple(getattr(arch, "checkpoint_excludes", ()))
    if excludes:
        model_sd = {k: v for k, v in model_sd.items() if not k.startswith(excludes)}
    return model_sd, optim_sd


def full_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    """Unsharded CPU copy of ``module``'s state dict (collective: every rank calls it;
    the result is complete on every rank)."""
    out = {}
    for name, tensor in module.state_dict().items():
        if hasattr(tensor, "full_tensor"):
            tensor = tensor.full_tensor()
        out[name] = tensor.detach().to("cpu", copy=True)
    return out


def export_backbone(module: nn.Module, path: str | Path, *, rank: int, metadata: dict) -> str | None:
    """Write ``module``'s full weights as an official-layout safetensors file on rank 0;
    returns its sha256 there (None on other ranks)."""
    from models.io import save_state_dict_file

    state = full_state_dict(module)
    if rank != 0:
        return None
    path = Path(path)
    tmp = path.with_name(f".tmp-{path.name}")  # same suffix: the writer picks the format by it
    save_state_dict_file(state, tmp, metadata=metadata)
    tmp.chmod(0o644)  # probing jobs of other users read it
    tmp.replace(path)
    return sha256_file(path)


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
