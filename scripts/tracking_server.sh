#!/usr/bin/env bash
# A shared MLflow tracking server for calibrun: a private PostgreSQL cluster as the backend store, a local
# folder as the artifact store (served through the tracking server), both bound to loopback.
#
# Usage:
#   scripts/tracking_server.sh start  DIR [PG_PORT] [MLFLOW_PORT]   default ports 5433 and 5000
#   scripts/tracking_server.sh status DIR                           prints the URI; exit 1 when not running
#   scripts/tracking_server.sh stop   DIR                           stops the tracking server, then PostgreSQL
#
# `start` prints the tracking URI (the only line on stdout, e.g. http://127.0.0.1:5000); point calibrun at it:
#   python -m calibrun -m calibration=narrow,match,wide tracking=server tracking.uri=http://127.0.0.1:5000
#
# DIR holds everything and survives a stop/start (runs, artifacts and the password are kept):
#   DIR/pgdata/         the PostgreSQL cluster (initdb on the first start; database "mlflow", role "calibrun")
#   DIR/pgpass          the role's generated password as a libpq password file (mode 0600, not on a command line)
#   DIR/artifacts/      the artifact store (mlflow server --serve-artifacts --artifacts-destination DIR/artifacts)
#   DIR/postgres.log, DIR/mlflow.log, DIR/mlflow.pid, DIR/server.env (ports and URI of the running server)
#
# PostgreSQL listens on 127.0.0.1 only (TCP, no Unix socket, password auth); the tracking server binds
# 127.0.0.1 unless TRACKING_SERVER_HOST says otherwise (binding beyond loopback exposes an unauthenticated
# server: add --allowed-hosts through TRACKING_SERVER_ARGS and put it behind authentication).
# PostgreSQL refuses to run as root: as root the cluster runs as $PG_USER (default postgres, created by the
# distribution's postgresql package), which must be able to enter DIR.
#
# Needs (nothing is installed here; a missing piece is named with the command that installs it):
#   PostgreSQL server binaries  initdb, pg_ctl, postgres, psql    Debian/Ubuntu: apt-get install postgresql
#   mlflow with psycopg2        the repo's .venv, else mlflow on PATH     pip install -e '.[server]'
# Environment:
#   PG_BIN                   folder with the PostgreSQL binaries (default: initdb on PATH, else the newest
#                            /usr/lib/postgresql/*/bin)
#   PG_USER                  the user that runs PostgreSQL when started as root (default postgres)
#   MLFLOW                   the mlflow executable (default: .venv/bin/mlflow of this repo, else on PATH)
#   TRACKING_SERVER_HOST     the tracking server's bind address (default 127.0.0.1)
#   TRACKING_SERVER_WORKERS  mlflow server --workers (default 2)
#   TRACKING_SERVER_TIMEOUT  seconds to wait for each server to answer (default 60)
#   TRACKING_SERVER_ARGS     extra arguments for `mlflow server` (split on spaces)
#   MLFLOW_SERVER_ENABLE_JOB_EXECUTION  MLflow's job runner (GenAI scorers, prompt optimisation: eight more
#                            processes calibrun does not use); default false here, true turns it back on
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
PG_ROLE=calibrun
PG_DB=mlflow
HOST=${TRACKING_SERVER_HOST:-127.0.0.1}
WORKERS=${TRACKING_SERVER_WORKERS:-2}
TIMEOUT=${TRACKING_SERVER_TIMEOUT:-60}

say() { echo "tracking_server: $*" >&2; }
die() { say "error: $*"; exit 1; }
usage() {
    sed -n 's/^#   scripts/  scripts/p' "${BASH_SOURCE[0]}" | head -3 >&2
    exit 2
}

# --- helpers ------------------------------------------------------------------------------------------------

port_ok() { [[ $1 =~ ^[0-9]+$ ]] && (($1 >= 1 && $1 <= 65535)); }

port_in_use() {  # something accepts connections on 127.0.0.1:$1
    timeout 3 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null
}

find_pg_bin() {
    if [[ -n ${PG_BIN:-} ]]; then
        echo "$PG_BIN"
        return 0
    fi
    local found
    if found=$(command -v initdb 2>/dev/null); then
        found=$(dirname "$(readlink -f "$found")")
        if [[ -x $found/pg_ctl && -x $found/postgres ]]; then
            echo "$found"
            return 0
        fi
    fi
    found=$(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
    if [[ -d $found ]]; then echo "$found"; fi
    return 0
}

as_pg() {  # run a PostgreSQL server command as the cluster's owner, from / (the caller's folder may be private)
    if ((EUID == 0)); then
        (cd / && runuser -u "$PG_USER" -- "$@")
    else
        (cd / && "$@")
    fi
}

pg_client() {  # psql as the calibrun role over TCP, password from DIR/pgpass
    PGPASSFILE="$DIR/pgpass" PGCONNECT_TIMEOUT=5 "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 \
        -h 127.0.0.1 -p "$PG_PORT" -U "$PG_ROLE" "$@"
}

mlflow_pid() {  # the recorded tracking server pid, if that process is still an mlflow server
    local pid
    [[ -f $DIR/mlflow.pid ]] || return 1
    pid=$(<"$DIR/mlflow.pid")
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q mlflow || return 1
    echo "$pid"
}

healthy() {  # the tracking server answers GET /health
    local url=$1
    if command -v curl >/dev/null; then
        [[ $(curl -s --max-time 3 "$url/health" 2>/dev/null) == OK ]]
    else
        "$PYTHON" -c 'import sys, urllib.request
sys.exit(urllib.request.urlopen(sys.argv[1] + "/health", timeout=3).read().strip() != b"OK")' "$url" 2>/dev/null
    fi
}

stop_mlflow() {
    local pid waited=0
    if pid=$(mlflow_pid); then
        # started with setsid: the pid is its process group (the uvicorn workers are in it too)
        kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
        while kill -0 "$pid" 2>/dev/null && ((waited < 20)); do
            sleep 0.5
            waited=$((waited + 1))
        done
        if kill -0 "$pid" 2>/dev/null; then
            say "tracking server $pid did not stop in 10 s: killing it"
            kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
        fi
        say "tracking server stopped"
    fi
    rm -f "$DIR/mlflow.pid"
}

stop_pg() {
    [[ -f $DIR/pgdata/postmaster.pid ]] || return 0
    PG_BIN=$(find_pg_bin)
    [[ -x $PG_BIN/pg_ctl ]] || die "PostgreSQL is running in $DIR/pgdata but pg_ctl is not found (set PG_BIN)"
    if ! as_pg "$PG_BIN/pg_ctl" -D "$DIR/pgdata" -m fast -w -t 30 stop >/dev/null; then
        say "PostgreSQL did not stop in 30 s: immediate shutdown"
        as_pg "$PG_BIN/pg_ctl" -D "$DIR/pgdata" -m immediate -w -t 30 stop >/dev/null || true
    fi
    say "PostgreSQL stopped"
}

# --- commands -----------------------------------------------------------------------------------------------

cmd_start() {
    PG_PORT=${1:-5433}
    ML_PORT=${2:-5000}
    port_ok "$PG_PORT" || die "PG_PORT must be a port number, got '$PG_PORT'"
    port_ok "$ML_PORT" || die "MLFLOW_PORT must be a port number, got '$ML_PORT'"
    [[ $PG_PORT != "$ML_PORT" ]] || die "PG_PORT and MLFLOW_PORT must differ"
    [[ $WORKERS =~ ^[1-9][0-9]*$ ]] || die "TRACKING_SERVER_WORKERS must be a positive number"
    [[ $TIMEOUT =~ ^[1-9][0-9]*$ ]] || die "TRACKING_SERVER_TIMEOUT must be a positive number of seconds"

    # prerequisites, before anything is created
    PG_BIN=$(find_pg_bin)
    local tool
    for tool in initdb pg_ctl postgres psql; do
        [[ -x $PG_BIN/$tool ]] || die "PostgreSQL server binaries not found (no $tool in '${PG_BIN:-/usr/lib/postgresql/*/bin}');" \
            "install them (Debian/Ubuntu: apt-get install postgresql) or set PG_BIN"
    done
    MLFLOW=${MLFLOW:-}
    if [[ -z $MLFLOW ]]; then
        if [[ -x $REPO/.venv/bin/mlflow ]]; then
            MLFLOW=$REPO/.venv/bin/mlflow
        else
            MLFLOW=$(command -v mlflow || true)
        fi
    fi
    [[ -n $MLFLOW && -x $MLFLOW ]] || die "mlflow not found: pip install -e '.[server]' (or set MLFLOW)"
    PYTHON=$(dirname "$MLFLOW")/python
    if [[ -x $PYTHON ]]; then
        "$PYTHON" -c 'import psycopg2' 2>/dev/null \
            || die "psycopg2 is missing beside $MLFLOW: $(dirname "$MLFLOW")/pip install -e '.[server]'"
    else
        PYTHON=python3
    fi
    if ((EUID == 0)); then
        PG_USER=${PG_USER:-postgres}
        id "$PG_USER" >/dev/null 2>&1 || die "running as root, and user '$PG_USER' (to run PostgreSQL) does not exist;" \
            "install the postgresql package or set PG_USER"
    fi

    mkdir -p "$DIR"
    DIR=$(cd "$DIR" && pwd -P)
    local url="http://$HOST:$ML_PORT"
    if [[ $HOST == 0.0.0.0 || $HOST == "::" ]]; then
        url="http://127.0.0.1:$ML_PORT"
    elif [[ $HOST == *:* ]]; then
        url="http://[$HOST]:$ML_PORT"
    fi
    if mlflow_pid >/dev/null; then
        [[ -f $DIR/server.env ]] || die "a tracking server from $DIR is running but did not finish starting;" \
            "scripts/tracking_server.sh stop $DIR, then start"
        say "already running (stop it first to change ports)"
        sed -n 's/^URI=//p' "$DIR/server.env"
        return 0
    fi
    if [[ -f $DIR/pgdata/postmaster.pid ]] && as_pg "$PG_BIN/pg_ctl" -D "$DIR/pgdata" status >/dev/null 2>&1; then
        die "PostgreSQL of $DIR is still running without its tracking server;" \
            "scripts/tracking_server.sh stop $DIR, then start"
    fi
    ! port_in_use "$PG_PORT" || die "port $PG_PORT (PostgreSQL) is in use on 127.0.0.1; choose another PG_PORT"
    ! port_in_use "$ML_PORT" || die "port $ML_PORT (tracking server) is in use on 127.0.0.1; choose another MLFLOW_PORT"
    if ((EUID == 0)); then
        runuser -u "$PG_USER" -- test -x "$DIR" \
            || die "user '$PG_USER' (who runs PostgreSQL) cannot enter $DIR: choose a folder it can reach" \
                "(every parent folder needs o+x), e.g. under /srv or /tmp"
    fi

    STARTED_PG=0
    trap 'on_failed_start' EXIT
    trap 'exit 1' INT TERM HUP

    # the cluster: created once, kept across restarts
    if [[ ! -f $DIR/pgdata/PG_VERSION ]]; then
        [[ ! -e $DIR/pgdata || -z $(ls -A "$DIR/pgdata" 2>/dev/null) ]] \
            || die "$DIR/pgdata exists and is not a PostgreSQL cluster; remove it or choose another DIR"
        local password pwfile="$DIR/.initdb-password"
        password=$(head -c 48 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' | cut -c1-32)
        (umask 077 && printf '%s\n' "$password" >"$pwfile" \
            && printf '127.0.0.1:*:*:%s:%s\n' "$PG_ROLE" "$password" >"$DIR/pgpass")
        mkdir -p "$DIR/pgdata"
        chmod 700 "$DIR/pgdata"
        if ((EUID == 0)); then chown "$PG_USER" "$DIR/pgdata" "$pwfile"; fi
        say "initdb $DIR/pgdata"
        if ! as_pg "$PG_BIN/initdb" -D "$DIR/pgdata" -U "$PG_ROLE" --pwfile="$pwfile" --auth=scram-sha-256 \
            -E UTF8 --locale=C >"$DIR/initdb.log" 2>&1; then
            rm -f "$pwfile"
            tail -n 20 "$DIR/initdb.log" >&2
            die "initdb failed (full log: $DIR/initdb.log)"
        fi
        rm -f "$pwfile"
        printf '\n# scripts/tracking_server.sh: TCP on loopback only, no Unix socket\n%s\n%s\n' \
            "listen_addresses = '127.0.0.1'" "unix_socket_directories = ''" >>"$DIR/pgdata/postgresql.conf"
    fi
    [[ -f $DIR/pgpass ]] || die "$DIR/pgpass (the database password) is missing; remove $DIR/pgdata to start afresh"

    # PostgreSQL (a stale postmaster.pid from a crash is handled by postgres itself)
    touch "$DIR/postgres.log"
    if ((EUID == 0)); then chown "$PG_USER" "$DIR/postgres.log"; fi
    if ! as_pg "$PG_BIN/pg_ctl" -D "$DIR/pgdata" -l "$DIR/postgres.log" -o "-p $PG_PORT" -w -t "$TIMEOUT" \
        start >/dev/null; then
        tail -n 20 "$DIR/postgres.log" >&2
        STARTED_PG=1  # it may be up but not answering: stop it
        die "PostgreSQL did not start on 127.0.0.1:$PG_PORT within $TIMEOUT s (log: $DIR/postgres.log)"
    fi
    STARTED_PG=1
    say "PostgreSQL on 127.0.0.1:$PG_PORT ($DIR/pgdata)"
    if [[ -z $(pg_client -d postgres -tA -c "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'") ]]; then
        pg_client -d postgres -c "CREATE DATABASE $PG_DB" || die "could not create database $PG_DB"
    fi

    # the tracking server, in its own session (its pid is its process group: stop ends the workers too)
    mkdir -p "$DIR/artifacts"
    local extra=()
    if [[ -n ${TRACKING_SERVER_ARGS:-} ]]; then read -r -a extra <<<"$TRACKING_SERVER_ARGS"; fi
    PGPASSFILE="$DIR/pgpass" MLFLOW_SERVER_ENABLE_JOB_EXECUTION=${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false} \
        setsid "$MLFLOW" server \
        --backend-store-uri "postgresql+psycopg2://$PG_ROLE@127.0.0.1:$PG_PORT/$PG_DB" \
        --serve-artifacts --artifacts-destination "$DIR/artifacts" \
        --host "$HOST" --port "$ML_PORT" --workers "$WORKERS" "${extra[@]}" \
        </dev/null >"$DIR/mlflow.log" 2>&1 &
    echo $! >"$DIR/mlflow.pid"
    local deadline=$((SECONDS + TIMEOUT))
    until healthy "$url"; do
        if ! mlflow_pid >/dev/null; then
            tail -n 20 "$DIR/mlflow.log" >&2
            die "the tracking server exited during start (log: $DIR/mlflow.log)"
        fi
        if ((SECONDS >= deadline)); then
            tail -n 20 "$DIR/mlflow.log" >&2
            die "the tracking server did not answer $url/health within $TIMEOUT s (log: $DIR/mlflow.log)"
        fi
        sleep 0.5
    done
    trap - EXIT INT TERM HUP
    printf 'PG_PORT=%s\nMLFLOW_PORT=%s\nHOST=%s\nURI=%s\n' "$PG_PORT" "$ML_PORT" "$HOST" "$url" >"$DIR/server.env"
    say "tracking server $url (backend postgresql+psycopg2://$PG_ROLE@127.0.0.1:$PG_PORT/$PG_DB, artifacts $DIR/artifacts)"
    echo "$url"
}

on_failed_start() {  # a start that fails (or is interrupted) leaves nothing running
    trap - EXIT INT TERM HUP
    stop_mlflow
    if ((${STARTED_PG:-0})); then stop_pg; fi
}

cmd_stop() {
    [[ -d $DIR ]] || die "no such folder: $DIR"
    DIR=$(cd "$DIR" && pwd -P)
    if ((EUID == 0)); then PG_USER=${PG_USER:-postgres}; fi
    stop_mlflow
    stop_pg
    rm -f "$DIR/server.env"
}

cmd_status() {
    [[ -d $DIR ]] || die "no such folder: $DIR"
    DIR=$(cd "$DIR" && pwd -P)
    if ! mlflow_pid >/dev/null || [[ ! -f $DIR/server.env ]]; then
        say "not running"
        exit 1
    fi
    sed -n 's/^URI=//p' "$DIR/server.env"
}

(($# >= 2)) || usage
COMMAND=$1
DIR=$2
shift 2
case $COMMAND in
    start) (($# <= 2)) || usage; cmd_start "$@" ;;
    stop) (($# == 0)) || usage; cmd_stop ;;
    status) (($# == 0)) || usage; cmd_status ;;
    *) usage ;;
esac
