# syntax=docker/dockerfile:1.7
# The MLflow tracking server: mlflow with the PostgreSQL driver and the S3 client, nothing
# else (no CUDA, no torch; the platform image is ~10x larger). Build from the repository root:
#
#   docker build -f infra/docker/mlflow.Dockerfile -t registry.example.com/humanvision-mlflow:3.17.2 .
#
# Pin the base by digest in production (BASE_IMAGE=python:3.11.13-slim-bookworm@sha256:...).
ARG BASE_IMAGE=python:3.11.13-slim-bookworm
FROM ${BASE_IMAGE}

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    MLFLOW_DISABLE_TELEMETRY=true \
    DO_NOT_TRACK=1 \
    MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false

COPY infra/docker/mlflow-requirements.txt /tmp/mlflow-requirements.txt
RUN pip install -r /tmp/mlflow-requirements.txt \
 && python -c "import mlflow, psycopg2, boto3; assert mlflow.__version__ == '3.17.2', mlflow.__version__"

# Non-root; the server keeps no state on local disk (runs in PostgreSQL, artifacts in S3).
RUN groupadd --gid 1000 mlflow && useradd --uid 1000 --gid 1000 --create-home mlflow
USER mlflow
WORKDIR /home/mlflow
EXPOSE 5000
ENTRYPOINT ["mlflow"]
CMD ["server", "--help"]
