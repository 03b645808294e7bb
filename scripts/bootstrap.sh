# Shared set-up for scripts/serve and scripts/test (sourced, not run).
# Creates .venv and installs the project with the given extras; re-installs only when
# pyproject.toml changed since the last install.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
VENV="$ROOT/.venv"

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    echo "need root to run: $*" >&2; return 1; fi
}

apt_install() {
  export DEBIAN_FRONTEND=noninteractive
  as_root apt-get update -qq >/dev/null
  as_root apt-get install -y -qq "$@" >/dev/null
}

install_python_deps() {
  local extras="$1"
  local stamp="$VENV/.installed-$(echo "$extras" | tr ',' '-')"
  local want
  want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
  if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
  fi
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "==> installing Python packages ($extras)"
    "$VENV/bin/pip" install -q --upgrade pip
    if [[ "$extras" == *local-embeddings* ]]; then
      # The CPU build of torch; a bare 'torch' requirement would pull a multi-GB CUDA build.
      "$VENV/bin/pip" install -q "torch==2.13.0"
    fi
    "$VENV/bin/pip" install -q -e ".[$extras]"
    echo "$want" > "$stamp"
  fi
}

ensure_redis() {
  if "$VENV/bin/python" - <<'PY' 2>/dev/null; then return 0; fi
import redis; redis.Redis(host="127.0.0.1", port=6379, socket_connect_timeout=1).ping()
PY
  echo "==> starting Redis"
  command -v redis-server >/dev/null || apt_install redis-server
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
    --dir /tmp --logfile /tmp/memory-app-redis.log
  for _ in $(seq 50); do
    redis-cli -h 127.0.0.1 ping >/dev/null 2>&1 && return 0; sleep 0.1
  done
  echo "Redis did not start" >&2; return 1
}

ensure_chromium() {
  if [ ! -x /usr/bin/chromium ]; then
    echo "==> installing Debian's chromium for the browser tests"
    apt_install chromium
  fi
}

ensure_pgbouncer() {
  if ! command -v pgbouncer >/dev/null && [ ! -x /usr/sbin/pgbouncer ]; then
    echo "==> installing Debian's pgbouncer for the run through a pooler"
    apt_install pgbouncer
  fi
}
