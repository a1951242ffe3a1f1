"""How the meta-architecture is parallelised: activation checkpointing, ``torch.compile``
and FSDP2, applied per transformer block and then to the enclosing modules.

``parallelize(arch, mesh, cfg)`` is the one place that knows about sharding; model files
stay free of it. Order matters: checkpoint-wrap and compile each block first, then
``fully_shard`` each block (its own all-gather / reduce-scatter group), then each
sub-model (patch embedding, tokens, norms, heads), then the root.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from training.config import ParallelConfig


def block_lists(arch: nn.Module) -> tuple[list[nn.ModuleList], list[nn.ModuleList]]:
    """(the student's, the teacher's) ModuleLists of transformer blocks: those of every sub-model
    that has ``blocks`` (backbones, MAE decoders; a Sapiens v1 MAE has no teacher).

    A 4K tokenizer's window blocks stay in their backbone's group: they run in chunks
    under their own activation checkpointing.
    """
    student = [m.blocks for m in arch.student.values() if hasattr(m, "blocks")]
    return student, [m.blocks for m in arch.teacher.values() if hasattr(m, "blocks")]


def apply_activation_checkpointing(blocks: nn.ModuleList) -> None:
    """Recompute each block's activations in backward. ``checkpoint_wrapper``'s state-dict
    hooks strip its prefix, so checkpoints and exports keep the official key names."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    for i, block in enumerate(blocks):
        blocks[i] = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT, preserve_rng_state=False)


def mp_policy(precision: str, *, root: bool = False):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision == "fp32":
        return MixedPrecisionPolicy()
    # The root keeps fp32 inputs: the MAE targets are computed from the images there.
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=not root)


def parallelize(arch: nn.Module, mesh: DeviceMesh | None, cfg: ParallelConfig) -> nn.Module:
    """Checkpoint, compile and shard ``arch`` in place; ``mesh=None`` skips sharding."""
    student_lists, teacher_lists = block_lists(arch)
    lists = student_lists + teacher_lists
    if cfg.activation_checkpointing:
        for blocks in student_lists:  # the teacher runs without grad: nothing to recompute
            apply_activation_checkpointing(blocks)
    if cfg.compile:
        for blocks in lists:
            for block in blocks:
                block.compile(fullgraph=False)  # in place: parameter names stay the same
    if mesh is None:
        return arch
    from torch.distributed.fsdp import fully_shard

    policy = mp_policy(cfg.precision)
    reshard = cfg.reshard_after_forward
    if cfg.shard_blocks:
        for blocks in lists:
            for block in blocks:
                fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
    for model in (arch.student, arch.teacher):
        for sub in model.values():
            fully_shard(sub, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
    fully_shard(arch, mesh=mesh, mp_policy=mp_policy(cfg.precision, root=True), reshard_after_forward=reshard)
    return arch
