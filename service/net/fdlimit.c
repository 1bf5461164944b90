/* SPDX-License-Identifier: Apache-2.0 */
#include "service/net/fdlimit.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <sys/resource.h>

#include "service/log.h"

void
kvpd_fd_raise(void)
{
	struct rlimit rl;
	char soft[24], hard[24];
	if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
		return;
	rlim_t was = rl.rlim_cur;
	if (rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
			rl.rlim_cur = was;
	}
	snprintf(soft, sizeof(soft), "%llu", (unsigned long long)rl.rlim_cur);
	snprintf(hard, sizeof(hard), "%llu", (unsigned long long)was);
	struct kvpd_log_field f[] = {{"limit", soft}, {"was", hard}};
	kvpd_log_fields(KVPD_INFO, "main", "open-files limit (each connection takes one)", f,
	                rl.rlim_cur != was ? 2 : 1);
}

/* Open descriptors now, or -1 when there is none left to look with. */
static long
count_open(void)
{
	DIR *d = opendir("/proc/self/fd");
	long n = 0;
	if (d == NULL)
		return errno == EMFILE || errno == ENFILE ? -1 : -2;
	for (struct dirent *e; (e = readdir(d)) != NULL;)
		n += e->d_name[0] != '.';
	closedir(d);
	return n - 1; /* not opendir's own */
}

void
kvpd_fd_check(struct kvpd_fd_watch *w, uint64_t now_ms)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
		return;
	long open = count_open();
	if (open == -2)
		return; /* no /proc: nothing to say */
	unsigned long long limit = rl.rlim_cur, room = limit / 20 > 8 ? limit / 20 : 8;
	bool near = open < 0 || (unsigned long long)open + room >= limit;
	char o[24], l[24];
	snprintf(o, sizeof(o), "%ld", open < 0 ? (long)limit : open);
	snprintf(l, sizeof(l), "%llu", limit);
	struct kvpd_log_field f[] = {{"open", o}, {"limit", l}};
	if (near && (!w->near || now_ms - w->warned_ms >= 60000)) {
		kvpd_log_fields(KVPD_WARN, "main", "near the open-files limit: new connections wait "
		                "unanswered until some close (raise the limit: ulimit -n, or the "
		                "container's nofile)", f, 2);
		w->warned_ms = now_ms;
	} else if (!near && w->near) {
		kvpd_log_fields(KVPD_INFO, "main", "clear of the open-files limit again", f, 2);
	}
	w->near = near;
}
