#!/bin/sh
# install-deps.sh: installs the Debian 12 packages Sluice builds and tests with,
# if any is missing. Needs root (or sudo) only when something must be installed.
set -eu
PKGS="build-essential cmake pkg-config libfuse3-dev fuse3 liburing-dev libzstd-dev
libcmocka-dev libxxhash-dev libcjson-dev gcc-aarch64-linux-gnu libc6-dev-arm64-cross
qemu-user clang libclang-rt-14-dev libmicrohttpd-dev libcurl4-openssl-dev curl"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
# node and npm for the server's test with the openai npm package (Debian's,
# unless a node is installed already: NodeSource's bundles its own npm)
command -v node >/dev/null 2>&1 || missing="$missing nodejs npm"
[ -z "$missing" ] && exit 0
echo "install-deps: installing:$missing" >&2
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
