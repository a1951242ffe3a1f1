#!/usr/bin/env bash
# The GPU figures of the platform in two prepared runs (each one 10-minute command on one GPU):
#   1. sapiens2_1b forward+backward at 1024x768, bf16 autocast: TFLOP/s and MFU, eager and compiled
#      (benchmarks/backbone_step.py, sapiens2 only: the plain baseline is the CPU benchmark's business)
#   2. one pretraining step of configs/pretrain_0.4b.yaml under FSDP2 on one GPU, fed by its data
#      loader (Ray Train, loader processes decoding JPEG shards of real photos): step time,
#      images/s, data-wait share (benchmarks/pretrain_step.py, loader mode with ray.use_gpu=true)
#   3. the person detector's images/s on the GPU (the CenterNet ONNX in ../shared/assets/models
#      through ONNX Runtime's CUDA provider; says so when that provider is missing)
#   4. the annotation job with sapiens2_0.4b pose and seg (random weights in the released layout) at
#      1024x768, bf16 autocast, 4 actors sharing the GPU: images/s per GPU, the share of the actors'
#      time in model forwards, the backbone's forward TFLOP/s against the peak
#      (benchmarks/annotate_throughput.py --device cuda)
#   5. the same job for sapiens2_0.4b pose at 1024x768 through ONNX Runtime's CUDA provider with the
#      fp16 graph (pipelines/export.py --precision fp16's export, made in the section, not timed):
#      images/s per GPU against PyTorch bf16 on the same samples (says NOT MEASURED, exit 3, when
#      ONNX Runtime has no CUDA provider: the project's onnxruntime is the CPU build)
# Every section runs under its own time limit; a section that fails or runs out of time is
# reported and the next one still runs. Exit status: 0 when every section passed. The sections
# come in two parts of at most 570 s each, one 10-minute command per part (--part 1, --part 2);
# part 2 keeps room for more sections.
#
#   bash benchmarks/gpu_suite.sh --part 1        # backbone, backbone_compiled, pretrain, detector
#   bash benchmarks/gpu_suite.sh --part 2        # annotate, annotate_onnx_fp16
#   bash benchmarks/gpu_suite.sh --only backbone,detector --peak-tflops 989
#   bash benchmarks/gpu_suite.sh --dry-run       # print the plan of everything (works without a GPU)
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$REPO/.venv/bin/python}"
PART1="backbone,backbone_compiled,pretrain,detector"
# Part 2 has 570 - 360 = 210 s left: room for the distilled student's block below (`--only distill`,
# 60 s), which is not in either part.
PART2="annotate,annotate_onnx_fp16"
SECTIONS="$PART1,$PART2"
PEAK=989          # dense bf16 TFLOP/s of an H100/H200
DETECTOR="$REPO/../shared/assets/models/person_centernet_512.onnx"
DRY=0
# Seconds per section: each part together <= 570 s, leaving ~30 s for process start-ups within 10 minutes.
T_BACKBONE=75 T_COMPILED=190 T_PRETRAIN=145 T_DETECTOR=40 T_ANNOTATE=120 T_ANNOTATE_ONNX=240

usage() {
    sed -n '2,/^set -uo pipefail/{/^#/p}' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    cat <<EOF

options:
  --only LIST          comma-separated sections of: $SECTIONS
  --part N             1: $PART1; 2: $PART2
  --peak-tflops X      peak dense bf16 TFLOP/s for MFU (default $PEAK)
  --detector FILE      CenterNet .onnx (default $DETECTOR)
  --python EXE         interpreter (default $PY; or \$PYTHON)
  --dry-run            print the commands and time limits, run nothing (no GPU needed)
  -h, --help           this text
EOF
}

die() { echo "gpu_suite: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
    case "$1" in
        --only) [ $# -ge 2 ] || die "--only needs a value"; SECTIONS="$2"; shift 2 ;;
        --part) [ $# -ge 2 ] || die "--part needs a value"
                case "$2" in 1) SECTIONS="$PART1" ;; 2) SECTIONS="$PART2" ;; *) die "--part must be 1 or 2, got '$2'" ;; esac
                shift 2 ;;
        --peak-tflops) [ $# -ge 2 ] || die "--peak-tflops needs a value"; PEAK="$2"; shift 2 ;;
        --detector) [ $# -ge 2 ] || die "--detector needs a value"; DETECTOR="$2"; shift 2 ;;
        --python) [ $# -ge 2 ] || die "--python needs a value"; PY="$2"; shift 2 ;;
        --dry-run) DRY=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done
[[ "$PEAK" =~ ^[0-9]+([.][0-9]+)?$ ]] || die "--peak-tflops must be a number, got '$PEAK'"
IFS=, read -r -a WANTED <<< "$SECTIONS"
for s in "${WANTED[@]}"; do
    case "$s" in backbone|backbone_compiled|pretrain|detector|annotate|annotate_onnx_fp16|distill) ;; *) die "unknown section '$s' (known: $PART1,$PART2,distill)" ;; esac
done

BACKBONE=("$PY" "$REPO/benchmarks/backbone_step.py" --device cuda --model sapiens2_1b --hw 1024 768 --batch 4
          --steps 10 --warmup 3 --peak-tflops "$PEAK" --no-baseline)
PRETRAIN=("$PY" "$REPO/benchmarks/pretrain_step.py" --config "$REPO/configs/pretrain_0.4b.yaml" --workers 1
          --cpus 16 --threads 12 --batch 8 --steps 3 --warmup 2
          --set ray.use_gpu=true data.loader_workers=10)
DETECT=("$PY" - "$DETECTOR")
ANNOTATE=("$PY" "$REPO/benchmarks/annotate_throughput.py" --device cuda --sizes 0.4b --tasks pose,seg --hw 1024 768
          --precision bf16 --images-large 64 --per-shard-large 8 --actors 4 --gpus-per-actor 0.25
          --cpus-per-actor 3 --batch 8 --no-loop --peak-tflops "$PEAK")
ANNOTATE_ONNX=("$PY" "$REPO/benchmarks/annotate_throughput.py" --device cuda --sizes 0.4b --tasks pose --hw 1024 768
               --runtimes torch,onnx-fp16 --precision bf16 --images-large 32 --per-shard-large 8 --actors 4
               --gpus-per-actor 0.25 --cpus-per-actor 3 --batch 8 --no-loop --peak-tflops "$PEAK")

# --- The distilled student (its own block; not in the default SECTIONS, whose limits fill the
# 10-minute budget: `--only distill`, about a minute). sapiens2_0.1b, the student a sapiens2_1b
# teacher distils into, against that teacher at 1024x768, bf16 autocast, forward only: images/s per
# GPU of each and the ratio, measured in the same run (benchmarks/distill_student.py --device cuda;
# random weights, as speed does not depend on them).
T_DISTILL=60
DISTILL=("$PY" "$REPO/benchmarks/distill_student.py" --device cuda --teacher-model sapiens2_1b
         --student-model sapiens2_0.1b --hw 1024 768 --batch 8 --steps 10 --warmup 3)

run() {  # run NAME LIMIT_S CMD...: one section under its limit, its status remembered
    local name="$1" limit="$2"; shift 2
    echo
    echo "=== $name (limit ${limit}s): ${*}"
    if [ "$DRY" = 1 ]; then return 0; fi
    local start=$SECONDS
    if [ "$name" = detector ]; then timeout --kill-after=10 "$limit" "$@" <<< "$DETECTOR_PY"; else timeout --kill-after=10 "$limit" "$@"; fi
    local rc=$?
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then STATUS+=("$name: TIMED OUT after ${limit}s"); FAILED=1
    elif [ $rc -ne 0 ]; then STATUS+=("$name: FAILED (exit $rc)"); FAILED=1
    else STATUS+=("$name: ok in $((SECONDS - start))s"); fi
}

DETECTOR_PY='
import sys, time
import numpy as np
import onnxruntime as ort
from PIL import Image
from curation.filters.person import CenterNetOnnx, DetectorConfig
if "CUDAExecutionProvider" not in ort.get_available_providers():
    print(f"detector: NOT MEASURED: ONNX Runtime {ort.__version__} has no CUDA provider "
          f"(providers: {ort.get_available_providers()}); install onnxruntime-gpu. No ultralytics weights ship "
          "with the project, so there is no GPU detector to time.")
    sys.exit(3)
det = CenterNetOnnx(DetectorConfig(backend="centernet_onnx", weights=sys.argv[1], device="cuda"))
rng = np.random.default_rng(0)
images = [Image.fromarray((rng.random((480, 640, 3)) * 255).astype(np.uint8)) for _ in range(8)]
sizes = [im.size for im in images]
det.detect(images, sizes)  # warm-up: CUDA context, cuDNN autotune
n, start = 0, time.perf_counter()
while time.perf_counter() - start < 15:
    det.detect(images, sizes); n += len(images)
wall = time.perf_counter() - start
x = np.zeros((1, det.cfg.size, det.cfg.size, 3), np.float32)
k, s0 = 0, time.perf_counter()
while time.perf_counter() - s0 < 5:
    det.session.run([det.output_name], {det.input_name: x}); k += 1
print(f"detector (CenterNet ONNX, {det.session.get_providers()[0]}, input {det.cfg.size}x{det.cfg.size}, batch 1): "
      f"{n / wall:.1f} images/s end to end (PIL resize + session), {k / (time.perf_counter() - s0):.1f} images/s session only")
'

echo "gpu_suite: sections ${SECTIONS}; python $PY"
if [ "$DRY" = 0 ]; then
    # Fail fast and clearly: nothing here means anything without a CUDA device.
    [ -x "$PY" ] || command -v "$PY" >/dev/null || die "no interpreter at $PY (make the venv, or pass --python)"
    "$PY" -c 'import sys, torch
sys.exit(0 if torch.cuda.is_available() else 1)' || die "no CUDA device visible to torch (torch.cuda.is_available() is False): this suite only runs on a GPU machine"
    "$PY" -c 'import torch; print("device:", torch.cuda.get_device_name(), "| torch", torch.__version__, "| CUDA", torch.version.cuda)'
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader 2>/dev/null || true
fi

cd "$REPO" || die "cannot cd to $REPO"
STATUS=() FAILED=0 SUITE_START=$SECONDS
for s in "${WANTED[@]}"; do
    case "$s" in
        backbone) run backbone "$T_BACKBONE" "${BACKBONE[@]}" ;;
        backbone_compiled) run backbone_compiled "$T_COMPILED" "${BACKBONE[@]}" --compile ;;
        pretrain) run pretrain "$T_PRETRAIN" "${PRETRAIN[@]}" ;;
        detector) run detector "$T_DETECTOR" "${DETECT[@]}" ;;
        annotate) run annotate "$T_ANNOTATE" "${ANNOTATE[@]}" ;;
        annotate_onnx_fp16) run annotate_onnx_fp16 "$T_ANNOTATE_ONNX" "${ANNOTATE_ONNX[@]}" ;;
        distill) run distill "$T_DISTILL" "${DISTILL[@]}" ;;
    esac
done
echo
echo "=== summary ($((SECONDS - SUITE_START))s)"
if [ "$DRY" = 1 ]; then echo "dry run: nothing was run"; exit 0; fi
printf '%s\n' "${STATUS[@]}"
exit $FAILED
