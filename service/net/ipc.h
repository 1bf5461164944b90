/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ipc.h: the socket files of kvpoold's ipc:// endpoints. A path that
 * exists and belongs to another user is refused: whoever owns it could be
 * listening there in kvpoold's place and collect its clients' tokens.
 * (Permissions: main sets the umask from ipc-mode while it binds.)
 */
#ifndef KVPD_IPC_H
#define KVPD_IPC_H

#include <stddef.h>

/*
 * For an ipc:// URL: 0 if its path is free, or is a socket this user owns
 * (a stale one the transport replaces); else -1 with the reason in err.
 * Any other URL: 0.
 */
int kvpd_ipc_check(const char *url, char *err, size_t len);

#endif /* KVPD_IPC_H */
