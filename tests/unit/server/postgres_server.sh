#!/bin/sh
# A throwaway PostgreSQL server for the store's tests (postgres_server.h):
#   postgres_server.sh start DIR   makes a cluster in DIR/data and serves it
#                                  on a unix socket in DIR, port 5432, as
#                                  user ballast (trust); no TCP port
#   postgres_server.sh stop DIR    stops it and deletes DIR
# Exit 0, or 3 when Debian's PostgreSQL server binaries are missing
# (`make setup` installs the postgresql package); anything else is a failure
# with initdb's or the server's log on stderr.
#
# initdb and the server refuse to run as root, which CI and the build
# machines are: then they run as the `postgres` user the package creates
# (`nobody` where there is none) through runuser, in a DIR given to it.
set -eu
action=$1
dir=$2
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
if [ -z "$bin" ] || [ ! -x "$bin/initdb" ]; then
  echo "no PostgreSQL server binaries (/usr/lib/postgresql/*/bin/initdb): make setup installs Debian's postgresql package" >&2
  exit 3
fi
as_user=""
if [ "$(id -u)" = 0 ]; then
  user=postgres
  id -u "$user" >/dev/null 2>&1 || user=nobody
  as_user="runuser -u $user --"
fi
case "$action" in
  start)
    # A server left by a run that was killed goes first.
    [ -d "$dir/data" ] && $as_user "$bin/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$dir"
    mkdir -p "$dir"
    [ -n "$as_user" ] && chown "$user" "$dir"
    # No fsync: a test's data need not survive a power loss (a benchmark sets
    # BALLAST_PG_FSYNC=on, to compare durable stores).
    if ! $as_user "$bin/initdb" -D "$dir/data" -A trust -U ballast --no-sync -E UTF8 --locale=C \
        >"$dir/initdb.log" 2>&1; then
      cat "$dir/initdb.log" >&2
      exit 1
    fi
    if ! $as_user "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w \
        -o "-k $dir -p 5432 -c listen_addresses='' -c fsync=${BALLAST_PG_FSYNC:-off}" start >/dev/null; then
      cat "$dir/server.log" >&2
      exit 1
    fi
    ;;
  stop)
    [ -d "$dir/data" ] && $as_user "$bin/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null || true
    rm -rf "$dir"
    ;;
  *)
    echo "usage: postgres_server.sh start|stop DIR" >&2
    exit 2
    ;;
esac
