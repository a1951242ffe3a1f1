"""Settings of an annotation job: which dataset version, which task checkpoints, how the models run.

A task is on when its ``tasks.<task>.checkpoint`` is set (a released task checkpoint, or a
fine-tune export of ``evaluation.finetune``); ``model`` names the task model (released heads)
or the backbone (fine-tune exports) when the file alone does not say; ``onnx`` runs a graph
``pipelines/export.py`` wrote from that checkpoint (fp32 or fp16) through onnxruntime instead of
PyTorch, at the graph's own precision (``actors.precision`` is PyTorch's);
``input_hw`` is the model input (default: the size the model was trained at; fine-tune
exports do not record theirs, so they need it). Pose runs top-down on the person boxes
curation recorded, chosen as the released demo chooses its detections (scoring above
``tasks.pose.min_box_score``, then non-maximum suppression at ``nms_iou``, the whole image
when no box is left), the best ``max_people``, with the flip test on by default.
``map_dtype``: how normal, pointmap and depth maps are stored (default: as the released demos
save them).

``max_error_share``: the share of samples that may go unannotated because of what is wrong
with them (missing, corrupt, of another size than curation recorded, without usable metadata:
``evaluation.annotate.annotator``); a job over it writes its shards and the counts, then fails
naming the top reasons. Any other failure fails the job whatever the share.

``actors``: the Ray Data actor pool every task's models run in (one pool, every enabled task's
model loaded once per actor): device, CPUs and (fractional) GPUs per actor, pool size, the
model batch size and the precision (``auto``: bf16 autocast on a GPU, fp32 on a CPU).
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Literal

from curation.filters.model import Placement, check_placement
from infra.ray_runtime import RayConfig, ray_section
from infra.tracking import TrackingConfig, tracking_section

TASKS = ("pose", "seg", "normal", "pointmap", "depth", "albedo")
MAP_DTYPES = {"normal": "float32", "pointmap": "float16", "depth": "float16"}
"""How each float map is stored by default: as the released demos save it (normals float32, the
pointmap's depth float16; v1 depth as the pointmap)."""


@dataclasses.dataclass(kw_only=True)
class AnnotateTaskConfig:
    """One task's model: a checkpoint file ("" = the task is off), optionally its ONNX graph."""

    checkpoint: str = ""
    model: str = ""  # task model name (released heads) or backbone name (fine-tune exports); "" = from the file
    onnx: str = ""  # an ONNX graph exported from ``checkpoint`` (pipelines/export.py); "" = PyTorch
    input_hw: tuple[int, int] | None = None  # None: the size the model was trained at
    feature_block: int = -1  # fine-tune exports: the backbone block feeding the head
    map_dtype: Literal["", "float32", "float16"] = ""  # normal, pointmap, depth; "": MAP_DTYPES

    @property
    def enabled(self) -> bool:
        return bool(self.checkpoint)


@dataclasses.dataclass(kw_only=True)
class AnnotatePoseConfig(AnnotateTaskConfig):
    """Pose runs on the person boxes of a sample that the released demo would keep: scoring above
    ``min_box_score``, then greedy non-maximum suppression (a box overlapping a better kept one
    by an IoU above ``nms_iou`` is dropped; 1 keeps all); when none is left, on the whole image
    (``whole_image``; false: no pose for that sample). The ``max_people`` best (0: all), with
    the released flip test. The defaults are the released demo's."""

    flip_test: bool = True
    min_box_score: float = 0.3
    nms_iou: float = 0.3
    whole_image: bool = True
    max_people: int = 0


@dataclasses.dataclass(kw_only=True)
class TasksConfig:
    """One section per task model the job can run; each is off unless ``enabled``."""

    pose: AnnotatePoseConfig = field(default_factory=AnnotatePoseConfig)
    seg: AnnotateTaskConfig = field(default_factory=AnnotateTaskConfig)
    normal: AnnotateTaskConfig = field(default_factory=AnnotateTaskConfig)
    pointmap: AnnotateTaskConfig = field(default_factory=AnnotateTaskConfig)
    depth: AnnotateTaskConfig = field(default_factory=AnnotateTaskConfig)
    albedo: AnnotateTaskConfig = field(default_factory=AnnotateTaskConfig)

    def enabled(self) -> list[str]:
        """The tasks that run, in ``TASKS`` order."""
        return [t for t in TASKS if getattr(self, t).enabled]

    def of(self, task: str) -> AnnotateTaskConfig:
        return getattr(self, task)


@dataclasses.dataclass(kw_only=True)
class ActorPoolConfig(Placement):
    """The actor pool the models run in (``curation.filters.model.Placement``'s keys, plus the
    precision). ``batch_size``: model inputs per forward (pose: person crops)."""

    batch_size: int = 8
    num_actors: int = 2
    precision: Literal["auto", "fp32", "bf16"] = "auto"


@dataclasses.dataclass(kw_only=True)
class AnnotateDataConfig:
    """``dataset``: a dataset version id, a dataset name (its latest version) or a curation output
    folder, as pretraining's ``data.dataset``; ids and names are looked up in ``tracking_uri``
    (default: this job's ``tracking.uri``)."""

    dataset: str = ""
    tracking_uri: str | None = None


@dataclasses.dataclass(kw_only=True)
class GalleryConfig:
    """The gallery page: ``samples`` drawn deterministically by key hash (0: no page)."""

    samples: int = 12  # samples drawn in the gallery page (deterministic: by key hash); 0 = no page


@dataclasses.dataclass(kw_only=True)
class AnnotateConfig:
    """Labelling a dataset version (``pipelines/annotate.py``): each enabled task's model over
    ``data.dataset``'s samples on Ray Data actors, outputs in ``output_dir``; a share of samples
    missing or in error above ``max_error_share`` fails the job after writing what it could."""

    name: str = "annotate"
    output_dir: str = "runs/annotations"
    max_error_share: float = 0.05  # of the samples, missing or in error; more fails the job (after writing)
    data: AnnotateDataConfig = field(default_factory=AnnotateDataConfig)
    tasks: TasksConfig = field(default_factory=TasksConfig)
    actors: ActorPoolConfig = field(default_factory=ActorPoolConfig)
    gallery: GalleryConfig = field(default_factory=GalleryConfig)
    ray: RayConfig = ray_section(progress_bars="off")
    tracking: TrackingConfig = tracking_section("annotate")

    def validate(self) -> None:
        """Start-up checks of the settings alone (files are checked when the job prepares)."""
        if not self.data.dataset:
            raise ValueError(
                "data.dataset is empty: give a dataset version id, a dataset name or a curation output folder"
            )
        check_placement(self.actors, "actors")
        if not 0.0 <= self.max_error_share <= 1.0:
            raise ValueError(
                f"max_error_share must be between 0 and 1 (a share of the samples), got {self.max_error_share}"
            )
        for task in TASKS:
            s = self.tasks.of(task)
            if s.onnx and not s.checkpoint:
                raise ValueError(
                    f"tasks.{task}.onnx needs tasks.{task}.checkpoint (the model the graph was exported from)"
                )
            if s.input_hw is not None and min(s.input_hw) < 1:
                raise ValueError(f"tasks.{task}.input_hw must be two positive sizes (H, W), got {s.input_hw}")
            if s.map_dtype and task not in MAP_DTYPES:
                raise ValueError(f"tasks.{task}.map_dtype applies to the float maps of {', '.join(MAP_DTYPES)} only")
        if not 0 < self.tasks.pose.nms_iou <= 1:
            raise ValueError(f"tasks.pose.nms_iou must be in (0, 1] (1: no suppression), got {self.tasks.pose.nms_iou}")
        if self.tasks.pose.max_people < 0:
            raise ValueError(f"tasks.pose.max_people must be >= 0 (0: every box), got {self.tasks.pose.max_people}")
        if self.gallery.samples < 0:
            raise ValueError(f"gallery.samples must be >= 0, got {self.gallery.samples}")
        if not self.tasks.enabled():
            raise ValueError(
                f"no task has a checkpoint: set tasks.<task>.checkpoint for at least one of {', '.join(TASKS)}"
            )
