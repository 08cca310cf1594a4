#!/usr/bin/env bash
# Idempotent setup: Debian packages (MariaDB, etcd, a JRE, docker-compose) and .venv at the repo root
# with canal-ha installed editable with every extra. Safe to run again: it only does
# what is missing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

need_pkgs=()
command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || need_pkgs+=(mariadb-server mariadb-client)
command -v etcd >/dev/null 2>&1 || need_pkgs+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || need_pkgs+=(etcd-client)
command -v java >/dev/null 2>&1 || need_pkgs+=(default-jre-headless)
# Validates docker/compose.yml without an engine (`docker-compose -f FILE config`).
command -v docker-compose >/dev/null 2>&1 || need_pkgs+=(docker-compose)
# The C extensions (canal_server.parse._rowcodec, canal_server.canal._canalcodec) are
# compiled at install: a compiler and headers.
command -v gcc >/dev/null 2>&1 || need_pkgs+=(gcc)
py="${PYTHON:-python3}"
include="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
[ -f "$include/Python.h" ] || need_pkgs+=(python3-dev)
# mysqlclient (the snapshot's chunk reader) builds against MariaDB's C client library.
[ -f /usr/include/mariadb/mysql.h ] || need_pkgs+=(libmariadb-dev)
command -v pkg-config >/dev/null 2>&1 || need_pkgs+=(pkg-config)
# The console's browser test (tests/test_console.py): Debian's Chromium and its driver,
# driven headless by Selenium (never downloads a browser or a driver itself).
command -v chromium >/dev/null 2>&1 || need_pkgs+=(chromium)
[ -x /usr/bin/chromedriver ] || need_pkgs+=(chromium-driver)
if [ "${#need_pkgs[@]}" -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup: installing Debian packages: ${need_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  # policy-rc.d keeps Debian from starting the system services: we run private ones.
  $sudo apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$py" -m venv .venv
fi
stamp=.venv/.canal-ha-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ setup.py -nt "$stamp" ] \
  || [ server/canal_server/parse/_rowcodec.c -nt "$stamp" ] \
  || [ server/canal_server/canal/_canalcodec.c -nt "$stamp" ] \
  || [ server/canal_server/canal/_canaltext.c -nt "$stamp" ] \
  || [ server/canal_server/canal/_canalcodec.h -nt "$stamp" ]; then
  echo "setup: installing canal-ha into .venv (editable, every extra)"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[server,spark,connect,dev]"
  touch "$stamp"
fi
# The extensions are optional for pip (a pure-Python path exists for each); here they
# must be there.
.venv/bin/python -c 'import canal_server.parse._rowcodec' 2>/dev/null || {
  echo "setup: the C row decoder did not build (needs gcc and Python headers)" >&2
  exit 1
}
.venv/bin/python -c 'import canal_server.canal._canalcodec' 2>/dev/null || {
  echo "setup: the C encoder of Canal's entries did not build (needs gcc and Python headers)" >&2
  exit 1
}
echo "setup: ready (.venv/bin/canal-ha)"
