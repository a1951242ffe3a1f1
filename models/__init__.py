"""Both Sapiens model families: Sapiens2 (backbone, 4K tokenizer) and Sapiens v1
(``models.sapiens1``), pretraining and task heads.

Entry points: ``build_backbone(name)`` (``list_models()`` for the names of both families;
``family_of(name)`` says which), ``check_weights_file`` (family, size and keys of a file),
``load_weights`` / ``save_state_dict_file`` for official-layout checkpoints,
``MAEDecoder`` / ``DINOHead`` for pretraining and ``build_task_head(task, in_dim)``
for probing. Released task models (backbone + released head): ``build_task_model(name,
weights=...)``, ``list_task_models()``, ``infer_task_model(path)``; any task checkpoint
(released or a fine-tune export): ``load_task_checkpoint(path)``.
"""

from models.io import StateDictMismatchError, load_state_dict_file, load_weights, save_state_dict_file
from models.pretrain_heads import (
    DINOHead,
    MAEDecoder,
    MAEDecoderConfig,
    normalized_pixel_targets,
    patchify,
    unpatchify,
)
from models.registry import (
    MODEL_REGISTRY,
    WeightsFamilyError,
    build_backbone,
    check_weights_file,
    count_flops,
    count_params,
    family_of,
    get_config,
    list_models,
)
from models.sapiens1 import Sapiens1Backbone, Sapiens1Config
from models.sapiens2 import BackboneOutput, Sapiens2Backbone, Sapiens2Config
from models.task_checkpoints import TaskCheckpoint, load_task_checkpoint
from models.task_heads import TASK_HEADS, build_task_head
from models.task_models import (
    TASK_MODELS,
    TaskModel,
    TaskSpec,
    build_task_model,
    check_task_weights_file,
    get_task_spec,
    infer_task_model,
    list_task_models,
)

__all__ = [
    "MODEL_REGISTRY",
    "TASK_HEADS",
    "TASK_MODELS",
    "BackboneOutput",
    "DINOHead",
    "MAEDecoder",
    "MAEDecoderConfig",
    "Sapiens1Backbone",
    "Sapiens1Config",
    "Sapiens2Backbone",
    "Sapiens2Config",
    "StateDictMismatchError",
    "TaskCheckpoint",
    "TaskModel",
    "TaskSpec",
    "WeightsFamilyError",
    "build_backbone",
    "build_task_head",
    "build_task_model",
    "check_task_weights_file",
    "check_weights_file",
    "count_flops",
    "count_params",
    "family_of",
    "get_config",
    "get_task_spec",
    "infer_task_model",
    "list_models",
    "list_task_models",
    "load_state_dict_file",
    "load_task_checkpoint",
    "load_weights",
    "normalized_pixel_targets",
    "patchify",
    "save_state_dict_file",
    "unpatchify",
]
