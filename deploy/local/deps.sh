#!/usr/bin/env bash
# Installs the system tools the network fabric's data-plane tests and benchmarks use (Debian
# packages): nft (nftables), ping (iputils-ping), curl, iperf3, ip (iproute2). Idempotent: a machine
# that has them returns at once. Without root or apt-get it says what is missing and fails.
set -euo pipefail
declare -A pkg=([nft]=nftables [ping]=iputils-ping [curl]=curl [iperf3]=iperf3 [ip]=iproute2)
missing=()
for tool in "${!pkg[@]}"; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("${pkg[$tool]}")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "system tools present (nft, ping, curl, iperf3, ip)"
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "error: missing Debian packages ${missing[*]}; install them as root (apt-get install ${missing[*]})" >&2
  exit 1
fi
echo "installing ${missing[*]} (apt-get)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
