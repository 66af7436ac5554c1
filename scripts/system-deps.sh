#!/usr/bin/env bash
# Install the system packages counterd needs, if they are missing (Debian/Ubuntu).
#   valgrind - the callgrind backend (simulated counters for whole programs)
#   gcc      - builds the native library (kernels, cache simulator); pure-Python fallbacks exist
set -euo pipefail
need=()
command -v valgrind >/dev/null 2>&1 || need+=(valgrind)
command -v gcc >/dev/null 2>&1 || need+=(gcc)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "counterd: please install: ${need[*]} (as root: apt-get install ${need[*]})" >&2
  exit 0
fi
echo "counterd: installing system packages: ${need[*]}" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
