# Stand-in for minio/minio and minio/mc (build-standins.sh, standins.yaml).
FROM python:3.11-slim-bookworm
RUN pip install --no-cache-dir "moto[server]" boto3
