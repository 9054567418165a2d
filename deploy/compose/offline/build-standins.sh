#!/bin/bash
# Stand-ins for the public images the compose files name, built from Debian's own packages,
# for a Docker host that cannot pull from Docker Hub (this is how the compose files were run
# where they were developed: docs/cluster.md, "What was verified").  As root, on Debian 12,
# with Docker running; then from the repository root:
#   deploy/compose/offline/build-standins.sh
#   docker compose -f deploy/compose/docker-compose.cluster.yaml \
#       -f deploy/compose/offline/standins.yaml up --build --wait
#   python3 deploy/compose/check_cluster.py -f deploy/compose/docker-compose.cluster.yaml \
#       -f deploy/compose/offline/standins.yaml
#
# * python:3.11-slim-bookworm: debootstrap's Debian 12 with Debian's Python 3.11 and its
#   headers, laid out as the official image is (pip's --prefix installs under
#   PREFIX/lib/python3.11/site-packages, a plain install in /usr/local, which is on the
#   path), so deploy/docker/Dockerfile builds unchanged;
# * postgres:15: Debian's PostgreSQL 15 with an entrypoint that honours POSTGRES_USER,
#   POSTGRES_PASSWORD and POSTGRES_DB as the official image does;
# * standin-moto:1: moto's S3 server and boto3, for minio/minio and minio/mc
#   (standins.yaml; moto keeps objects in memory: a restarted cold store is empty).
# CA certificates of /usr/local/share/ca-certificates (a proxy's) are copied into the base.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
command -v debootstrap >/dev/null || apt-get install -y --no-install-recommends debootstrap
root=$work/rootfs
debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian
cp /etc/resolv.conf "$root/etc/resolv.conf"
mkdir -p "$root/usr/local/share/ca-certificates"
cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/" 2>/dev/null || true
chroot "$root" /bin/bash -c "apt-get update -q && DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends python3 python3-pip python3-venv \
    python3-dev ca-certificates && update-ca-certificates && apt-get clean \
    && rm -rf /var/lib/apt/lists/*"
rm -f "$root/etc/resolv.conf" "$root/usr/lib/python3.11/EXTERNALLY-MANAGED"
ln -sf /usr/bin/python3 "$root/usr/local/bin/python"
ln -sf /usr/bin/pip3 "$root/usr/local/bin/pip"
# the official image's layout: installs by prefix go to PREFIX/lib/python3.11/site-packages
sed -i "s/            prefix_scheme = 'posix_local'/            prefix_scheme = 'posix_prefix'/" \
    "$root/usr/lib/python3.11/sysconfig.py"
echo /usr/local/lib/python3.11/site-packages \
    > "$root/usr/lib/python3/dist-packages/official-layout.pth"
# and a plain `pip install` lands in /usr/local, as there
tar -C "$root" -c . | docker import -c 'ENV PIP_PREFIX=/usr/local' -c 'CMD ["python3"]' - \
    python:3.11-slim-bookworm
docker build -t postgres:15 -f "$here/postgres.Dockerfile" "$here"
docker build -t standin-moto:1 -f "$here/moto.Dockerfile" "$here"
