/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fdlimit.h: the daemon's open-files limit. Every connection is a file: at
 * the limit nng cannot accept, and a new client waits with nothing said on
 * either side. At start kvpoold raises its soft limit to the hard one, and
 * while it runs it watches how many it has open and logs when it nears the
 * limit (and when it is clear again), so an operator sees why clients wait.
 */
#ifndef KVPD_FDLIMIT_H
#define KVPD_FDLIMIT_H

#include <stdbool.h>
#include <stdint.h>

/* Raises the soft RLIMIT_NOFILE to the hard one and logs the limit. */
void kvpd_fd_raise(void);

struct kvpd_fd_watch {
	bool near;          /* at or near the limit when last looked */
	uint64_t warned_ms; /* when it last said so */
};

/*
 * Counts the open files (/proc/self/fd; a failure to open it for want of
 * descriptors counts as at the limit) and logs a warning when they are
 * within max(8, limit/20) of the limit (again every 60 s while they stay
 * there), and a note when they are clear. For one thread (the reaper).
 */
void kvpd_fd_check(struct kvpd_fd_watch *w, uint64_t now_ms);

#endif /* KVPD_FDLIMIT_H */
