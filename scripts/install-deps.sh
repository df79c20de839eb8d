#!/usr/bin/env bash
# Installs the Debian packages deepinfer needs to build and test, asking apt only for the
# ones that are missing (so it is a no-op, and needs no network, on a ready machine).
set -euo pipefail
need=(gcc make cmake pkg-config libjansson-dev libpcre2-dev libutf8proc-dev xz-utils)
missing=()
for p in "${need[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "install-deps: installing missing packages: ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
