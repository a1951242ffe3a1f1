"""Reading and writing model weights: ``.safetensors`` and ``.pt``/``.pth`` state dicts in
the official Sapiens2 key layout.

``.pt`` files are read with ``torch.load(weights_only=True)``: no pickled code runs.
A key mismatch raises ``StateDictMismatchError`` naming every missing, unexpected and
wrongly shaped key, instead of ``load_state_dict``'s first-error message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

SAFETENSORS_SUFFIXES = (".safetensors",)
TORCH_SUFFIXES = (".pt", ".pth", ".bin")
_WRAPPER_KEYS = ("state_dict", "model", "module")


class StateDictMismatchError(ValueError):
    """The weights do not fit the model; the lists say exactly how."""

    def __init__(self, missing: list[str], unexpected: list[str], mismatched: list[tuple[str, tuple, tuple]]) -> None:
        self.missing, self.unexpected, self.mismatched = missing, unexpected, mismatched
        lines = ["state dict does not match the model"]
        if missing:
            lines.append(f"missing keys ({len(missing)}): {', '.join(missing)}")
        if unexpected:
            lines.append(f"unexpected keys ({len(unexpected)}): {', '.join(unexpected)}")
        for key, want, got in mismatched:
            lines.append(f"shape mismatch for {key}: model {want}, file {got}")
        lines.append("check the model name/config, or pass prefix= to strip a wrapper prefix such as 'backbone.'")
        super().__init__("\n".join(lines))


def load_state_dict_file(path: str | Path, *, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Tensors of a ``.safetensors`` or ``.pt``/``.pth``/``.bin`` file, keys unchanged.

    A ``.pt`` holding ``{"state_dict": ...}``, ``{"model": ...}`` or ``{"module": ...}`` is
    unwrapped.
    """
    path = Path(path)
    if path.suffix in SAFETENSORS_SUFFIXES:
        from safetensors.torch import load_file

        return load_file(path, device=str(device))
    if path.suffix in TORCH_SUFFIXES:
        obj = torch.load(path, map_location=device, weights_only=True)
        for key in _WRAPPER_KEYS:
            if isinstance(obj, Mapping) and isinstance(obj.get(key), Mapping):
                obj = obj[key]
        if not isinstance(obj, Mapping) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
            raise ValueError(f"{path} does not hold a flat state dict of tensors")
        return dict(obj)
    raise ValueError(f"unknown weights format {path.suffix!r} for {path}; use .safetensors or .pt")


def weight_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Key -> shape of a weights file without reading its tensors: the safetensors header,
    or a memory-mapped ``.pt`` (``weights_only``; wrappers unwrapped as above)."""
    path = Path(path)
    if path.suffix in SAFETENSORS_SUFFIXES:
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    if path.suffix in TORCH_SUFFIXES:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        for key in _WRAPPER_KEYS:
            if isinstance(obj, Mapping) and isinstance(obj.get(key), Mapping):
                obj = obj[key]
        if not isinstance(obj, Mapping):
            raise ValueError(f"{path} does not hold a flat state dict of tensors")
        return {k: tuple(v.shape) for k, v in obj.items() if isinstance(v, torch.Tensor)}
    raise ValueError(f"unknown weights format {path.suffix!r} for {path}; use .safetensors or .pt")


def save_state_dict_file(
    state: nn.Module | Mapping[str, torch.Tensor],
    path: str | Path,
    *,
    metadata: Mapping[str, object] | None = None,
) -> Path:
    """Write a module's (or a mapping's) tensors; the suffix picks the format.

    ``metadata`` (JSON-able) is stored as safetensors metadata under ``"meta"``, or
    beside the tensors under ``"meta"`` in a ``.pt`` file.
    """
    path = Path(path)
    tensors = state.state_dict() if isinstance(state, nn.Module) else dict(state)
    # Contiguous, detached CPU copies: safetensors refuses views and shared storage.
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix in SAFETENSORS_SUFFIXES:
        from safetensors.torch import save_file

        save_file(tensors, path, metadata={"meta": json.dumps(metadata)} if metadata else None)
    elif path.suffix in TORCH_SUFFIXES:
        torch.save({"state_dict": tensors, "meta": json.dumps(metadata or {})}, path)
    else:
        raise ValueError(f"unknown weights format {path.suffix!r} for {path}; use .safetensors or .pt")
    return path


def check_state_dict(model: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Raise ``StateDictMismatchError`` unless keys and shapes equal the model's exactly."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    mismatched = [
        (k, tuple(expected[k].shape), tuple(state_dict[k].shape))
        for k in sorted(set(expected) & set(state_dict))
        if expected[k].shape != state_dict[k].shape
    ]
    if missing or unexpected or mismatched:
        raise StateDictMismatchError(missing, unexpected, mismatched)


def load_weights(
    model: nn.Module,
    source: str | Path | Mapping[str, torch.Tensor],
    *,
    prefix: str = "",
    strict: bool = True,
) -> nn.Module:
    """Load official-layout weights (a file or a state dict) into ``model``, in place.

    ``prefix``: keep only keys that start with it, stripped (e.g. ``"backbone."``).
    ``strict=False`` loads the matching keys and ignores the rest (shape mismatches
    still raise). A model on the meta device takes the tensors as they are (``assign``).
    """
    state_dict = load_state_dict_file(source) if isinstance(source, (str, Path)) else dict(source)
    if prefix:
        state_dict = {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}
    if strict:
        check_state_dict(model, state_dict)
    else:
        expected = model.state_dict()
        state_dict = {k: v for k, v in state_dict.items() if k in expected}
        bad = [
            (k, tuple(expected[k].shape), tuple(v.shape)) for k, v in state_dict.items() if expected[k].shape != v.shape
        ]
        if bad:
            raise StateDictMismatchError([], [], bad)
    on_meta = any(t.is_meta for t in model.state_dict().values())
    model.load_state_dict(state_dict, strict=strict, assign=on_meta)
    return model
