#!/usr/bin/env bash
# Install prometheus and promtool (Debian package `prometheus`) for the deploy and Prometheus tests.
#
# Does nothing if both are on PATH. Otherwise installs the package as root with apt-get, without
# its recommended node exporter. The tests start their own Prometheus on a free port, so the
# package's service must neither be started by the install nor enabled for the next boot: a
# policy-rc.d that refuses every start is in place while apt-get runs (the Debian mechanism that
# invoke-rc.d and deb-systemd-invoke obey), and the service is disabled afterwards.
# Fails loudly where it cannot install: the tests fail, not skip, without these tools.
set -euo pipefail

if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "error: prometheus/promtool are missing and only root on Debian can install them here" \
    "(apt-get install prometheus)" >&2
  exit 1
fi

policy=/usr/sbin/policy-rc.d
# A policy already in place that refuses starts (exit 101) is left alone; any other is set aside
# for ours and put back when this script exits, however it exits.
answer=0
if [ -x "$policy" ]; then "$policy" prometheus start >/dev/null 2>&1 || answer=$?; fi
if [ "$answer" != 101 ]; then
  saved=""
  restore() {
    rm -f "$policy"
    if [ -n "$saved" ]; then mv -f "$saved" "$policy"; fi
  }
  trap restore EXIT
  if [ -e "$policy" ]; then
    saved=$(mktemp "$policy.peloton.XXXXXX")
    mv -f "$policy" "$saved"
  fi
  printf '#!/bin/sh\n# peloton scripts/install-prometheus.sh: no service starts while it installs\nexit 101\n' \
    > "$policy"
  chmod 755 "$policy"
fi

echo "prometheus/promtool missing; installing the Debian package prometheus" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends prometheus >/dev/null

# Not enabled at boot, under systemd or SysV init (both work without a running init).
deb-systemd-helper disable prometheus.service >/dev/null 2>&1 || true
update-rc.d prometheus disable >/dev/null 2>&1 || true

command -v promtool >/dev/null && command -v prometheus >/dev/null
echo "installed $(prometheus --version 2>&1 | head -n 1)" >&2
