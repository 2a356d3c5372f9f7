#!/usr/bin/env bash
# Starts what the test suite needs when it is not already running: PostgreSQL, Redis, and Debian's chromium.
set -euo pipefail

pg_up() { pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; }
redis_up() { redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

if ! pg_up; then
  echo "starting PostgreSQL"
  as_root pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start
fi
if ! redis_up; then
  echo "starting Redis"
  as_root mkdir -p /var/lib/redis /var/log/redis
  as_root redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
fi
if ! command -v chromium >/dev/null; then
  echo "installing Debian's chromium for the browser tests"
  as_root apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -q chromium >/dev/null
fi

for _ in $(seq 1 30); do
  if pg_up && redis_up; then exit 0; fi
  sleep 1
done
echo "PostgreSQL or Redis did not come up" >&2
exit 1
