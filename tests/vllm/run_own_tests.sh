#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Runs vLLM's own core tests (../shared/vllm-tests, vLLM's main of 2026-08-17,
# unchanged) against the installed vLLM 0.33 twice, offline: with vLLM's own
# classes (the baseline), and with kvpool deciding every BlockPool call
# (kvpool_swap.py: a kvpoold per pool, its answers checked against vLLM's own
# structures). Prints both counts per suite. Fails if the baseline passes
# fewer tests than floors.txt records (the environment broke), or if a test
# that passes with vLLM's classes fails with kvpool's and is not listed, with
# its reason, in kvpool_exceptions.txt. The Scheduler tests run a third time
# with RemoteKVCacheManager in the Scheduler, held to manager_floors.txt and
# to the same rule.
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
# A local config.json where the tests name a hub model (no network here):
# hf/ORG--NAME/config.json stands for the hub's ORG/NAME (its shape only).
for cfg in "$here"/hf/*/config.json; do
	name=$(basename "$(dirname "$cfg")")
	snap="$work/hf/hub/models--$name"
	mkdir -p "$snap/refs" "$snap/snapshots/0000000000000000000000000000000000000000"
	printf 0000000000000000000000000000000000000000 > "$snap/refs/main"
	cp "$cfg" "$snap/snapshots/0000000000000000000000000000000000000000/"
done
export HF_HOME="$work/hf" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_TARGET_DEVICE=cpu
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
unset PYTHONHASHSEED
status=0
: > "$work/lost"
# Every test file of tests/v1/core (prefix_cache/ as one suite) is in floors.txt.
for f in "$work/vt/tests/v1/core"/test_*.py "$work/vt/tests/v1/core/prefix_cache"; do
	suite=$(basename "$f")
	if ! grep -qE "^$suite " "$here/floors.txt"; then
		echo "run_own_tests.sh: tests/v1/core/$suite is not in floors.txt" >&2
		status=1
	fi
done
while read -r suite floor; do
	case $suite in ''|'#'*) continue ;; esac
	base="$work/$(echo "$suite" | tr / _)"
	for mode in vllm kvpool; do
		plugin=""
		[ $mode = kvpool ] && plugin="-p kvpool_swap"
		# shellcheck disable=SC2086
		(cd "$work/vt" && "$py" -m pytest -q -rA -p no:cacheprovider $plugin --timeout 120 \
			"tests/v1/core/$suite" > "$base.$mode.log" 2>&1) || true
		grep -E '^PASSED ' "$base.$mode.log" | sed 's/^PASSED //; s/ - .*//' | sort -u \
			> "$base.$mode.pass" || true
	done
	nb=$(wc -l < "$base.vllm.pass")
	nk=$(wc -l < "$base.kvpool.pass")
	comm -23 "$base.vllm.pass" "$base.kvpool.pass" >> "$work/lost"
	total=$(grep -E '^(=+ )?[0-9]+ (passed|failed)' "$base.vllm.log" | tail -1 | tr -d '=')
	echo "tests/v1/core/$suite: $nb pass with vLLM's classes, $nk with kvpool's ($total) (floor $floor)"
	if [ "$nb" -lt "$floor" ]; then
		echo "run_own_tests.sh: $suite passed $nb < $floor with vLLM's classes; its log:" >&2
		tail -40 "$base.vllm.log" >&2
		status=1
	fi
done < "$here/floors.txt"
# vLLM's Scheduler tests again, with RemoteKVCacheManager in the Scheduler
# (kvpool_swap_manager.py): held to a floor, and every test that passes with
# vLLM's classes must pass here too (or be listed as manager:TEST).
while read -r suite floor; do
	case $suite in ''|'#'*) continue ;; esac
	base="$work/$(echo "$suite" | tr / _)"
	(cd "$work/vt" && "$py" -m pytest -q -rA -p no:cacheprovider -p kvpool_swap_manager \
		--timeout 120 "tests/v1/core/$suite" > "$base.manager.log" 2>&1) || true
	# A test that passes with vLLM's manager must pass with kvpool's too (or be listed).
	grep -E '^PASSED ' "$base.manager.log" | sed 's/^PASSED //; s/ - .*//' | sort -u \
		> "$base.manager.pass" || true
	comm -23 "$base.vllm.pass" "$base.manager.pass" | sed 's/^/manager:/' >> "$work/lost"
	line=$(grep -E '^kvpool_swap_manager: [0-9]+ tests ran' "$base.manager.log" || true)
	nm=$(echo "$line" | sed -n 's/.*; \([0-9]*\) of them passed.*/\1/p')
	nm=${nm:-0}
	echo "tests/v1/core/$suite: ${line#kvpool_swap_manager: } (floor $floor)"
	if [ "$nm" -lt "$floor" ]; then
		echo "run_own_tests.sh: $suite passed $nm < $floor with RemoteKVCacheManager; its failures:" >&2
		grep -E '^(FAILED|ERROR) ' "$base.manager.log" >&2 || tail -40 "$base.manager.log" >&2
		status=1
	fi
done < "$here/manager_floors.txt"
# vLLM's offloading suites, with vLLM's own classes only: none of them takes
# an OffloadingSpec as a parameter (they test vLLM's CPU and tiering specs and
# managers by their internals, and the connector through a MagicMock spec),
# so there is nowhere to put kvpool's; its own tests run it through vLLM's
# Scheduler and connector (clients/python/tests/vllm033/test_offload.py).
# Counted and held to a floor, so a broken environment shows.
while read -r suite floor; do
	case $suite in ''|'#'*) continue ;; esac
	base="$work/$(echo "$suite" | tr / _)"
	(cd "$work/vt" && "$py" -m pytest -q -rA -p no:cacheprovider --timeout 120 \
		--continue-on-collection-errors "tests/v1/$suite" > "$base.offload.log" 2>&1) || true
	no=$(grep -cE '^PASSED ' "$base.offload.log" || true)
	total=$(grep -E '^(=+ )?[0-9]+ (passed|failed)' "$base.offload.log" | tail -1 | tr -d '=')
	echo "tests/v1/$suite: $no pass with vLLM's classes ($total) (floor $floor)"
	if [ "$no" -lt "$floor" ]; then
		echo "run_own_tests.sh: $suite passed $no < $floor with vLLM's classes; its log:" >&2
		tail -40 "$base.offload.log" >&2
		status=1
	fi
done < "$here/offload_floors.txt"
listed=0
unlisted=0
while read -r t; do
	if grep -qF -- "$t " "$here/kvpool_exceptions.txt"; then
		listed=$((listed + 1))
	else
		echo "run_own_tests.sh: passes with vLLM's classes, fails with kvpool's, not listed: $t" >&2
		unlisted=$((unlisted + 1))
	fi
done < "$work/lost"
echo "vLLM's own tests: $((listed + unlisted)) pass with vLLM's classes and fail with kvpool's;" \
	"$listed listed in kvpool_exceptions.txt with the reason, $unlisted not"
if [ "$unlisted" -gt 0 ]; then
	for f in "$work"/*.kvpool.log "$work"/*.manager.log; do
		grep -E '^(FAILED|ERROR) ' "$f" >&2 || true
	done
	status=1
fi
exit $status
