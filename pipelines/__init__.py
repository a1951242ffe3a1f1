"""The top floor: command-line entry points (``python pipelines/<job>.py --config ...``, also
what a Ray job runs) and ``pipelines.chain``, the curate -> pretrain -> probe chain that
puts the stages together."""
