#!/bin/sh
# spark-eos/postgres entrypoint: initdb into the data volume on first start, then run postgres as
# PID 1 (so `docker kill` is a real crash of the postmaster) on 127.0.0.1:$PG_PORT.
set -eu
PGDATA=${PGDATA:-/var/lib/eos-postgres/data}
PG_PORT=${PG_PORT:-5432}
BIN=/usr/lib/postgresql/15/bin
as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }

mkdir -p "$PGDATA"
chown postgres:postgres "$PGDATA" "$(dirname "$PGDATA")"
chmod 0700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    as_postgres "$BIN/initdb" -D "$PGDATA" -U postgres --auth=trust --encoding=UTF8 --locale=C.UTF-8 >/dev/null
fi
exec setpriv --reuid=postgres --regid=postgres --init-groups "$BIN/postgres" -D "$PGDATA" -p "$PG_PORT" \
    -c listen_addresses=127.0.0.1 -c unix_socket_directories=/tmp \
    -c max_prepared_transactions=64 -c fsync=on -c jit=off "$@"
