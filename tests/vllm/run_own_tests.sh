#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Runs vLLM's own core tests (../shared/vllm-tests, vLLM's main of 2026-08-17,
# unchanged) against the installed vLLM 0.33 with vLLM's own classes, offline,
# and prints how many pass per suite: the baseline that any run with kvpool's
# classes is measured against. Tests written for a vLLM newer or older than
# 0.33 fail here with vLLM's classes too; those and the ones that need a model
# from the hub are counted, not hidden. Fails if a suite passes fewer tests
# than floors.txt records (the environment broke), or if a suite's tests
# cannot be collected at all.
#   sh tests/vllm/run_own_tests.sh VENV_PYTHON [SHARED_VLLM_TESTS]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
py=$1
src=${2:-$here/../../../shared/vllm-tests}
[ -d "$src/tests/v1/core" ] || { echo "run_own_tests.sh: no vLLM tests at $src" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$src" "$work/vt"
chmod -R u+w "$work/vt"
# A local config.json where the tests name a hub model (no network here).
snap="$work/hf/hub/models--facebook--opt-125m"
mkdir -p "$snap/refs" "$snap/snapshots/0000000000000000000000000000000000000000"
printf 0000000000000000000000000000000000000000 > "$snap/refs/main"
cp "$here/hf/facebook--opt-125m/config.json" "$snap/snapshots/0000000000000000000000000000000000000000/"
export HF_HOME="$work/hf" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_TARGET_DEVICE=cpu
unset PYTHONHASHSEED
status=0
while read -r suite floor; do
	case $suite in ''|'#'*) continue ;; esac
	log="$work/$(echo "$suite" | tr / _).log"
	(cd "$work/vt" && "$py" -m pytest -q -p no:cacheprovider --timeout 120 "tests/v1/core/$suite" \
		> "$log" 2>&1) || true
	line=$(grep -E '^(=+ )?[0-9]+ (passed|failed|error)' "$log" | tail -1 | tr -d '=')
	passed=$(echo "$line" | grep -oE '[0-9]+ passed' | cut -d' ' -f1)
	passed=${passed:-0}
	echo "vLLM's own classes: tests/v1/core/$suite: ${line:-no result} (floor $floor)"
	if [ "$passed" -lt "$floor" ]; then
		echo "run_own_tests.sh: $suite passed $passed < $floor; its log:" >&2
		tail -40 "$log" >&2
		status=1
	fi
done < "$here/floors.txt"
exit $status
