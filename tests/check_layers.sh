#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The layering rule, checked on the sources and on what the compiler and
# linker actually used, so a header reached indirectly is caught too:
#   common/              includes only common/ (the leaf layer)
#   proto/ gpu/          common/ and themselves; never engine/ or service/
#   clients/c/           common/, proto/ and itself; never engine/, gpu/, service/;
#                        the library (clients/c/*) never includes its programs
#                        (clients/c/tools/), which may include the library
#   engine/              common/ and itself
#   service/             anything but clients/c/; inside it (service/README.md):
#     config/            only config/ (and the layers below service/)
#     rpc/               never net/, handlers/ or pool/ (handlers implement what rpc/
#                        declares; pool/ builds the pools rpc/ describes)
#     handlers/          only rpc/ and handlers/ (the pool's state comes through rpc/)
#     pool/              never net/ or handlers/
#     streams/           never rpc/ or handlers/
#   clients/python/kvpool no module imports another that imports it back
# Usage: check_layers.sh SOURCE_DIR BUILD_DIR. Prints each breach; exit 1 if any.
set -u
src=$1
bld=$2
bad=0
breach() { echo "layering: $*"; bad=1; }

# $1: folder, $2: extended regex of the folders it must not include from.
check_includes() {
	for f in $(cd "$src" && git ls-files "$1" 2>/dev/null || find "$1" -type f); do
		case $f in *.c|*.h|*.cu) ;; *) continue ;; esac
		grep -nE "#include \"($2)/" "$src/$f" | while IFS= read -r l; do
			echo "layering: $f:$l"
		done
	done
}

out=$(
	check_includes common  'engine|gpu|proto|service|clients'
	check_includes proto   'engine|gpu|service|clients'
	check_includes gpu     'engine|proto|service|clients'
	check_includes clients 'engine|gpu|service'
	check_includes engine  'gpu|proto|service|clients'
	check_includes service 'clients'
	check_includes service/config   'service/(net|rpc|handlers|pool|streams)'
	check_includes service/rpc      'service/(net|handlers|pool)'
	check_includes service/handlers 'service/(net|pool|streams|config)'
	check_includes service/pool     'service/(net|handlers)'
	check_includes service/streams  'service/(rpc|handlers)'
)
[ -z "$out" ] || { echo "$out"; bad=1; }

# The library's own files never include its programs'.
out=$(
	for f in $(cd "$src" && ls clients/c/*.c clients/c/*.h 2>/dev/null); do
		grep -nE '#include "clients/c/tools/' "$src/$f" | while IFS= read -r l; do
			echo "layering: $f:$l (the library includes one of its programs)"
		done
	done
)
[ -z "$out" ] || { echo "$out"; bad=1; }

# The compiler's dependency lists: every header each object really read.
# $1: target directory under the build tree, $2: forbidden source folders.
check_deps() {
	found=0
	for d in "$bld"/$1/*.o.d; do
		[ -e "$d" ] || continue
		found=1
		hits=$(tr ' \\' '\n\n' < "$d" | grep -E "^$src/($2)/" | sort -u)
		[ -z "$hits" ] || breach "$(basename "$d" .o.d) reads $(echo $hits)"
	done
	[ $found = 1 ] || breach "no dependency lists under $bld/$1 (build first)"
}
check_deps common/CMakeFiles/kvp_common.dir  'engine|gpu|proto|service|clients'
check_deps proto/CMakeFiles/kvp_proto.dir    'engine|gpu|service|clients'
check_deps gpu/CMakeFiles/kvp_exec.dir       'engine|proto|service|clients'
check_deps clients/c/CMakeFiles/kvpool.dir   'engine|gpu|service'
check_deps engine/CMakeFiles/kvp_engine.dir  'gpu|proto|service|clients'

# The link lines: client programs never link the engine, executor or daemon.
for t in kvpoolctl kvpool-demo; do
	l="$bld/clients/c/tools/CMakeFiles/$t.dir/link.txt"
	[ -e "$l" ] || { breach "$l missing (build first)"; continue; }
	! grep -qE 'libkvp_engine|libkvp_exec|libkvpd_core' "$l" || breach "$t links $(grep -oE 'libkvp_engine[^ ]*|libkvp_exec[^ ]*|libkvpd_core[^ ]*' "$l" | tr '\n' ' ')"
done

# No circles between the files of a library or program (tests/check_cycles.py:
# who uses whose functions, from the objects), but those issue #61 still lists.
python3 "$src/tests/check_cycles.py" "$src" "$bld" || bad=1
# Nor between the Python package's modules (tests/check_py_imports.py: the
# imports that run, not those for the type checker).
python3 "$src/tests/check_py_imports.py" "$src" || bad=1

[ $bad = 0 ] && echo "layering: ok"
exit $bad
