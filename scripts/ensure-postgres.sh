#!/usr/bin/env bash
# Make sure a PostgreSQL server answers on $PGHOST:$PGPORT (default 127.0.0.1:5432) for the tests.
# Starts the local Debian cluster if it is installed but stopped; installs it if we are root on a
# Debian machine without it. Fails loudly otherwise: the suite must not silently skip PostgreSQL.
set -euo pipefail
host=${PGHOST:-127.0.0.1}
port=${PGPORT:-5432}

ready() { pg_isready -q -h "$host" -p "$port" 2>/dev/null || \
  (command -v psql >/dev/null && psql -h "$host" -p "$port" -U postgres -Atqc 'select 1' >/dev/null 2>&1); }

wait_ready() {
  for _ in $(seq 1 60); do ready && return 0; sleep 0.5; done
  return 1
}

ready && exit 0

if ! command -v pg_ctlcluster >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "PostgreSQL is not installed; installing it (apt-get install postgresql)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  else
    echo "error: no PostgreSQL at $host:$port and none can be installed here" >&2
    exit 1
  fi
fi

version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1)
if [ -z "$version" ]; then
  echo "error: no PostgreSQL cluster found under /etc/postgresql" >&2
  exit 1
fi
echo "starting PostgreSQL $version" >&2
pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
if ! wait_ready; then
  echo "error: PostgreSQL $version did not become ready at $host:$port" >&2
  exit 1
fi
# Tests connect as postgres over TCP without a password (trust), as on the project's machines.
if ! psql -h "$host" -p "$port" -U postgres -Atqc 'select 1' >/dev/null 2>&1; then
  hba=/etc/postgresql/$version/main/pg_hba.conf
  echo "host all postgres 127.0.0.1/32 trust" >> "$hba"
  pg_ctlcluster --skip-systemctl-redirect "$version" main reload
  wait_ready
fi
