"""Object storage for real: input read from and output written to S3 (moto's S3 server on
127.0.0.1, through pyarrow), a job killed mid-run resumes there to the same bytes, and the URIs in
the manifest and MLflow stay ``s3://``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from pipelines.demo_corpus import build_demo_corpus
from tests.conftest import REPO, SHARED, alongside, kill_when

pytestmark = pytest.mark.slow
BUCKET = "humanvision-test"


@pytest.fixture
def s3(monkeypatch):
    """A moto S3 server on 127.0.0.1 (a free port); pyarrow in this process and in the jobs' Ray
    workers reach it through AWS_ENDPOINT_URL, so every URI is a plain ``s3://bucket/...``."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1").create_bucket(Bucket=BUCKET)
    try:
        yield pafs.S3FileSystem(endpoint_override=f"{host}:{port}", scheme="http", region="us-east-1")
    finally:
        server.stop()


def test_an_archived_record_of_failed_downloads_fails_the_partition(tmp_path, s3):
    """img2dataset's output on S3 whose Parquet record can be listed but not read (archived to
    Glacier: S3 refuses the GET): the partition fails naming the record, and once the record
    reads, every attempted download is accounted for."""
    import boto3

    from curation.config import InputConfig
    from tests.curation.test_readers import _img2dataset_folder, rows_of

    folder = _img2dataset_folder(tmp_path / "i2d")
    client = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")
    for f in sorted(folder.iterdir()):
        archived = {"StorageClass": "GLACIER"} if f.suffix == ".parquet" else {}
        client.put_object(Bucket=BUCKET, Key=f"i2d/{f.name}", Body=f.read_bytes(), **archived)
    cfg = InputConfig(uri=f"s3://{BUCKET}/i2d")
    with pytest.raises(RuntimeError, match=f"s3://{BUCKET}/i2d/00000.parquet cannot be read \\(OSError: "):
        rows_of(cfg)
    client.put_object(Bucket=BUCKET, Key="i2d/00000.parquet", Body=(folder / "00000.parquet").read_bytes())
    assert sorted(r["source"].rsplit("#", 1)[1] for r in rows_of(cfg)) == [
        "000000000.jpg",
        "000000001.jpg",
        "row=2",
        "row=3",
    ]


def curate(raw: str, out: str, centernet: Path, ray_tmp: str, mlflow_db: Path) -> list[str]:
    return [
        sys.executable,
        str(REPO / "pipelines" / "curate.py"),
        "--config",
        str(REPO / "configs" / "curate_demo.yaml"),
        f"input.uri={raw}",
        f"output_dir={out}",
        f"detector.weights={centernet}",
        "input.images_per_partition=4",
        f"ray.temp_dir={ray_tmp}",
        "ray.progress_bars=off",
        f"tracking.uri=sqlite:///{mlflow_db}",
        "content.text.enabled=false",
        f"backbone_embedding.weights={SHARED / 'reference' / 'sapiens2_parity_tiny.safetensors'}",
    ]  # (OCR is the slow step on CPU; the detector makes pass 2)


def objects(fs: pafs.FileSystem, prefix: str) -> dict[str, bytes]:
    """Shard and manifest objects under ``prefix``, by relative name."""
    found = {}
    for folder in ("shards", "manifest"):
        for info in fs.get_file_info(pafs.FileSelector(f"{prefix}/{folder}", recursive=True, allow_not_found=True)):
            if info.type == pafs.FileType.File:
                with fs.open_input_stream(info.path) as fh:
                    found[info.path[len(prefix) + 1 :]] = fh.read()
    return found


def test_s3_in_and_out_with_a_kill_and_resume(tmp_path, s3, centernet_path):
    import mlflow
    import pyarrow.parquet as pq

    build_demo_corpus(tmp_path / "raw")
    pafs.copy_files(
        str(tmp_path / "raw"), f"{BUCKET}/raw", source_filesystem=pafs.LocalFileSystem(), destination_filesystem=s3
    )
    raw, db = f"s3://{BUCKET}/raw", tmp_path / "mlflow.db"
    ray_a, ray_b = f"/tmp/hvs-{os.getpid()}-a", f"/tmp/hvs-{os.getpid()}-b"
    cmd = curate(raw, f"s3://{BUCKET}/out", centernet_path, ray_b, db)

    def staged():
        listing = s3.get_file_info(pafs.FileSelector(f"{BUCKET}/out/_staging", recursive=True, allow_not_found=True))
        return [i for i in listing if i.base_name.startswith("part-")]

    # The uninterrupted reference run, alongside the killed one, with its own MLflow store (the two
    # never share a SQLite file). The kill waits on the staged objects, not on timing.
    with alongside(
        curate(raw, f"s3://{BUCKET}/ref", centernet_path, ray_a, tmp_path / "ref.db"),
        log=tmp_path / "ref.log",
        leftovers=ray_a,
        timeout=600,
    ):
        proc = subprocess.Popen(
            cmd, env=dict(os.environ), start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        kill_when(proc, lambda: len(staged()) >= 2, timeout=300, leftovers=ray_b)
        assert s3.get_file_info(f"{BUCKET}/out/_SUCCESS").type == pafs.FileType.NotFound
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    assert "already done" in done.stderr and s3.get_file_info(f"{BUCKET}/out/_SUCCESS").type == pafs.FileType.File
    resumed, reference = objects(s3, f"{BUCKET}/out"), objects(s3, f"{BUCKET}/ref")
    assert resumed == reference and any(k.endswith(".tar") for k in resumed)

    manifest = pq.read_table(f"{BUCKET}/out/manifest", filesystem=s3).to_pylist()
    assert manifest and all(r["source"].startswith(f"s3://{BUCKET}/raw/") for r in manifest)
    assert {r["status"] for r in manifest} >= {"kept", "dropped", "error"}
    client = mlflow.MlflowClient(f"sqlite:///{db}")
    runs = client.search_runs(
        [e.experiment_id for e in client.search_experiments()],
        filter_string=f"tags.`curation.output` = 's3://{BUCKET}/out'",
    )
    assert len(runs) == 1 and runs[0].data.tags["dataset.uri"] == f"s3://{BUCKET}/out"
    shards = client.download_artifacts(runs[0].info.run_id, "shards.txt", str(tmp_path)).strip()
    assert all(line.startswith(f"s3://{BUCKET}/out/shards/") for line in Path(shards).read_text().splitlines())
