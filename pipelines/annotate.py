"""Annotate a curated dataset version with task models: pose (top-down on curation's person
boxes, flip test), body-part segmentation, normals, pointmaps, depth, albedo.

    python pipelines/annotate.py --config configs/annotate_demo.yaml data.dataset=runs/demo/curated output_dir=runs/ann
    python pipelines/annotate.py --config configs/annotate_demo.yaml tasks.seg.checkpoint=sapiens2_0.4b_seg.safetensors
    python pipelines/annotate.py ... tasks.seg.onnx=seg.onnx        # the graph pipelines/export.py wrote, via onnxruntime
    ray job submit --address http://127.0.0.1:8265 --working-dir . -- python pipelines/annotate.py --config ...

``data.dataset``: a dataset version id, name or curation output folder. A task runs when its
``tasks.<task>.checkpoint`` is set. Outputs: ``<output_dir>/annotations/<shard>.parquet`` and
``.tar`` per source shard, ``gallery.html``, ``_SUCCESS``; re-running the same command resumes.
More samples than ``max_error_share`` not annotated (missing, corrupt): the shards and ``_FAILED``
(the counts) are written, then one line naming the top reasons and exit code 1.
"""

from __future__ import annotations

import sys

from evaluation.annotate import AnnotateConfig, TooManyErrors, run_annotation
from infra.cli import config_main


def main(argv: list[str] | None = None) -> int:
    try:
        return config_main(
            __doc__,
            AnnotateConfig,
            lambda cfg: run_annotation(cfg).summary(),
            argv,
            config_help="YAML file of settings (configs/annotate_*.yaml)",
            overrides_example="data.dataset=runs/demo/curated tasks.seg.checkpoint=seg.safetensors",
        )
    except TooManyErrors as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
