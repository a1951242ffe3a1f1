"""Does end-to-end fine-tuning beat the frozen probe of the same backbone, and does pretraining
matter end to end? Three runs per dense task at equal steps, same data, heads, batch size and
head lr, each once per seed (``--seeds``; mean ± half the range, paired wins per seed):

- "probe": the pretrained backbone frozen, the task's head trained (``evaluation.probe_trainer.run_probe``);
- "fine-tune": the pretrained backbone + the same head trained end to end (``evaluation.finetune``:
  layer-wise lr decay as the reference, with ``RECIPE`` on top of configs/finetune_tiny.yaml);
- "fine-tune (random init)": the same fine-tune recipe from a randomly initialised backbone.

    python benchmarks/finetune_vs_probe.py                        # 200 steps, SSL stand-in backbone
    python benchmarks/finetune_vs_probe.py --pretrain mae         # MAE-only stand-in (the v1 objective)
    python benchmarks/finetune_vs_probe.py --pretrain synthetic   # the platform's pretraining on curated rendered figures
    python benchmarks/finetune_vs_probe.py --pretrain demo        # the platform's own pretraining on the demo corpus
    python benchmarks/finetune_vs_probe.py --checkpoint x.safetensors --steps 400 --seeds 0,1,2,3
    python benchmarks/finetune_vs_probe.py --tasks pose --steps 1000 --set synthetic.height=64 synthetic.width=48
    python benchmarks/finetune_vs_probe.py --tasks seg,pose --task-steps pose=1000   # per-task steps

Pose is scored without flip test in all three runs (``PROTOCOL``: the probe's evaluator has none;
the fine-tune stage's default has it). Depth gets two more rows (``DEPTH_METRICS``: RMSE and
delta1 beside AbsRel). Depth's target is the reference's relative depth since 2026-12-01
(``evaluation.depth``); every depth figure below outside that dated section is on the earlier
metric-Z target and does not compare with it.

Image size: the synthetic set's (``--set synthetic.height=64 synthetic.width=48`` for a faster
look). The pretrained backbone: ``--pretrain ssl`` (default) trains ``evaluation.warmup.ssl_warmup``
(MAE + contrastive, no labels) for ``--pretrain-steps`` on freshly rendered synthetic images (the
probe tasks' image distribution, not their splits: a built-in advantage, say so when quoting);
``--pretrain mae`` the same without the contrastive term and with the visible patches
reconstructed at full weight (``STANDINS``; the pose section at the end says why);
``--pretrain synthetic`` renders ``--pretrain-images`` figures of that distribution as JPEG files,
curates them with the real pipeline (no person detector: they are renders) and runs the platform's
pretraining stage (``configs/pretrain_tiny.yaml``: the Sapiens2 objective, Ray Train, FSDP2) on
the curated shards for ``--pretrain-steps`` (``benchmarks/probe_trained_vs_random.pretrain_on_synthetic``);
``--pretrain demo`` curates the demo corpus and runs ``configs/pretrain_tiny.yaml``
(``benchmarks/probe_trained_vs_random.pretrain_on_demo``; 16 curated images: at this scale the
platform's pretraining need not beat random init, see that benchmark). Everything runs in this
process on the CPU (the Ray Train / FSDP2 path is the same code, tested in
tests/evaluation/finetune/). Writes ``bench.json`` under ``--out``.

The recipe, and why (200 steps, batch 8, 64x48, the SSL stand-in, seeds 0 and 1, synthetic set
seed 0; probe: seg mIoU 0.360, normal 35.4 deg, pointmap l2 0.511):

| fine-tune recipe                                   | seg mIoU | normal deg | pointmap l2 |
| reference (LLRD 0.85, full augmentation)           | 0.337    | 32.3       | 0.549       |
|   + LP-FT (backbone frozen 70 steps)               | 0.330    | 32.3       | 0.616       |
|   + backbone lr x0.25                              | 0.329    | 32.4       | 0.491       |
|   + both                                           | 0.329    | 32.4       | 0.487       |
| backbone frozen all 200 steps, no augmentation     | 0.360    |            |             |
| backbone frozen all 200 steps, full augmentation   | 0.328    |            |             |
| no augmentation                                    | 0.369    | 37.2       | 0.426       |
| no augmentation, LP-FT 100 + backbone lr x0.25     | 0.360    | 37.6       | 0.481       |
| LP-FT 70 + x0.25, flips only                       | 0.364    | 33.4       | 0.489       |
| flips only (RECIPE)                                | 0.376    | 33.1       | 0.432       |

The head's optimiser is not the gap (frozen for the whole run, the fine-tune equals the probe:
0.3598 vs 0.3597). The reference's rotation / scale / photometric augmentation is: on 160
clean synthetic images and 200 steps it costs seg 0.03 mIoU and pointmap 0.1 l2, while normals
need some augmentation (37 deg without, 32-33 with flips). LP-FT and a lower backbone lr only
help under the full augmentation (pointmap); otherwise they cost a little. These figures chose
the recipe on the synthetic val split: quote the benchmark on other seeds and another synthetic
set (``--seeds 3,4,5 --set synthetic.seed=1``), not these.

Measured 2026-11-30 (``python benchmarks/finetune_vs_probe.py --pretrain-steps 1500``: the SSL
stand-in trained 1500 steps, loss 2.630 -> 0.663, 942 s; 128x96, 200 steps, batch 8, seeds 0-2,
mean ± half-range; load 3-60, which moves times, not these values):

| task | metric | probe | fine-tune | fine-tune (random init) | vs probe | vs random init |
| seg | mIoU (higher) | 0.4727 ± 0.0055 | 0.5101 ± 0.0046 | 0.4841 ± 0.0077 | better (clear), 3/3 | better (clear), 3/3 |
| normal | mean_angle (lower) | 29.136 ± 0.172 | 26.745 ± 0.194 | 28.106 ± 0.268 | better (clear), 3/3 | better (clear), 3/3 |
| pointmap | l2 (lower) | 0.3386 ± 0.0054 | 0.3204 ± 0.0045 | 0.3354 ± 0.0082 | better (clear), 3/3 | better, 3/3 |
| albedo | mae (lower) | 0.1061 ± 0.0010 | 0.0976 ± 0.0004 | 0.0988 ± 0.0010 | better (clear), 3/3 | better, 2/3 |
| depth | abs_rel (lower) | 0.0979 ± 0.0034 | 0.0980 ± 0.0038 | 0.0999 ± 0.0027 | tie (WORSE by 1e-4), 2/3 | better, 3/3 |

(depth here and down to the relative-depth section: the earlier metric-Z target.) With 300 stand-in steps (loss 1.40 at the end) fine-tuning lost to random init on seg, pointmap
and depth: the backbone has to have learned enough for pretraining to show end to end. Depth
with LP-FT (backbone frozen 50 of 200 steps) was worse (seeds 0, 1: 0.1027, 0.1007); at 400 steps
(``--tasks depth --steps 400``): probe 0.0970 ± 0.0037, fine-tune 0.0956 ± 0.0058, random init
0.0963 ± 0.0017 (better on the means, 2/3 and 1/3 seeds): depth's seed spread (±0.004) is larger
than the differences, so this set cannot rank the three runs on depth.

Depth and pose, measured 2026-11-30/12-01 with the 1500-step stand-in above
(``--checkpoint runs/bench/fvp_ssl1500/ssl_backbone.safetensors``), same train set (160 images).

Depth on the earlier metric-Z target (the pointmaps' Z as it is), with 192 val images instead of 48 (``--tasks depth --set synthetic.val_images=192``; the
first 48 are the same images), seeds 0-2 (load 0.5-5.6; rerun with the split rows, load 0.7-2.0):

| task | metric | probe | fine-tune | fine-tune (random init) | fine-tune vs probe | vs random init |
| depth | abs_rel (lower) | 0.1019 ± 0.0025 | 0.1012 ± 0.0036 | 0.1012 ± 0.0018 | better, 2/3 | better, 1/3 |
| depth | abs_rel_aligned (lower) | 0.0303 ± 0.0014 | 0.0262 ± 0.0020 | 0.0280 ± 0.0002 | better (clear), 3/3 | better, 2/3 |
| depth | log_scale_err (lower) | 0.0972 ± 0.0021 | 0.0973 ± 0.0034 | 0.0975 ± 0.0016 | WORSE, 1/3 | better, 1/3 |

The spread hardly shrinks with 4x the val images (48: ±0.0034 / ±0.0038 / ±0.0027): not evaluation
noise. Where the error is: the per-image distance error (``log_scale_err``) is 0.093-0.101 for all
three runs (seeds 0-5), against 0.105 for the true shape at one distance for every image: no run
learns the figure's distance (1/its height in pixels, ±5% by construction) in 200 steps. That error
is most of AbsRel (0.10; 0.025-0.032 once each image is rescaled) and its seed-to-seed noise decides
the ranking. On the shape (``abs_rel_aligned``) the fine-tune beats the probe on every seed. No
recipe was changed for depth. Quoted on seeds 3-5 (``--tasks depth --seeds 3,4,5 --set synthetic.val_images=192``;
load 2.5-3.4):

| task | metric | probe | fine-tune | fine-tune (random init) | fine-tune vs probe | vs random init |
| depth | abs_rel (lower) | 0.1018 ± 0.0020 | 0.1010 ± 0.0016 | 0.1010 ± 0.0019 | better, 3/3 | better, 1/3 |
| depth | abs_rel_aligned (lower) | 0.0313 ± 0.0005 | 0.0267 ± 0.0013 | 0.0284 ± 0.0003 | better (clear), 3/3 | better (clear), 3/3 |
| depth | log_scale_err (lower) | 0.0968 ± 0.0014 | 0.0982 ± 0.0013 | 0.0980 ± 0.0024 | WORSE, 1/3 | WORSE, 1/3 |

(one distance for every image: log_scale_err 0.1051). On the headline AbsRel (metric Z) depth
is still a tie within the seed spread. The reference trains depth on per-image min-max
normalised foreground depth (``sapiens1_reference.json`` ``finetune.depth.target``), i.e.
relative depth, where the distance is not part of the task; this set's depth target is metric
Z (``evaluation.datasets.DenseMapDataset``), so AbsRel here mostly measures distance guessing.
(``abs_rel_aligned``: AbsRel after scaling each image's prediction by its median gt / pred ratio;
``log_scale_err``: the mean |log| of that ratio. Both dropped with the metric-Z target.)

Depth on the reference's target, measured 2026-12-01: per-image min-max normalised foreground
depth, 0 nearest / 1 farthest, background -1 (``evaluation.depth``, as sapiens'
GenerateDepthTarget; the fine-tune's train items are normalised again after the warp), SiLog
loss and the metrics on the pixels with target > 1e-6. A fresh 1500-step stand-in (``--pretrain
ssl``'s backbone, 911 s, loss 2.630 -> 0.707, load 4-6), then ``--tasks depth --seeds 0,1,2
--checkpoint <it>``; 128x96, 200 steps, 48 val images (load 4-6, ~7 min per seed):

| task | metric | probe | fine-tune | fine-tune (random init) | fine-tune vs probe | vs random init |
| depth | abs_rel (lower) | 15.7484 ± 3.8360 | 9.5533 ± 1.7513 | 11.5830 ± 1.9850 | better, 3/3 | better, 3/3 |
| depth | rmse (lower) | 0.1715 ± 0.0045 | 0.1634 ± 0.0017 | 0.1728 ± 0.0030 | better (clear), 3/3 | better (clear), 3/3 |
| depth | delta1 (higher) | 45.082 ± 0.978 | 46.681 ± 0.453 | 44.513 ± 0.437 | better (clear), 3/3 | better (clear), 3/3 |

Per seed (0, 1, 2), rmse / abs_rel / delta1: probe 0.1685 / 19.12 / 45.55, 0.1775 / 16.68 /
43.87, 0.1686 / 11.45 / 45.82; fine-tune 0.1623 / 8.78 / 46.26, 0.1656 / 11.69 / 46.62, 0.1623 /
8.19 / 47.17; random init 0.1697 / 9.21 / 44.31, 0.1731 / 13.18 / 45.05, 0.1756 / 12.36 / 44.18.
One constant for every pixel (the val mean, 0.455) scores rmse 0.232, abs_rel 93.2, delta1 31.3.
On the reference's target the fine-tune beats both the probe and random init on every seed, and
clearly (ranges apart) on RMSE and delta1. AbsRel is no longer a usable figure: the nearest
pixels of every figure have targets just above 1e-6 (2.8% of the counted val pixels are under
0.01), where |pred - gt| / gt reaches 1e3-1e4, so AbsRel (~10) is set by a few pixels and its seed
spread is ±2-4. Quote RMSE and delta1 for depth. The metric-Z diagnostic rows were measured in
this run too and then dropped: abs_rel_aligned was within 3% of AbsRel for every run (the same
near-zero pixels), log_scale_err (now the prediction's depth-range error, not a distance)
0.056-0.077 for all three runs (fine-tune 0.0611 ± 0.0047: below the probe's 0.0693 ± 0.0071 on
3/3 seeds, level with random init's 0.0600 ± 0.0057, 1/3): not a reference metric, not kept.

Pose (probe AP 0 below ~1000 steps at 128x96): 64x48, 1000 steps for each of the three runs,
the same stand-in (pretrained at 128x96), seeds 0-2, 48 val people, no flip test
(``--tasks pose --steps 1000 --set synthetic.height=64 synthetic.width=48``; load 1.4-3.2):

| task | metric | probe | fine-tune | fine-tune (random init) | fine-tune vs probe | vs random init |
| pose | AP (higher) | 0.3755 ± 0.0264 | 0.4061 ± 0.0128 | 0.5620 ± 0.0198 | better, 3/3 | WORSE (clear), 0/3 |

AP50 0.79-0.87 / 0.82-0.90 / 0.90-0.94. The fine-tune beats the probe on every seed but loses
clearly to fine-tuning from random init: this stand-in's features do not help pose at this size.
Not the stand-in's image size: one trained at 64x48 (``--pretrain ssl --pretrain-steps 1500``
with the same pose command: 266 s, loss 2.631 -> 0.962; load 1.6-3.2) gives probe 0.3707 ±
0.0179, fine-tune 0.4068 ± 0.0143, random init 0.5620 ± 0.0198 (better 3/3; WORSE (clear)). A
probe on a frozen randomly initialised backbone (a one-off call of ``probe`` without checkpoint)
scores 0.3352 / 0.3880 / 0.3758 on seeds 0-2: the stand-in's frozen features are hardly better
than random ones for pose (0.3755), and starting the fine-tune from them costs 0.16 AP against
random init. Pose stays open on the "beats random init" half until a pretrained backbone carries
pose-relevant features (this stand-in was not tried with other recipes).

The platform's own pretraining instead of the stand-in, measured 2026-11-30/12-01
(``--pretrain synthetic --pretrain-steps 1500 --pretrain-set parallel.precision=fp32
parallel.activation_checkpointing=false checkpoint.every=250``: 512 renders curated by the real
pipeline, 4 shards, then ``configs/pretrain_tiny.yaml`` through Ray Train + FSDP2, 2 workers x
batch 4, 96x64 global crops; 1783 s, loss 4.35 -> 3.95 (first / last 10 steps); at step 1500
loss_mae 0.742 and loss_cl 8.305, which is ln 4096 = 8.318: the DINO head's cross-entropy is
still at a uniform teacher, so the backbone learnt from the MAE term alone). 128x96, 200 steps,
seeds 0-2, load 1-5:

| task | metric | probe | fine-tune | fine-tune (random init) | fine-tune vs probe | vs random init |
| seg | mIoU (higher) | 0.4262 ± 0.0028 | 0.4666 ± 0.0101 | 0.4841 ± 0.0077 | better (clear), 3/3 | WORSE (clear), 0/3 |
| normal | mean_angle (lower) | 30.574 ± 0.437 | 28.477 ± 0.208 | 28.106 ± 0.268 | better (clear), 3/3 | WORSE, 0/3 |
| pointmap | l2 (lower) | 0.3558 ± 0.0030 | 0.3470 ± 0.0092 | 0.3354 ± 0.0082 | better, 2/3 | WORSE, 0/3 |
| albedo | mae (lower) | 0.1054 ± 0.0005 | 0.0991 ± 0.0008 | 0.0988 ± 0.0010 | better (clear), 3/3 | WORSE, 2/3 |
| depth | abs_rel (lower) | 0.1031 ± 0.0008 | 0.1023 ± 0.0030 | 0.0999 ± 0.0027 | better, 2/3 | WORSE, 0/3 |

(depth: the earlier metric-Z target; not rerun on the relative target.)

Fine-tuning beats the frozen probe of this backbone too, but starting from it is worse than
random init on every task: at this size and step count the platform's pretraining does not yet
give a backbone that helps end to end (its contrastive term has not started to learn), which is
why the stand-in's table above is the one that shows fine-tuning's gain over random init.

The same command after the tiny recipe's DINO fix (``configs/pretrain_tiny.yaml``: student temp
0.2, teacher temp 0.04; ``benchmarks/dino_diagnostics.py``), measured 2026-12-01: 2086 s at load
6-10 (the test suite beside it), loss 4.36 -> 2.78 (first / last 10 steps); loss_cl 8.27 / 7.61 /
6.34 / 5.30 / 5.00 / 5.06 at steps 250 / 500 / 750 / 1000 / 1250 / 1500 (it leaves ln K now),
loss_mae 0.60 / 0.68 / 0.73 / 0.82 / 0.58 / 0.72. ``--tasks seg,normal --seeds 0,1``, 128x96,
200 steps:

| task | metric | probe | fine-tune | fine-tune (random init) | fine-tune vs probe | vs random init |
| seg | mIoU (higher) | 0.4439 ± 0.0013 | 0.4914 ± 0.0062 | 0.4868 ± 0.0075 | better (clear), 2/2 | better, 1/2 |
| normal | mean_angle (lower) | 29.963 ± 0.236 | 27.736 ± 0.137 | 27.938 ± 0.054 | better (clear), 2/2 | better (clear), 2/2 |

(per seed: seg 0.4852 / 0.4976 fine-tune against 0.4943 / 0.4793 random init; normal 27.60 /
27.87 against 27.99 / 27.88.) With the contrastive term learning, the platform's own backbone
now helps end to end on normal (both seeds) and on seg's mean (one seed of two), where the
old recipe's lost on both (0/3).
The other three tasks with that backbone (``--checkpoint <its student_backbone.safetensors>
--tasks pointmap,albedo,depth --seeds 0,1``, load 2-3; depth on the relative target):

| task | metric | probe | fine-tune | fine-tune (random init) | fine-tune vs probe | vs random init |
| pointmap | l2 (lower) | 0.3479 ± 0.0023 | 0.3291 ± 0.0109 | 0.3431 ± 0.0010 | better (clear), 2/2 | better (clear), 2/2 |
| albedo | mae (lower) | 0.1107 ± 0.0001 | 0.0995 ± 0.0005 | 0.0984 ± 0.0007 | better (clear), 2/2 | WORSE (clear), 0/2 |
| depth | rmse (lower) | 0.1732 ± 0.0014 | 0.1665 ± 0.0023 | 0.1714 ± 0.0017 | better (clear), 2/2 | better (clear), 2/2 |
| depth | delta1 (higher) | 44.61 ± 0.04 | 45.35 ± 0.41 | 44.68 ± 0.37 | better (clear), 2/2 | better, 1/2 |
| depth | abs_rel (lower) | 13.31 ± 1.72 | 7.47 ± 0.21 | 11.20 ± 1.99 | better (clear), 2/2 | better (clear), 2/2 |

So with the platform's own pretraining the fine-tune beats its frozen probe on all five dense
tasks and random init on normal, pointmap and depth (both seeds), on seg's mean (one seed of two),
and not on albedo (0/2); two seeds only.

Twice as long a pretraining, measured 2026-12-01 (the same command with ``--pretrain-steps 3000 --tasks
albedo,seg --seeds 0,1,2``: 5463 s with the test suite beside it, loss 4.36 -> 2.54 (first / last 10
steps); loss_cl at steps 1000 / 1500 / 2000 / 2500 / 3000: 6.20 / 5.35 / 5.30 / 4.31 / 5.22, one step's
value each, loss_mae 0.50 at step 3000; export sha256 e4c03a27...), 128x96, 200 steps:

| task | metric | probe | fine-tune | fine-tune (random init) | fine-tune vs probe | vs random init |
| seg | mIoU (higher) | 0.4582 ± 0.0072 | 0.5027 ± 0.0074 | 0.4842 ± 0.0077 | better (clear), 3/3 | better (clear), 3/3 |
| albedo | mae (lower) | 0.1109 ± 0.0016 | 0.0988 ± 0.0030 | 0.0988 ± 0.0010 | better (clear), 3/3 | tie, 1/3 |

(per seed: seg fine-tune 0.4999 / 0.5114 / 0.4967 against random init 0.4943 / 0.4793 / 0.4788;
albedo 0.0951 / 0.1001 / 0.1011 against 0.0976 / 0.0991 / 0.0996, means 0.098777 and 0.098778.)
The longer run makes seg's gain over random init clear on every seed (1500 steps: 1/2) and lifts
the frozen probe (0.458 against 0.444); albedo moves from WORSE 0/2 to a tie (1/3). Albedo is the
one dense task where pretraining does not help end to end at this scale.
Pose with this backbone (``--checkpoint <its export> --tasks pose --steps 1000 --set
synthetic.height=64 synthetic.width=48 --seeds 0,1``): probe 0.310 / 0.329, fine-tune 0.404 / 0.312,
random init 0.541 / 0.567 (WORSE, 0/2); with ``optim.layer_decay=1.0`` for all three runs (seed 0):
fine-tune 0.522, random init 0.646. Without layer-wise decay both fine-tunes gain 0.08-0.12 AP, and
the pretrained start still loses by 0.12: at 64x48 (12 patches) the frozen pretrained features score
no better for pose than frozen random ones (0.31-0.33 here, 0.34-0.39 in the fifth session), so
layer decay, which keeps the lower blocks near their start, is not the whole cause.

Pose at 128x96 (48 patches) with the same 3000-step backbone, measured 2026-12-01 (``--checkpoint <its
export> --tasks pose --steps 2000 --seeds 0`` and then ``--seeds 1``; load 2-19, the test suite and a
pretraining beside it; ~19 min per fine-tune): probe 0.410 / 0.366, fine-tune 0.782 / 0.750, random
init **0.810 / 0.835** (WORSE, 0/2; AP50 1.0 for both fine-tunes). The gap to random init shrinks from
0.12-0.16 AP at 64x48 to 0.03 / 0.09, and is still a loss on both seeds. A frozen randomly initialised
backbone probed the same way (2000 steps) scores 0.447 / 0.365: the pretrained features carry no more
pose information than random ones at this size either, which is where the fine-tune's loss comes from.

Albedo without colour jitter in the pretraining (the hypothesis of the 3000-step run: colour-jittered
local views teach the contrastive term colour invariance), measured 2026-12-01: ``--pretrain synthetic
--pretrain-steps 1500 --pretrain-set parallel.precision=fp32 parallel.activation_checkpointing=false
checkpoint.every=250 crops.local_jitter_prob=0 crops.local_grayscale_prob=0 --tasks albedo --seeds
0,1,2`` (4111 s at load 9-19; loss 4.37 -> 2.16, loss_cl 5.19 / 5.20 / 4.68 / 3.70 / 4.05 / 3.60 at steps
250 .. 1500, one step's value each, where the jittered run's was 5.06 at 1500; export sha256 0c713be4...):

| task | metric | probe | fine-tune | fine-tune (random init) | fine-tune vs probe | vs random init |
| albedo | mae (lower) | 0.1086 ± 0.0018 | 0.0986 ± 0.0010 | 0.0988 ± 0.0010 | better (clear), 3/3 | better, 1/3 |

(per seed: fine-tune 0.0981 / 0.0978 / 0.0997 against random init 0.0976 / 0.0991 / 0.0996.) Without
jitter the frozen probe improves a little (0.1086 against 0.1107 with jitter at 1500 steps and 0.1109 at
3000) and the fine-tune moves from WORSE (0/2) to a tie with random init (1/3, means 2e-4 apart, inside
the seed spread), as the 3000-step jittered run did. So colour jitter costs the frozen features some
albedo information, but it is not why pretraining fails to help albedo end to end: every 200-step
albedo fine-tune, pretrained or not, lands at 0.098-0.100.

Pose: what a pretrained start does to it, measured 2026-12-01 (64x48, 1000 steps, synthetic set seed 0,
seeds 0 and 1, ad hoc calls of this file's functions; train AP on the 160 train images unaugmented):

| start (pose fine-tune) | val AP seed 0 / 1 | train AP seed 0 / 1 | the start's attention weight RMS |
| random init | 0.541 / 0.565 | 0.784 / 0.797 | 0.018 |
| ``ssl`` stand-in (1500 steps at 64x48) | 0.366 / 0.407 | 0.618 / 0.628 | 0.040 |
| a pose fine-tune on another synthetic set (seed 7, 480 images, 1500 steps; val AP 0.739 there) | 0.729 / 0.703 | 0.854 / 0.844 | 0.024 |
| ``ssl`` without the contrastive term | 0.478 / - | 0.700 / - | 0.046 |
| ``ssl`` without the views' flips | 0.388 / - | 0.625 / - | - |
| ``ssl``, backbone lr x2.5 (random init with x2.5: 0.604) | 0.441 / - | 0.690 / - | 0.040 |
| MAE only, visible patches at weight 1 (``mae``) | 0.553 / 0.576 | 0.733 / 0.727 | 0.041 |
| the same, mask ratio 0.5 | 0.517 / - | 0.754 / - | - |
| the same, 3000 steps | 0.554 / 0.583 | 0.743 / 0.736 | - |

- The fine-tune carries a backbone's pose knowledge end to end: from a backbone that already
  localises keypoints (trained on other images) it gains 0.14-0.19 AP over random init.
- The SSL stand-ins' starts underfit (train AP 0.62-0.73 against 0.78-0.80): it is not overfitting.
  Their weights are ~2x random init's RMS, so AdamW's steps are relatively half as large; a 2.5x
  backbone lr lifts the ``ssl`` start by 0.08 AP, but random init gains 0.06 from it too.
- The contrastive term costs pose the most (0.478 -> 0.366 when added), not through its flips.
  Reconstructing the visible patches at full weight keeps what pose needs best (0.478 -> 0.553).
- ``mae`` chose its settings on these seeds, where it beat random init by 0.01-0.02 AP. Quoted on
  another set and other seeds (``--pretrain mae --tasks seg,normal,pointmap,albedo,depth --set
  synthetic.height=64 synthetic.width=48 synthetic.seed=1 --seeds 3,4,5``, then ``--tasks pose
  --steps 1000`` with ``--checkpoint`` its ``mae_backbone.safetensors``; stand-in 306 s, loss 2.031
  -> 0.716; load 2-3):

| task | metric | probe | fine-tune | fine-tune (random init) | fine-tune vs probe | vs random init |
| seg | mIoU (higher) | 0.4363 ± 0.0002 | 0.4413 ± 0.0028 | 0.4019 ± 0.0044 | better (clear), 3/3 | better (clear), 3/3 |
| normal | mean_angle (lower) | 32.682 ± 0.236 | 30.447 ± 0.228 | 31.535 ± 0.293 | better (clear), 3/3 | better (clear), 3/3 |
| pointmap | l2 (lower) | 0.6076 ± 0.0892 | 0.4579 ± 0.0265 | 0.4702 ± 0.0064 | better (clear), 3/3 | better, 1/3 |
| albedo | mae (lower) | 0.1343 ± 0.0020 | 0.1240 ± 0.0016 | 0.1299 ± 0.0034 | better (clear), 3/3 | better (clear), 3/3 |
| depth | rmse (lower) | 0.1742 ± 0.0017 | 0.1692 ± 0.0028 | 0.1810 ± 0.0028 | better (clear), 3/3 | better (clear), 3/3 |
| depth | delta1 (higher) | 46.33 ± 0.33 | 46.69 ± 1.12 | 44.83 ± 0.13 | better, 2/3 | better (clear), 3/3 |
| pose | AP (higher) | 0.3739 ± 0.0102 | 0.4759 ± 0.0463 | 0.5494 ± 0.0319 | better (clear), 3/3 | WORSE (clear), 0/3 |

(pose per seed: fine-tune 0.523 / 0.431 / 0.474 against random init 0.589 / 0.535 / 0.525.) One
label-free backbone, the v1 objective, beats its frozen probe on all six tasks and random init on
five (pointmap on the mean only, 1/3 seeds); on albedo clearly, where the 128x96 runs above tied.
Its pose gain on seeds 0 and 1 was selection: at 64x48 pose loses to random init by 0.07 AP on fresh
seeds, and by 0.075 with 3000 fine-tune steps (seed 3: 0.601 against 0.676).

At 128x96 it wins. The ``mae`` stand-in trained at 128x96 (1500 steps, 614 s, loss 2.031 -> 0.558; the
weights ``--pretrain mae`` gives, from an ad hoc call with the same settings, which at 64x48 matched
this file's export bit for bit), then ``--checkpoint <it> --tasks pose --steps 2000 --set
synthetic.seed=1 --seeds S`` for S = 3, 4, 5 (three processes side by side, load 2-3; merged):

| task | metric | probe | fine-tune | fine-tune (random init) | fine-tune vs probe | vs random init |
| pose | AP (higher) | 0.5333 ± 0.0162 | 0.8531 ± 0.0110 | 0.8051 ± 0.0220 | better (clear), 3/3 | better (clear), 3/3 |

(per seed: fine-tune 0.865 / 0.843 / 0.851 against random init 0.813 / 0.823 / 0.779; probe 0.551 /
0.530 / 0.519; AP50 1.0 / 1.0 / 1.0 against 0.97 / 1.0 / 1.0; ~8 min per fine-tune.) Seeds 3 and 4
were also run by the ad hoc script first and gave the same four values to every printed digit. The frozen
features probe 0.52-0.55 here; on the seed-0 set the ``ssl`` stand-in's and the platform's probed
0.31-0.41 and a random backbone's 0.34-0.45 (the sections above). It is the first label-free start
whose frozen features carry pose information, and the first to beat random init on pose end to
end. At 64x48 (12 patches, 3 visible under MAE's 0.75 mask) the same recipe does not.
The same 128x96 backbone on the other five tasks (``--tasks seg,normal,pointmap`` and ``--tasks
albedo,depth``, 200 steps, ``--set synthetic.seed=1 --seeds 3``; albedo also ``--seeds 4`` and ``5``;
merged, load 2-4):

| task | metric | probe | fine-tune | fine-tune (random init) | fine-tune vs probe | vs random init |
| seg | mIoU (higher) | 0.5168 | 0.5728 | 0.4905 | better, 1/1 | better, 1/1 |
| normal | mean_angle (lower) | 27.731 | 24.688 | 26.561 | better, 1/1 | better, 1/1 |
| pointmap | l2 (lower) | 0.3128 | 0.3039 | 0.3221 | better, 1/1 | better, 1/1 |
| depth | rmse (lower) | 0.1613 | 0.1531 | 0.1622 | better, 1/1 | better, 1/1 |
| depth | delta1 (higher) | 47.18 | 48.93 | 46.96 | better, 1/1 | better, 1/1 |
| albedo | mae (lower) | 0.1069 ± 0.0036 | 0.0950 ± 0.0017 | 0.0967 ± 0.0025 | better (clear), 3/3 | better, 2/3 |

(albedo per seed: fine-tune 0.0956 / 0.0963 / 0.0930 against random init 0.0939 / 0.0989 / 0.0972.)
So this one label-free backbone at 128x96 beats its frozen probe and random init on all six tasks:
pose on three seeds (clear), albedo on the mean of three (2/3), the other four on one seed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
for _key, _value in {
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "RAY_USAGE_STATS_ENABLED": "0",
    "HF_HUB_OFFLINE": "1",
    "YOLO_OFFLINE": "1",
    "YOLO_AUTOINSTALL": "0",
}.items():
    os.environ.setdefault(_key, _value)

import torch  # noqa: E402

from evaluation.finetune.config import FinetuneConfig  # noqa: E402
from infra.config import load_config  # noqa: E402

# The fine-tune recipe compared here (on top of configs/finetune_tiny.yaml; --set goes on top):
# horizontal flips only (left/right classes, normals and points mirrored). See the docstring.
RECIPE = ["augment.rotation_prob=0", "augment.scale=[1.0,1.0]", "augment.photometric_prob=0"]
# One evaluation protocol for the three runs: the probe's pose evaluator has no flip test, so the
# fine-tunes are scored without it too (the fine-tune stage's default is flip_test=true).
PROTOCOL = ["flip_test=false"]
# Depth's other two metrics, beside its AbsRel. (The metric-Z target's split of AbsRel into the
# figure's distance and its shape, abs_rel_aligned / log_scale_err, was dropped with that target:
# the relative target has no distance, and abs_rel_aligned came out within 3% of AbsRel.)
DEPTH_METRICS = {"rmse": "lower", "delta1": "higher"}
HEADLINE = {
    "seg": ("mIoU", "higher"),
    "normal": ("mean_angle", "lower"),
    "pointmap": ("l2", "lower"),
    "albedo": ("mae", "lower"),
    "depth": ("abs_rel", "lower"),
    "pose": ("AP", "higher"),
}


# The label-free stand-ins (``evaluation.warmup.ssl_warmup`` settings): "ssl" is the Sapiens2-like
# objective (MAE + contrastive); "mae" is MAE alone, the Sapiens v1 objective, with the visible
# patches reconstructed at full weight (see the docstring's pose section for why).
STANDINS = {"ssl": {}, "mae": {"contrastive_weight": 0.0, "visible_weight": 1.0}}


def ssl_backbone(out: Path, steps: int, hw: tuple[int, int], kind: str = "ssl") -> Path:
    from evaluation.warmup import ssl_warmup, synthetic_stream
    from models import build_backbone, save_state_dict_file

    torch.manual_seed(0)
    backbone = build_backbone("sapiens2_tiny")
    t0 = time.time()
    losses = ssl_warmup(
        backbone,
        synthetic_stream(512, hw, seed=1000)["images"],
        steps=steps,
        batch_size=16,
        lr=1.5e-3,
        **STANDINS[kind],
    )
    print(
        f"{kind} stand-in: {steps} steps in {time.time() - t0:.0f}s, loss {losses[0]:.3f} -> {losses[-1]:.3f}",
        flush=True,
    )
    return save_state_dict_file(
        backbone, out / f"{kind}_backbone.safetensors", metadata={"standin": kind, "steps": steps}
    )


def finetune(cfg: FinetuneConfig, task: str, inputs, out: Path) -> dict[str, float]:
    from evaluation.finetune.data import train_loader
    from evaluation.finetune.engine import build_finetuner, evaluate, train_step

    torch.manual_seed(cfg.seed)
    ft = build_finetuner(cfg, task, inputs, device=torch.device("cpu"))
    t0 = time.time()
    for step, batch in enumerate(
        train_loader(
            ft.train_set,
            global_batch=cfg.batch_size_per_worker,
            seed=cfg.seed,
            start=0,
            stop=cfg.steps,
            rank=0,
            world=1,
            workers=0,
        )
    ):
        train_step(ft, batch, step)
    return {**evaluate(ft).compute(), "seconds": time.time() - t0}


def probe(cfg: FinetuneConfig, task: str, inputs, out: Path) -> dict[str, float]:
    from evaluation.features import FrozenBackbone, load_frozen_backbone
    from evaluation.finetune.engine import task_settings
    from evaluation.probe_trainer import run_probe

    backbone = load_frozen_backbone(cfg.backbone.name, cfg.backbone.checkpoint, seed=cfg.seed)
    s = dataclasses.replace(
        task_settings(cfg, task, inputs),
        steps=cfg.steps,
        lr=cfg.optim.lr,
        batch_size=cfg.batch_size_per_worker,
        warmup_steps=cfg.optim.warmup_steps,
    )
    extractor = FrozenBackbone(backbone, [cfg.feature_block])
    return run_probe(task, s, inputs.data, extractor, out / f"probe_{task}", seed=cfg.seed)


def _stats(values: list[float]) -> tuple[float, float]:
    """Mean and half the range (max - min) / 2 over seeds."""
    return sum(values) / len(values), (max(values) - min(values)) / 2


def verdict(values: list[float], refs: list[float], better: str) -> str:
    """On the seed means, and how many seeds (paired: same seed, same data order) win; "clear"
    when every fine-tune seed beats every baseline seed (the ranges do not overlap; 2+ seeds)."""
    sign = 1 if better == "higher" else -1
    mean, ref = _stats(values)[0], _stats(refs)[0]
    wins = sum(sign * (v - r) > 0 for v, r in zip(values, refs))
    word = "better" if sign * (mean - ref) > 0 else ("same" if mean == ref else "WORSE")
    clear = sign * (min(values) - max(refs)) > 0 if sign > 0 else sign * (max(values) - min(refs)) > 0
    clear_worse = sign * (max(values) - min(refs)) < 0 if sign > 0 else sign * (min(values) - max(refs)) < 0
    tag = " (clear)" if len(values) > 1 and ((word == "better" and clear) or (word == "WORSE" and clear_worse)) else ""
    return f"{word}{tag}, {wins}/{len(values)} seeds"


def table(results: dict) -> str:
    """``results[task][run]``: the headline metric per seed."""

    def cell(v: list[float]) -> str:
        m, h = _stats(v)
        return f"{m:.4f} ± {h:.4f}"

    lines = [
        "| task | metric | probe | fine-tune | fine-tune (random init) | fine-tune vs probe | vs random init |",
        "|---|---|---|---|---|---|---|",
    ]
    for task, r in results.items():
        for name, better in [HEADLINE[task], *(DEPTH_METRICS.items() if task == "depth" else [])]:
            p, f, rnd = ([m[name] for m in r[k]] for k in ("probe", "finetune", "finetune_random"))
            lines.append(
                f"| {task} | {name} ({better}) | {cell(p)} | {cell(f)} | {cell(rnd)} | "
                f"{verdict(f, p, better)} | {verdict(f, rnd, better)} |"
            )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/bench/finetune_vs_probe")
    ap.add_argument("--tasks", default="seg,normal,pointmap,albedo,depth")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument(
        "--task-steps",
        nargs="*",
        default=[],
        metavar="TASK=STEPS",
        help="another step count for a task's three runs (e.g. pose=1000)",
    )
    ap.add_argument("--pretrain", choices=[*STANDINS, "synthetic", "demo"], default="ssl")
    ap.add_argument("--pretrain-steps", type=int, default=1500)
    ap.add_argument("--pretrain-images", type=int, default=512, help="--pretrain synthetic: figures rendered")
    ap.add_argument(
        "--pretrain-set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="--pretrain synthetic/demo: settings over configs/pretrain_tiny.yaml",
    )
    ap.add_argument("--seeds", default="0,1,2", help="every run once per seed (head init, data order, augmentation)")
    ap.add_argument("--checkpoint", default="", help="an official-layout backbone to use instead of pretraining one")
    ap.add_argument("--set", nargs="*", default=[], help="key=value overrides of configs/finetune_tiny.yaml")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    tasks = args.tasks.split(",")
    cfg = load_config(
        FinetuneConfig,
        REPO / "configs" / "finetune_tiny.yaml",
        [f"output_dir={out}", f"tasks=[{', '.join(tasks)}]", f"steps={args.steps}", *RECIPE, *PROTOCOL, *args.set],
    )
    hw = (cfg.synthetic.height, cfg.synthetic.width)
    cfg = dataclasses.replace(cfg, **{t: dataclasses.replace(cfg.task(t), image_size=list(hw)) for t in tasks})
    steps = {t: cfg.steps for t in tasks}
    for item in args.task_steps:
        task, _, n = item.partition("=")
        if task not in steps or not n.isdigit() or int(n) < 1:
            ap.error(f"--task-steps {item!r}: expected TASK=STEPS with TASK one of --tasks ({', '.join(tasks)})")
        steps[task] = int(n)
    checkpoint = args.checkpoint or _pretrained(args, out, hw)
    return _compare(cfg, checkpoint, steps, out, [int(x) for x in args.seeds.split(",")])


def _pretrained(args, out: Path, hw: tuple[int, int]) -> str:
    """The pretrained backbone's file: the SSL stand-in, or the platform's pretraining stage on
    curated shards (of rendered figures, or of the demo corpus)."""
    if args.pretrain in STANDINS:
        return str(ssl_backbone(out, args.pretrain_steps, hw, args.pretrain))
    sys.path.insert(0, str(REPO / "benchmarks"))
    from probe_trained_vs_random import pretrain_on_demo, pretrain_on_synthetic

    if args.pretrain == "demo":
        return pretrain_on_demo(out / "demo", args.pretrain_steps, args.pretrain_set)["student_weights"]
    return pretrain_on_synthetic(out / "synthetic", args.pretrain_steps, args.pretrain_images, hw, args.pretrain_set)[
        "student_weights"
    ]


def _compare(cfg: FinetuneConfig, checkpoint: str, steps: dict[str, int], out: Path, seeds: list[int]) -> int:
    """``steps``: each task's step count (the same for its three runs)."""
    from evaluation.finetune.tasks import resolve_inputs

    pretrained = dataclasses.replace(cfg, backbone=dataclasses.replace(cfg.backbone, checkpoint=checkpoint))
    inputs = resolve_inputs(cfg, out)
    runs = {"probe": (probe, pretrained), "finetune": (finetune, pretrained), "finetune_random": (finetune, cfg)}
    results = {}
    for task, n in steps.items():
        results[task] = {k: [] for k in runs}
        for seed in seeds:
            for kind, (fn, c) in runs.items():
                results[task][kind].append(fn(dataclasses.replace(c, seed=seed, steps=n), task, inputs[task], out))
            print(
                f"{task} seed {seed}: "
                + "  ".join(
                    f"{k} {HEADLINE[task][0]}={v[-1][HEADLINE[task][0]]:.4f}" for k, v in results[task].items()
                ),
                flush=True,
            )
    o = cfg.optim
    print(
        f"\nsteps per run {steps}, batch {cfg.batch_size_per_worker}, {cfg.synthetic.height}x{cfg.synthetic.width}, "
        f"seeds {seeds} (mean ± half-range), "
        f"backbone {cfg.backbone.name} ({checkpoint})\nfine-tune: lr {o.lr} (the probe's too), backbone x"
        f"{o.backbone_lr_scale}, layer decay {o.layer_decay}, backbone frozen for {o.freeze_backbone_steps} steps, "
        f"warm-up {o.warmup_steps}, augment {'on' if cfg.augment.enabled else 'off'} (rotation p "
        f"{cfg.augment.rotation_prob}, scale {list(cfg.augment.scale)}), flip test {cfg.flip_test}\n" + table(results)
    )
    if "depth" in results:
        for kind, runs_ in results["depth"].items():
            print(
                f"depth {kind} per seed: "
                + "; ".join(", ".join(f"{k} {m[k]:.4f}" for k in ("rmse", "abs_rel", "delta1")) for m in runs_)
            )
    (out / "bench.json").write_text(
        json.dumps(
            {
                "steps": steps,
                "seeds": seeds,
                "checkpoint": checkpoint,
                "synthetic": dataclasses.asdict(cfg.synthetic),
                "optim": dataclasses.asdict(o),
                "results": results,
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
