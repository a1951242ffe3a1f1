"""A stage as a Ray job: its resolved config written next to its outputs, then
``python pipelines/<script> --config <that YAML>`` submitted with Ray's job submission SDK
and followed until it ends."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from infra.config import dump_config

log = logging.getLogger("dag")

# The job's working_dir: the repo this package ships in, less what a job never needs to read.
REPO = Path(__file__).resolve().parents[2]
EXCLUDES = [".venv", "runs", ".git", "*.tar", "*.parquet"]
STAGE_CONFIG = "stage_config.yaml"


def write_stage_config(folder: Path, cfg: Any) -> str:
    path = folder / STAGE_CONFIG
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_config(cfg))
    return str(path)


def submit_ray_job(address: str, script: str, config_path: str, timeout_s: int) -> None:
    """Run ``python pipelines/<script> --config <yaml>`` as a Ray job and wait for it."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(address)
    job_id = client.submit_job(
        entrypoint=f"python pipelines/{script} --config {config_path}",
        runtime_env={"working_dir": str(REPO), "excludes": EXCLUDES},
    )
    log.info("submitted %s as Ray job %s", script, job_id)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        status = client.get_job_status(job_id)
        if status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
            break
        time.sleep(2)
    else:
        client.stop_job(job_id)
        raise TimeoutError(f"Ray job {job_id} ({script}) did not finish within {timeout_s}s")
    if status != JobStatus.SUCCEEDED:
        logs = client.get_job_logs(job_id)
        raise RuntimeError(f"Ray job {job_id} ({script}) ended {status}:\n{logs[-4000:]}")
