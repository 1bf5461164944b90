#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The Debian packages as a user meets them: `cpack -G DEB` in BUILD_DIR
# makes libkvpool0.2, libkvpool-dev and kvpoold; they are installed with
# apt into a fresh Debian 12 made by debootstrap (not this machine, which
# has every -dev package already), where
#   1. libkvpool-dev alone brings what `pkg-config --cflags --libs
#      [--static] kvpool` names, and a program builds against it;
#   2. kvpoold brings its system user, its unit and its conffile; the
#      daemon runs as that user on that file, and
#      tests/check_install.sh passes on /usr (the daemon, the three link
#      forms, find_package, the README's commands);
#   3. removing kvpoold keeps the edited conffile, purging takes it.
# Needs root, debootstrap and a Debian mirror (KVP_DEBIAN_MIRROR).
# usage: check_debian.sh BUILD_DIR SOURCE_DIR
set -eu
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
mirror=${KVP_DEBIAN_MIRROR:-http://deb.debian.org/debian}
root=$(mktemp -d /tmp/kvpool-chroot-XXXXXX)
chmod 755 "$root" # apt downloads as _apt
cleanup() {
	umount "$root/proc" 2> /dev/null || true
	rm -rf "$root"
}
trap cleanup EXIT
fail() {
	echo "check_debian: $*" >&2
	exit 1
}
in_root() {
	chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
		DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 sh -euxc "$1"
}
[ "$(id -u)" = 0 ] || fail "needs root (chroot, debootstrap)"
command -v debootstrap > /dev/null || fail "needs debootstrap (apt-get install debootstrap)"

echo "check_debian: cpack -G DEB in $build"
rm -f "$build"/*.deb
(cd "$build" && cpack -G DEB > cpack.log 2>&1) || { cat "$build/cpack.log"; fail "cpack"; }
for p in libkvpool0.2 libkvpool-dev kvpoold; do
	ls "$build/${p}_"*.deb > /dev/null 2>&1 || fail "cpack made no $p package"
done
# The unit as systemd reads it (kvpoold is not installed on this machine).
if systemd-analyze --man=no verify "$src/deploy/debian/kvpoold.service" 2>&1 |
	grep -v "Command /usr/bin/kvpoold is not executable"; then
	fail "systemd-analyze verify deploy/debian/kvpoold.service"
fi

# docs/getting-started.md's package line names the three packages this makes.
line=$(grep -E '^\(cd build && cpack -G DEB\) && sudo apt install' "$src/docs/getting-started.md") ||
	fail "docs/getting-started.md's cpack and apt install line is gone"
for p in libkvpool0.2 libkvpool-dev kvpoold; do
	printf '%s\n' "$line" | grep -q "\./build/${p}_\*\.deb" ||
		fail "docs/getting-started.md's apt install line misses $p"
done

echo "check_debian: debootstrap bookworm into $root"
debootstrap --variant=minbase bookworm "$root" "$mirror" > "$root.debootstrap.log" 2>&1 ||
	{ tail -n 20 "$root.debootstrap.log"; rm -f "$root.debootstrap.log"; fail "debootstrap"; }
rm -f "$root.debootstrap.log"
cp /etc/resolv.conf "$root/etc/resolv.conf"
mount -t proc proc "$root/proc"
mkdir -p "$root/debs" "$root/src/tests" "$root/src/docs" "$root/src/clients/python/kvpool"
cp "$build"/*.deb "$root/debs/"
cp "$src/README.md" "$root/src/"
cp "$src/docs/getting-started.md" "$root/src/docs/"
cp -r "$src/tests/check_install.sh" "$src/tests/install" "$root/src/tests/"
cp "$src/clients/python/kvpool/_lib.py" "$root/src/clients/python/kvpool/"
in_root 'apt-get update -qq'

echo "check_debian: 1. libkvpool-dev alone, and a program built with pkg-config"
in_root 'apt-get install -y -qq --no-install-recommends gcc libc6-dev /debs/libkvpool0.2_*.deb /debs/libkvpool-dev_*.deb > /tmp/apt.log 2>&1 || { cat /tmp/apt.log; exit 1; }
	pkg-config --cflags --libs kvpool
	pkg-config --static --cflags --libs kvpool
	cc -std=c11 -Wall -Werror -o /tmp/shared /src/tests/install/consumer.c $(pkg-config --cflags --libs kvpool)
	ldd /tmp/shared | grep -q "libkvpool.so.0.2 => /.*lib/libkvpool.so.0.2 "
	cc -std=c11 -Wall -Werror -o /tmp/static /src/tests/install/consumer.c \
		$(pkg-config --cflags kvpool) /usr/lib/libkvpool.a $(pkg-config --static --libs-only-l kvpool | sed "s/-lkvpool//")
	! ldd /tmp/static | grep -q libkvpool
	for p in libkvpool0.2 libkvpool-dev; do test -s /usr/share/doc/$p/copyright; done
	! command -v kvpoold' || fail "libkvpool-dev does not build a program by itself"

echo "check_debian: 2. kvpoold: its user, unit and conffile; check_install.sh on /usr"
in_root 'apt-get install -y -qq --no-install-recommends cmake make /debs/kvpoold_*.deb > /tmp/apt.log 2>&1 || { cat /tmp/apt.log; exit 1; }
	getent passwd kvpool | grep -q ":/nonexistent:/usr/sbin/nologin$"
	getent group kvpool > /dev/null
	dpkg-query -W -f="\${Conffiles}\n" kvpoold | grep -q "^ /etc/kvpool/kvpoold.conf [0-9a-f]"
	test -f /usr/lib/systemd/system/kvpoold.service
	test -s /usr/share/doc/kvpoold/copyright
	mkdir -p /run/kvpool && chown kvpool:kvpool /run/kvpool
	kvpoold --config /etc/kvpool/kvpoold.conf --check-config > /dev/null
	setpriv --reuid kvpool --regid kvpool --init-groups kvpoold --config /etc/kvpool/kvpoold.conf --quiet 2> /tmp/kvpoold.log &
	pid=$!
	i=0
	until kvpoolctl --url ipc:///run/kvpool/kvpoold.ipc info > /tmp/info 2>&1; do
		i=$((i + 1)); kill -0 $pid && [ $i -lt 20 ] || { cat /tmp/kvpoold.log /tmp/info; exit 1; }; sleep 0.2
	done
	grep -q default /tmp/info
	test "$(stat -c %a:%U /run/kvpool/kvpoold.ipc)" = 660:kvpool
	kill $pid && wait $pid
	cd /src && sh tests/check_install.sh /nonexistent . /usr' || fail "kvpoold's package"

echo "check_debian: 3. remove keeps an edited conffile, purge takes it"
in_root 'echo "log-level = debug" >> /etc/kvpool/kvpoold.conf
	apt-get remove -y -qq kvpoold > /dev/null 2>&1
	! command -v kvpoold
	grep -q "log-level = debug" /etc/kvpool/kvpoold.conf
	apt-get purge -y -qq kvpoold > /dev/null 2>&1
	! test -e /etc/kvpool/kvpoold.conf
	getent passwd kvpool > /dev/null' || fail "remove and purge"
echo "check_debian: ok (3 packages; pkg-config from -dev alone; user, unit, conffile; check_install on /usr; remove, purge)"
