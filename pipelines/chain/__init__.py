"""The chain: curate -> pretrain -> [distill ->] [finetune ->] probe [-> annotate] runs that reuse
what did not change and resume what failed.

Thin on purpose: Ray runs the work and MLflow keeps the record; there is no scheduler here.
Each stage is reached through its package's facade, an ``infra.stage.Stage``
(``curation.stage.CurateStage``, ``training.stage.PretrainStage`` / ``DistillStage``,
``evaluation.finetune.stage.FinetuneStage``, ``evaluation.stage.ProbeStage``,
``evaluation.annotate.stage.AnnotateStage``): its identity, its
config placed in a folder, an in-process run, its result (a dataclass) read back from its files,
and the script a Ray job runs.

- **Identity.** Each stage's identity is a digest of its resolved configuration (the part
  that decides its outputs) and of its inputs' digests: curation = job digest + curation
  code version + input listing; pretraining = run-defining settings + dataset version id (+ the
  sha256 of ``init`` files); distillation = the same + the teacher file's sha256 (by default the
  pretraining's export; the distilled student is then what fine-tuning and probing take);
  fine-tuning = its settings + checkpoint digest + data digest (it fine-tunes the checkpoint
  the probes get); probing = probe settings + checkpoint digest; annotation = its settings +
  dataset version id + the labelling checkpoints' digests (by default the fine-tune's exports:
  pseudo-labels of the curated version). Its outputs live in
  ``<workspace>/<stage>/<identity>``.
- **Reuse.** A stage whose identity has a finished result (``DONE.json``: the result's fields,
  written only after the stage succeeded) is not run again; its recorded result feeds the next
  stage.
- **Resume.** A stage that failed or was killed is run again into the same folder, and each
  stage resumes itself there: curation skips committed partitions, pretraining restarts
  from its newest DCP checkpoint (same Ray Train run name), probing redoes its probes,
  annotation redoes the shards it had not committed.
- **Where.** ``submit=local`` runs the stages in this process (on a local or given Ray);
  ``submit=ray_job`` submits each stage as a Ray job (``python pipelines/<stage>.py --config
  <its resolved YAML>``) to ``job_address`` with Ray's job submission SDK and follows its
  status until it ends (``pipelines.chain.jobs``).
- **Record.** One MLflow parent run per DAG invocation; each stage's run becomes its child
  (``mlflow.parentRunId``) with lineage tags. A reused stage gets a small child run that
  points at the run that produced it (``dag.reused_run_id``).
"""

from pipelines.chain.config import STAGES, DagConfig, DagInputs
from pipelines.chain.run import DagResult, StageOutcome, run_dag

__all__ = ["STAGES", "DagConfig", "DagInputs", "DagResult", "StageOutcome", "run_dag"]
