# Stand-in for postgres:15 (build-standins.sh): Debian's PostgreSQL 15.
FROM python:3.11-slim-bookworm
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql-15 \
    && rm -rf /var/lib/apt/lists/*
ENV PATH=/usr/lib/postgresql/15/bin:$PATH PGDATA=/var/lib/postgresql/data
COPY postgres-entry.sh /postgres-entry.sh
ENTRYPOINT ["/bin/bash", "/postgres-entry.sh"]
