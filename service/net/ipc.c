/* SPDX-License-Identifier: Apache-2.0 */
#define _POSIX_C_SOURCE 200809L
#include "service/net/ipc.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int
kvpd_ipc_check(const char *url, char *err, size_t len)
{
	struct stat st;
	const char *path;

	if (url == NULL || strncmp(url, "ipc://", 6) != 0)
		return 0;
	path = url + 6;
	if (lstat(path, &st) != 0)
		return errno == ENOENT ? 0 : (snprintf(err, len, "%s: %s", url, strerror(errno)), -1);
	if (st.st_uid != geteuid()) {
		snprintf(err, len, "%s: the path belongs to uid %u, not to this daemon's uid %u; "
		         "refusing it (whoever owns it could listen there in kvpoold's place)",
		         url, (unsigned)st.st_uid, (unsigned)geteuid());
		return -1;
	}
	if (!S_ISSOCK(st.st_mode)) {
		snprintf(err, len, "%s: the path exists and is not a socket", url);
		return -1;
	}
	return 0;
}
