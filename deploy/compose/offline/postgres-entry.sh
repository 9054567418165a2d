# The official image's first start, as far as the compose files use it: a cluster owned by
# POSTGRES_USER with POSTGRES_PASSWORD (scram-sha-256 over TCP), and POSTGRES_DB made.
set -euo pipefail
mkdir -p "$PGDATA" /run/postgresql
chown -R postgres "$PGDATA" /run/postgresql
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    pw=$(mktemp) && chown postgres "$pw" && printf '%s\n' "$POSTGRES_PASSWORD" > "$pw"
    runuser -u postgres -- initdb -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pw" \
        --auth-local=trust --auth-host=scram-sha-256
    rm -f "$pw"
    echo "host all all 0.0.0.0/0 scram-sha-256" >> "$PGDATA/pg_hba.conf"
    runuser -u postgres -- pg_ctl -D "$PGDATA" -w start -o "-c listen_addresses=''"
    runuser -u postgres -- psql -U "$POSTGRES_USER" -d postgres \
        -c "CREATE DATABASE \"$POSTGRES_DB\""
    runuser -u postgres -- pg_ctl -D "$PGDATA" -w stop
fi
exec runuser -u postgres -- postgres -D "$PGDATA" -c listen_addresses='*'
