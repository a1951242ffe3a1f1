"""The curation job: prepare -> plan -> pass 1 -> global dedup -> pass 2 (survivors) -> ... -> write -> finish.

``run_curation`` runs the recipe (``curation.recipe``) in these steps, each in a module named for it:

1. **Prepare** (``curation.job``): build the recipe from the config (every start-up check, before
   any Ray work), digest the job, claim the output folder (refusing one that holds another job).
2. **Plan** the input into partitions with deterministic ids; skip what is already done.
3. **Pass 1** over every partition not yet complete: read -> the cheap row steps, into staging
   (``curation.passes``).
4. **Global steps** of each pass (exact, near, semantic dedup) on staged metadata, across the run;
   **pass 2** and later over the survivors only, the model steps on actor pools.
5. **Write** each partition's shards and manifest part (skipping committed ones) in the writer's
   layout (``curation.finish.write_shards``, ``curation.writer``).
6. **Finish**: stats from the manifest, the dataset version, MLflow, then ``_SUCCESS``.

Resume is by files: a re-run of the same job into the same output redoes only the
partitions that were not complete in the pass where it stopped (the global steps are
recomputed: they are deterministic), and produces byte-identical outputs. A re-run with a
different job configuration into the same output is refused.
"""

from __future__ import annotations

import time

from curation import output, staging
from curation.finish import CurationResult, finish, finished_result, write_shards
from curation.job import prepare
from curation.passes import last_staging, plan, run_passes, score_partitions, start_ray
from curation.recipe import HUMANS1B, CurationConfig
from curation.steps import Recipe


def run_curation(cfg: CurationConfig, recipe: Recipe = HUMANS1B) -> CurationResult:
    """Run (or resume, or recognise as done) one curation job."""
    job = prepare(cfg, recipe)
    if output.CuratedOutput(job.fs, job.root).finished:
        return finished_result(job)
    partitions, written, to_score = plan(job)
    start_ray(job, scoring=bool(to_score))
    t0 = time.time()
    if to_score:
        score_partitions(job, to_score)
    phases = {"score": time.time() - t0}
    pids = [p.id for p in partitions]
    incomplete = [pid for pid in pids if pid not in written and not staging.is_complete(job.fs, job.root, pid)]
    if incomplete:
        raise RuntimeError(
            f"{len(incomplete)} partitions did not complete scoring (e.g. {incomplete[:3]}); re-run to resume"
        )
    pending = [pid for pid in pids if pid not in written]
    phases.update(run_passes(job, pids, pending)[1])
    t = time.time()
    write_shards(job, pids, pending, staged_at=last_staging(job))
    phases["write"], phases["stats_and_tracking"] = time.time() - t, 0.0
    stats = finish(job, len(partitions), phases, t0)
    return finished_result(job, stats, resumed=len(partitions) - len(to_score))
