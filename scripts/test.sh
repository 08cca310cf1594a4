#!/usr/bin/env bash
# The README's test command (after setup): lint, format check, types, then every test
# against a real MariaDB and etcd that the tests start themselves.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py=.venv/bin
paths=(protocol cluster server client cli tests benchmarks examples)
existing=()
for p in "${paths[@]}"; do [ -e "$p" ] && existing+=("$p"); done
echo "== ruff check";  "$py/ruff" check "${existing[@]}"
echo "== ruff format"; "$py/ruff" format --check "${existing[@]}"
echo "== mypy --strict"
"$py/mypy" --strict protocol/canal_protocol cluster/canal_cluster server/canal_server \
  client/canal_client cli/canal_ha
MYPYPATH=tests "$py/mypy" --strict tests benchmarks
echo "== pytest"
# A private base temp dir: parallel pytest runs must not clean up each other's sandboxes.
base="$(mktemp -d "${TMPDIR:-/tmp}/canal-ha-tests.XXXXXX")"
trap 'rm -rf "$base"' EXIT
"$py/pytest" -q -p no:cacheprovider --basetemp="$base/t" "$@"
