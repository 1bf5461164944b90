#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Installs what kvpool builds and tests with, from Debian 12's packages.
# Runs as root (CI) or through sudo (a developer's machine).
#   sh tests/deps.sh           everything: build, tests, benchmarks, deploy checks
#   sh tests/deps.sh --build   only what builds kvpoold, kvpoolctl, the library
#                              and the .deb (-DKVP_BUILD_TESTS=OFF -DKVP_BUILD_BENCH=OFF;
#                              the container images' build stage)
set -eu
build_only=""
case "${1:-}" in
--build) build_only=1 ;;
"") ;;
*) echo "usage: sh tests/deps.sh [--build]" >&2; exit 2 ;;
esac
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
build="build-essential cmake pkg-config ca-certificates libssl-dev libnng-dev libprotobuf-c-dev
	protobuf-c-compiler libcjson-dev libzmq3-dev libmsgpack-dev libxxhash-dev liburing-dev help2man dpkg-dev file"
tests="libcmocka-dev openssl python3 python3-zmq python3-msgpack python3-pytest python3-hypothesis
	python3-numpy python3-torch python3-pip python3-venv python3-mypy yamllint unzip"
[ -z "$build_only" ] || tests=""
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $build $tests
