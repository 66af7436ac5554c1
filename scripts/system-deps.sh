#!/usr/bin/env bash
# Install the system packages counterd needs, if they are missing (Debian/Ubuntu).
#   valgrind - the callgrind backend (simulated counters for whole programs)
#   gcc      - builds the native library (kernels, cache simulator); pure-Python fallbacks exist
#   chromium - the HTML report's layout test loads the report headless (skips without it)
#   prometheus - the daemon's tests scrape counterd with a real Prometheus (and promtool checks
#              the exposition); the tests skip with the reason without it
#   iproute2, curl, openssl - the namespace test cluster (ip netns, curl inside a namespace)
#              and the /metrics TLS tests (a test certificate); they skip with the reason
#   postgresql - the central store's tests start a throwaway cluster with its binaries
#              (initdb, pg_ctl under /usr/lib/postgresql/*/bin); they skip with the reason
set -euo pipefail
need=()
# prometheus without its recommends (no node exporter): the tests run their own instance.
quiet=()
command -v prometheus >/dev/null 2>&1 || quiet+=(prometheus)
command -v valgrind >/dev/null 2>&1 || need+=(valgrind)
command -v gcc >/dev/null 2>&1 || need+=(gcc)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v curl >/dev/null 2>&1 || need+=(curl)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1 \
  || need+=(postgresql)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
if [ $((${#need[@]} + ${#quiet[@]})) -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "counterd: please install: ${need[*]} ${quiet[*]} (as root: apt-get install ${need[*]}" \
       "${quiet[*]})" >&2
  exit 0
fi
echo "counterd: installing system packages: ${need[*]} ${quiet[*]}" >&2
apt-get update -qq
if [ ${#need[@]} -gt 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
if [ ${#quiet[@]} -gt 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${quiet[@]}" \
    >/dev/null
fi
