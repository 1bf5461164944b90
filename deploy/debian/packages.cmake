# SPDX-License-Identifier: Apache-2.0
# Debian's layout for a library with a daemon, from one `cpack -G DEB`:
#   libkvpool0.2   the shared library (its soname names the package)
#   libkvpool-dev  headers, the archive, pkg-config and CMake files; its
#                  Depends bring every -dev package kvpool.pc requires, so
#                  `pkg-config --cflags --libs [--static] kvpool` works
#   kvpoold        kvpoold and kvpoolctl, man pages, a systemd unit, the
#                  kvpool system user, /etc/kvpool/kvpoold.conf (a conffile)
# Each carries /usr/share/doc/PACKAGE/copyright. The components are the
# install() COMPONENTs lib, dev and daemon, so `cmake --install` puts the
# same files under any prefix (the conffile under PREFIX/etc; /etc for /usr).
set(_deb ${PROJECT_SOURCE_DIR}/deploy/debian)
set(KVP_DEB_LIB libkvpool${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
foreach(_c lib dev daemon)
  set(_pkg ${KVP_DEB_LIB})
  if(_c STREQUAL dev)
    set(_pkg libkvpool-dev)
  elseif(_c STREQUAL daemon)
    set(_pkg kvpoold)
  endif()
  install(FILES ${_deb}/copyright DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/${_pkg} COMPONENT ${_c})
endforeach()
install(FILES LICENSE README.md DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/kvpoold COMPONENT daemon)
install(FILES ${_deb}/kvpoold.service DESTINATION lib/systemd/system COMPONENT daemon)
# /etc when installed to /usr (the packages), else PREFIX/etc: decided at
# install time, when cpack or `cmake --install --prefix` has set the prefix.
install(CODE "
  if(CMAKE_INSTALL_PREFIX STREQUAL \"/usr\")
    set(_etc /etc)
  else()
    set(_etc \"\${CMAKE_INSTALL_PREFIX}/etc\")
  endif()
  file(INSTALL DESTINATION \"\${_etc}/kvpool\" TYPE FILE FILES \"${_deb}/kvpoold.conf\")
" COMPONENT daemon)

set(CPACK_PACKAGE_NAME kvpool)
set(CPACK_PACKAGE_VENDOR "kvpool")
set(CPACK_PACKAGE_CONTACT "kvpool maintainers <maintainers@users.noreply.a-seed-4dd82d3f.example>")
set(CPACK_RESOURCE_FILE_LICENSE ${PROJECT_SOURCE_DIR}/LICENSE)
# No CPACK_PACKAGE_DESCRIPTION_SUMMARY: CPack would put it before each
# package's own synopsis (the first line of its DESCRIPTION below).
set(CPACK_GENERATOR DEB)
set(CPACK_COMPONENTS_ALL lib dev daemon)
set(CPACK_DEB_COMPONENT_INSTALL ON)
# Absolute paths (/etc) inside the packages: install with DESTDIR.
set(CPACK_SET_DESTDIR ON)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_LICENSE Apache-2.0)
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE https://github.com/kvpool/kvpool)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON) # runtime dependencies from the binaries' links
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)

set(CPACK_DEBIAN_LIB_PACKAGE_NAME ${KVP_DEB_LIB})
set(CPACK_DEBIAN_LIB_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON) # a shlibs file where a package has a soname
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
set(CPACK_DEBIAN_LIB_DESCRIPTION "remote vLLM KV-cache block pool: C client library
The C client of kvpoold, which serves vLLM V1's BlockPool and KVCacheManager
(prefix-cached KV blocks) to schedulers and KV connectors over nng.")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libkvpool-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_SHLIBDEPS OFF)
# kvpool.pc: Requires.private libprotobuf-c libssl libcrypto; Libs.private -lnng.
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS
    "${KVP_DEB_LIB} (= ${PROJECT_VERSION}), libprotobuf-c-dev, libssl-dev (>= 3.0), libnng-dev, pkgconf | pkg-config")
set(CPACK_DEBIAN_DEV_DESCRIPTION "remote vLLM KV-cache block pool: C client development files
Headers, the static library, pkg-config and CMake package files of
libkvpool, the C client of kvpoold.")

set(CPACK_DEBIAN_DAEMON_PACKAGE_NAME kvpoold)
set(CPACK_DEBIAN_DAEMON_PACKAGE_SECTION net)
set(CPACK_DEBIAN_DAEMON_PACKAGE_DEPENDS "adduser, init-system-helpers (>= 1.52)")
set(CPACK_DEBIAN_DAEMON_PACKAGE_CONTROL_EXTRA
    ${_deb}/conffiles ${_deb}/postinst ${_deb}/prerm ${_deb}/postrm)
set(CPACK_DEBIAN_DAEMON_DESCRIPTION "remote vLLM KV-cache block pool: daemon and command-line client
kvpoold serves vLLM V1's BlockPool and request-level KVCacheManager
(prefix-cached KV blocks, ref counts, an LRU free queue, lazy eviction,
hybrid groups) to schedulers and KV connectors on other processes and
hosts, publishes BlockStored/BlockRemoved events on its own stream and on
vLLM's wire, and keeps the KV bytes. kvpoolctl is its command-line client.")
include(CPack)
