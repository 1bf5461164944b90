#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Installs what kvpool builds and tests with, from Debian 12's packages.
# Runs as root (CI) or through sudo (a developer's machine).
set -eu
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
	build-essential cmake pkg-config ca-certificates \
	libssl-dev libcmocka-dev libnng-dev libprotobuf-c-dev protobuf-c-compiler libcjson-dev openssl \
	libzmq3-dev libmsgpack-dev libxxhash-dev python3 python3-zmq python3-msgpack \
	help2man dpkg-dev file python3-pytest python3-hypothesis python3-numpy python3-torch python3-pip python3-venv \
	python3-mypy yamllint unzip
