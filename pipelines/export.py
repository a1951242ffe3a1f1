"""Export a task checkpoint (backbone + head) to ONNX with a dynamic batch axis, in fp32 or
fp16, checked against the eager fp32 model with onnxruntime at batch sizes 1 and 3.

    python pipelines/export.py --checkpoint sapiens2_0.4b_pose.safetensors --output pose.onnx
    python pipelines/export.py --checkpoint sapiens2_0.4b_pose.safetensors --output pose.fp16.onnx --precision fp16
    python pipelines/export.py --checkpoint sapiens_0.3b_goliath_best_goliath_AP_573.pth --output pose.onnx
    python pipelines/export.py --checkpoint runs/ft/seg/export/model.safetensors --output seg.onnx --image-size 128 96

Released task checkpoints (Sapiens2 ``.safetensors``, Sapiens v1 ``.pth``) are recognised by
their keys and shapes (``--model sapiens2_1b_seg`` to say which); fine-tune exports
(``evaluation.finetune``) name their task and backbone in their metadata (``--task``,
``--model <backbone>`` to override) but not their input size (``--image-size H W``).
The graph's input ``image`` is the normalised (B, 3, H, W) image; its outputs are the
task's (``heatmaps``; ``logits``; ``normal``; ``pointmap`` + ``scale``; ...), float32 at either
precision (an fp16 graph casts at its ends; its weights and activations are fp16). The check's
tolerance is per precision (``models.onnx_export.TOLERANCE``): fp32 1e-4 absolute, fp16 2e-2 of
each output's largest magnitude; exit status 1 when the graph misses it.
"""

from __future__ import annotations

import argparse
import json
import sys

from models.onnx_export import PRECISIONS, TOLERANCE, export_checkpoint, tolerance_measure


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="task checkpoint: .safetensors or .pth")
    parser.add_argument("--output", required=True, help="the .onnx file to write")
    parser.add_argument("--model", help="task model name (released heads) or backbone name (fine-tune exports)")
    parser.add_argument("--task", help="task of a fine-tune export whose metadata does not name it")
    parser.add_argument(
        "--image-size", type=int, nargs=2, metavar=("H", "W"), help="input size (default: trained size)"
    )
    parser.add_argument("--feature-block", type=int, default=-1, help="fine-tune exports: the block feeding the head")
    parser.add_argument(
        "--precision", choices=PRECISIONS, default="fp32", help="weights and activations (default fp32)"
    )
    args = parser.parse_args(argv)
    try:
        info = export_checkpoint(
            args.checkpoint,
            args.output,
            model=args.model,
            task=args.task,
            image_hw=tuple(args.image_size) if args.image_size else None,
            feature_block=args.feature_block,
            precision=args.precision,
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(info, indent=1))
    if not info["within_tolerance"]:
        measure, bound = tolerance_measure(args.precision), TOLERANCE[args.precision]
        worst = max(info[measure].values())
        print(f"error: the {args.precision} graph's {measure} is {worst:.3g} (> {bound:g})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
