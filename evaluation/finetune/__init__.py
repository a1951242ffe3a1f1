"""End-to-end fine-tuning (post-training): the whole backbone and a light task head trained
together on Ray Train with FSDP2, layer-wise learning-rate decay, DCP checkpoints with exact
resume, and exports in the released layout (``backbone.`` + ``decode_head.`` keys).

Entry point: ``evaluation.finetune.run.run_finetune(cfg)`` (``pipelines/finetune.py`` on the
command line; ``evaluation.finetune.stage.FinetuneStage`` in the DAG). Pieces: ``config``
(settings), ``optim`` (layer-wise decay, the reference's schedule), ``tasks`` (model, losses,
depth, label checks), ``augment`` (per-task augmentations), ``data`` (resumable step-indexed
batches), ``engine`` (one process's training and evaluation), ``loop`` (the Ray Train
worker), ``run`` (the driver), ``pose_eval`` (flip test, common-keypoint protocol, detector boxes).
"""
