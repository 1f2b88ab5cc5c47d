#!/usr/bin/env bash
# Checks (and, as root with apt, installs) what spark-eos needs outside Python: Java 17 and PostgreSQL binaries.
set -euo pipefail

have_java() { command -v java >/dev/null 2>&1 && java -version 2>&1 | grep -qE 'version "(17|21)'; }
have_pg() { command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; }

install() {
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "check-tools: installing $* with apt-get" >&2
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  else
    return 1
  fi
}

if ! have_java; then
  install openjdk-17-jre-headless || {
    echo "check-tools: Java 17 is missing (Spark 4 needs it). Install it, e.g. 'apt-get install openjdk-17-jre-headless', and put java on PATH." >&2
    exit 1
  }
fi
# A Postgres named by EOS_POSTGRES_DSN (or a container-only run) needs no local server binaries.
if [ -z "${EOS_POSTGRES_DSN:-}" ] && [ "${EOS_SERVICES:-auto}" != "container" ] && ! have_pg; then
  install postgresql-15 || {
    echo "check-tools: PostgreSQL binaries (initdb, pg_ctl, postgres) are missing. Install them, e.g. 'apt-get install postgresql-15', or set EOS_POSTGRES_DSN to a running server with max_prepared_transactions > 0." >&2
    exit 1
  }
fi
