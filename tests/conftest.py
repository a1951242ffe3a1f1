"""Test-wide settings: offline, no telemetry, caches in temp folders; one local Ray for the session."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import pytest

from tests.browser import chromium, open_html  # noqa: F401 - the session's browser fixtures

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
ASSETS = SHARED / "assets"
IMAGES = ASSETS / "images"  # the shared real photos (see shared/assets/PROVENANCE.md)
CENTERNET = ASSETS / "models" / "person_centernet_512.onnx"
TINY_REFERENCE = SHARED / "reference" / "sapiens2_parity_tiny.safetensors"  # the demo's embedding weights

_tmp = tempfile.mkdtemp(prefix="hv-test-env-")
for key, value in {
    "HF_HUB_OFFLINE": "1",
    "YOLO_OFFLINE": "1",
    "YOLO_AUTOINSTALL": "0",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "1",
    "YOLO_CONFIG_DIR": os.path.join(_tmp, "yolo"),
    "MPLCONFIGDIR": os.path.join(_tmp, "mpl"),
    "HF_HOME": os.path.join(_tmp, "hf"),
    "TORCH_HOME": os.path.join(_tmp, "torch"),
    "XDG_CACHE_HOME": os.path.join(_tmp, "cache"),
    "RAY_USAGE_STATS_ENABLED": "0",
}.items():
    os.environ[key] = value
os.environ.pop("MLFLOW_TRACKING_URI", None)
os.environ.pop("RAY_ADDRESS", None)


# What makes a test slow: a Ray cluster (``ray_local`` or anything built on it: curation runs,
# Ray Train), a benchmark run as a script (``bench``), an S3 server (``s3``), a subprocess job, a
# browser. ``make test-fast`` (``-m "not slow"``) runs the rest.
SLOW_FIXTURES = {"ray_local", "bench", "s3"}


# ``make test`` runs the tests on two pytest-xdist workers (``-n 2 --dist loadfile``): each file is
# one unit of work (its module fixtures are made once), except that the files sharing one of these
# expensive session runs form one unit, so that run is made once, on one worker. Those units go
# first (``--no-loadscope-reorder`` keeps the collection order): the longest start earliest.
# ``runs_abc`` is the audit tests' curation runs B and C (tests/curation/audit/conftest.py).
SHARED_RUNS = {  # fixture -> unit
    "demo_run": "demo-run",
    "pretrain_reference": "pretrain-runs",
    "distill_reference": "distill-runs",
    "runs_abc": "audit-runs",
}
SHARED_RUN_FILES = {  # file -> unit
    "tests/curation/audit/test_audit_versions.py": "audit-runs",
    "tests/curation/audit/test_explore_pages.py": "audit-runs",
    "tests/pipelines/test_dag.py": "demo-run",
    "tests/pipelines/test_demo.py": "demo-run",
    "tests/training/test_pretrain_crash_resume.py": "pretrain-runs",
    "tests/training/test_pretrain_e2e.py": "pretrain-runs",
    "tests/training/test_pretrain_init.py": "pretrain-runs",
    "tests/training/test_distill_e2e.py": "distill-runs",
    "tests/training/test_distill_crash_resume.py": "distill-runs",
}


# Then the longest single files (an order hint only, from docs/results/test_loop.md; a file
# missing here just starts in collection order): a long unit left to the end would run alone.
LONG_FILES = [
    "tests/evaluation/finetune/test_finetune_crash_resume.py",
    "tests/curation/test_resume.py",
    "tests/training/test_v1_pretrain_e2e.py",
    "tests/benchmarks/test_probe_trained_vs_random.py",
    "tests/benchmarks/test_curate_scale.py",
    "tests/evaluation/annotate/test_annotate_resume.py",
    "tests/curation/test_object_store.py",
]


def work_unit(nodeid: str) -> str:
    file = nodeid.split("::")[0]
    return SHARED_RUN_FILES.get(file, file)


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` with the shared runs' files as one unit each (see ``SHARED_RUN_FILES``)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedRunScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return SharedRunScheduling(config, log)


def pytest_collection_modifyitems(items) -> None:
    """Every test that needs one of ``SLOW_FIXTURES`` is ``slow``, whether or not its file says so;
    the shared runs' units first, then ``LONG_FILES``; a test using a shared run from a file not
    listed is refused."""
    first = list(dict.fromkeys(SHARED_RUNS.values()))
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if SLOW_FIXTURES & fixtures:
            item.add_marker(pytest.mark.slow)
        for name in fixtures & SHARED_RUNS.keys():
            if work_unit(item.nodeid) != SHARED_RUNS[name]:
                raise pytest.UsageError(
                    f"{item.nodeid} uses {name}: add its file to SHARED_RUN_FILES (tests/conftest.py)"
                )
    first += LONG_FILES
    items.sort(key=lambda item: first.index(u) if (u := work_unit(item.nodeid)) in first else len(first))


@pytest.fixture(scope="session")
def ray_local():
    """An in-process local Ray cluster for the test session (ended by ray.shutdown, not `ray stop`)."""
    import ray

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        object_store_memory=400 * 2**20,
    )
    import ray.data

    from infra.ray_runtime import use_shuffle

    ray.data.DataContext.get_current().enable_progress_bars = False
    use_shuffle("sort")  # as init_ray does for a local cluster (RayConfig.shuffle)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def centernet_path() -> Path:
    if not CENTERNET.is_file():
        pytest.fail(f"the real person detector is missing: {CENTERNET} (see shared/assets/PROVENANCE.md)")
    return CENTERNET


@pytest.fixture(scope="session")
def demo_curated(tmp_path_factory, ray_local, centernet_path):
    """The demo corpus curated once for the session with the curation tests' settings
    (``tests.curation.test_pipeline.demo_config``: real CenterNet detector, real OCR, weightless
    content filters, the demo's per-sample attributes: a Sapiens2 tiny embedding and cluster ids),
    in this process on ``ray_local``: ``(root, expected, cfg, result)`` with the
    corpus in ``root/raw``, the output in ``root/curated`` and its MLflow store ``root/mlflow.db``.
    Tests that read a finished curated version share it; none may change what is in it."""
    from curation.pipeline import run_curation
    from pipelines.demo_corpus import build_demo_corpus
    from tests.curation.test_pipeline import demo_config

    root = tmp_path_factory.mktemp("demo-curated")
    expected = build_demo_corpus(root / "raw")
    cfg = demo_config(root / "raw", root / "curated", centernet_path, attributes=True)
    return root, expected, cfg, run_curation(cfg)


def kill_when(proc, ready, *, timeout: float, leftovers: str, poll: float = 0.2) -> None:
    """Wait until ``ready()`` holds, then SIGKILL ``proc``'s whole process group (it must have
    been started with ``start_new_session=True``), and any process still naming ``leftovers``
    (the Ray temp dir only this test uses). Fails if ``proc`` ended before it could be killed."""
    import os
    import signal
    import time

    from infra.local_cluster import kill_pids, pids_naming

    deadline = time.time() + timeout
    try:
        while time.time() < deadline and proc.poll() is None and not ready():
            time.sleep(poll)
        assert proc.poll() is None, "the job ended before it could be killed; make it longer"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        time.sleep(2)
        kill_pids(pids_naming(leftovers))


def in_process(cmd: list[str]) -> None:
    """Run a job command (``[python, pipelines/<name>.py, *args]``) in this process, through the
    script's own ``main``, on the session's Ray (``ray_local`` must be up): an uninterrupted
    reference for a crash-and-resume test without a second interpreter and cluster of its own."""
    import importlib

    script = Path(cmd[1])
    assert script.parent == REPO / "pipelines", script
    assert importlib.import_module(f"pipelines.{script.stem}").main(cmd[2:]) == 0, cmd


@contextlib.contextmanager
def alongside(cmd: list[str], *, log: Path, leftovers: str, env: dict | None = None, timeout: float = 1200):
    """Run ``cmd`` (an uninterrupted reference job) in its own session while the body runs: most
    of a small job is waiting on Ray to start, so a crash-and-resume test overlaps the two. Its
    stderr goes to ``log`` (a pipe could fill and stall it). When the body ends normally, the job
    must end with exit 0 within ``timeout``; when the body raises, the job's whole group and any
    process naming ``leftovers`` (its Ray temp dir) are SIGKILLed."""
    import signal
    import subprocess

    from infra.local_cluster import kill_pids, pids_naming

    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=fh)
    try:
        yield proc
        assert proc.wait(timeout=timeout) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            kill_pids(pids_naming(leftovers))
