#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The install, as another project sees it: `cmake --install` into a fresh
# prefix, then a program outside the tree (install/consumer.c) built three
# ways against what was installed (pkg-config and the shared library,
# find_package(kvpool), the static archive) and run against the installed
# kvpoold. Also checks the soname, the exported symbols, the man pages and
# both programs' --version. With a PREFIX it installs nothing and checks
# what is there (CI: /usr in a fresh chroot, after the packages:
# tests/check_debian.sh).
# usage: check_install.sh BUILD_DIR SOURCE_DIR [PREFIX]
set -eu
build=$1
src=$2
work=$(mktemp -d /tmp/kvpool-install-XXXXXX)
prefix=${3:-$work/prefix}
pid=
cleanup() {
	[ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT
fail() {
	echo "check_install: $*" >&2
	exit 1
}

if [ $# -lt 3 ]; then
	cmake --install "$build" --prefix "$prefix" > "$work/install.log" || fail "cmake --install failed"
fi
pc=$(find "$prefix/lib" -name kvpool.pc | head -n 1)
[ -n "$pc" ] || fail "no kvpool.pc installed"
libdir=$(dirname "$(dirname "$pc")")
for f in bin/kvpoold bin/kvpoolctl include/kvpool/clients/c/kvpool.h \
	include/kvpool/common/kvp_status.h share/doc/kvpoold/copyright \
	share/doc/libkvpool-dev/copyright share/doc/libkvpool0.2/copyright \
	lib/systemd/system/kvpoold.service; do
	[ -e "$prefix/$f" ] || fail "$f not installed"
done
for f in libkvpool.so libkvpool.so.0.2 libkvpool.a cmake/kvpool/kvpoolConfig.cmake; do
	[ -e "$libdir/$f" ] || fail "lib/$f not installed"
done
if command -v help2man > /dev/null; then
	for p in kvpoold kvpoolctl; do
		grep -q "$p" "$prefix/share/man/man1/$p.1" || fail "no man page for $p"
	done
fi
readelf -d "$libdir/libkvpool.so" | grep -q 'SONAME.*\[libkvpool.so.0.2\]' || fail "soname is not libkvpool.so.0.2"
# The Python package loads the library by that soname.
grep -q '^SONAME = "libkvpool.so.0.2"$' "$src/clients/python/kvpool/_lib.py" ||
	fail "clients/python/kvpool/_lib.py does not load libkvpool.so.0.2"
# Exactly the functions the installed headers declare are exported: not
# protobuf-c's generated code, nor the shared layer's internal kvp_* helpers.
cat "$prefix"/include/kvpool/clients/c/*.h "$prefix"/include/kvpool/common/*.h |
	grep -o 'kvp_[a-z0-9_]*(' | tr -d '(' | sort -u > "$work/declared"
nm -D --defined-only "$libdir/libkvpool.so" |
	awk '$3 != "KVPOOL_0" {sub(/@.*/, "", $3); print $3}' | sort -u > "$work/exported"
grep -qx kvp_client_open "$work/exported" || fail "libkvpool.so does not export kvp_client_open"
other=$(comm -23 "$work/exported" "$work/declared" | tr '\n' ' ')
[ -z "$other" ] || fail "libkvpool.so exports what no installed header declares: $other"
"$prefix/bin/kvpoold" --version | grep -q '^kvpoold [0-9]' || fail "kvpoold --version"
# The default configuration (a conffile: /etc for the packages' /usr) is
# one the daemon accepts; its ipc sockets are moved out of /run/kvpool,
# which only the systemd unit makes.
conf=$prefix/etc/kvpool/kvpoold.conf
[ "$prefix" != /usr ] || conf=/etc/kvpool/kvpoold.conf
[ -f "$conf" ] || fail "$conf not installed"
"$prefix/bin/kvpoold" --config "$conf" --rpc "ipc://$work/conf.ipc" --events "ipc://$work/conf-ev.ipc" \
	--check-config > "$work/conf.log" 2>&1 || { cat "$work/conf.log"; fail "kvpoold refuses $conf"; }
"$prefix/bin/kvpoolctl" --version | grep -q '^kvpoolctl [0-9]' || fail "kvpoolctl --version"

url="ipc://$work/kvpoold.ipc"
"$prefix/bin/kvpoold" --quiet --rpc "$url" --admin none --events none \
	--pool name=p,blocks=16 &
pid=$!

# 1. pkg-config, shared.
export PKG_CONFIG_PATH="$libdir/pkgconfig"
cc -std=c11 -Wall -Werror -o "$work/c-pkgconfig" "$src/tests/install/consumer.c" \
	$(pkg-config --cflags --libs kvpool) -Wl,-rpath,"$libdir" || fail "pkg-config build"
ldd "$work/c-pkgconfig" | grep -q "$libdir/libkvpool.so.0.2" || fail "not linked to the installed .so"
"$work/c-pkgconfig" "$url" p || fail "the pkg-config build failed against kvpoold"

# 2. find_package(kvpool).
cmake -S "$src/tests/install" -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" \
	-DCMAKE_BUILD_RPATH="$libdir" > "$work/cmake.log" 2>&1 || { cat "$work/cmake.log"; fail "find_package"; }
cmake --build "$work/cmake-build" > "$work/build.log" 2>&1 || { cat "$work/build.log"; fail "cmake build"; }
"$work/cmake-build/consumer" "$url" p || fail "the find_package build failed against kvpoold"

# 3. The archive, as pkg-config --static says.
cc -std=c11 -Wall -Werror -o "$work/c-static" "$src/tests/install/consumer.c" \
	$(pkg-config --cflags kvpool) "$libdir/libkvpool.a" \
	$(pkg-config --static --libs-only-l kvpool | sed 's/-lkvpool//') || fail "static build"
ldd "$work/c-static" | grep -q libkvpool && fail "the static build loads libkvpool.so"
"$work/c-static" "$url" p || fail "the static build failed against kvpoold"
# 4. The docs' own commands, as written there (so they cannot drift from what
# works): docs/getting-started.md's cc lines and find_package, README.md's C program.
readme="$src/docs/getting-started.md"
n=0
grep -E '^cc app\.c ' "$readme" | sed 's/ *#.*$//' > "$work/readme-cc"
[ "$(wc -l < "$work/readme-cc")" -eq 2 ] || fail "docs/getting-started.md's two cc lines for another project are gone"
while IFS= read -r line; do
	n=$((n + 1))
	cmd=$(printf '%s' "$line" | sed "s|^cc app\.c|cc -std=c11 -Wall -Werror -o $work/readme-$n $src/tests/install/consumer.c|")
	sh -c "$cmd" || fail "docs/getting-started.md's line '$line' does not build"
	LD_LIBRARY_PATH="$libdir" "$work/readme-$n" "$url" p || fail "docs/getting-started.md's line '$line' builds a program that fails"
done < "$work/readme-cc"
want=$(sed -n 's/.*find_package(kvpool \([0-9.]*\) REQUIRED).*/\1/p' "$readme" | head -n 1)
have=$(sed -n 's/^find_package(kvpool \([0-9.]*\) REQUIRED)/\1/p' "$src/tests/install/CMakeLists.txt")
[ -n "$want" ] && [ "$want" = "$have" ] ||
	fail "docs/getting-started.md says find_package(kvpool $want), the tested consumer $have"
# README.md's C example, built as it says (pkg-config) and run against this
# daemon: its URL and pool in place of the default daemon's.
awk '/^```c$/ {on = 1; next} /^```$/ {on = 0} on' "$src/README.md" |
	sed "s|ipc:///tmp/kvpool.ipc|$url|; s|\.pool = \"default\"|.pool = \"p\"|" > "$work/app.c"
grep -q '^main(' "$work/app.c" || fail "README.md shows no C program"
cc -std=c11 -Wall -Wextra -Werror -o "$work/app" "$work/app.c" $(pkg-config --cflags --libs kvpool) \
	-Wl,-rpath,"$libdir" || fail "README.md's C program does not build"
"$work/app" | grep -q 'blocks free$' || fail "README.md's C program fails against kvpoold"
echo "check_install: $prefix ok (prefix layout, soname, symbols, man pages, pkg-config, find_package, archive, the docs' commands)"
