/* SPDX-License-Identifier: Apache-2.0 */
#define _GNU_SOURCE /* dup3 */
/*
 * transport_listen.c: the RPC endpoints' listeners, kept accepting.
 *
 * nng 1.5.2 stops handing an ipc:// listener's new connections to the
 * socket, for good, once one connection fails its handshake: a client that
 * gave up while kvpoold was stopped (SIGSTOP, a long pause) is accepted
 * after the pause, the SP header sent to it fails with EPIPE, and from then
 * on every new client connects and waits for a reply that never comes,
 * while open connections go on. (Seen with nng's own REP socket and nothing
 * of ours; tcp:// meets ECONNRESET there instead, which nng recovers from.)
 *
 * So a thread watches each ipc:// listener's error count in nng's stats.
 * When it grew, the listener may be stuck, or a client merely left (nng
 * counts a disconnect there too): a request from this process to the
 * endpoint tells which (a round trip, at most one a look), and only a
 * stuck listener is replaced by a new one on the same path. A new listener
 * is probed at every look until it answers (one renewed in the same
 * moment can start stuck, seen under AddressSanitizer's slowness), and
 * replaced again meanwhile; and every listener is probed once a second
 * anyway, since a listener was also seen stuck with no error counted.
 * The stuck listener is not closed: its path is unlinked and it is put
 * aside until the socket closes, since closing it would close the
 * connections it took, and was seen to hang nng's reaper thread for good
 * (1 run in 10 under AddressSanitizer: every later connection close then
 * waited forever, and open clients stopped being answered). Open
 * connections keep going; new clients are served within about a second
 * and a half.
 */
#include "service/net/transport_impl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <nng/nng.h>
#include <nng/supplemental/util/platform.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "service/net/ipc.h"

enum {
	WATCH_MS = 200,  /* between looks at the listeners */
	PROBE_MS = 500,  /* how long the endpoint may take to answer the probe */
	ROUTINE = 5,     /* looks between probes with no cause (one a second) */
};

/* nng's listener counters of connections that failed, whatever the reason. */
static const char *const error_kinds[] = {"disconnect", "canceled", "other", "timeout",
                                          "proto", "oom", "reject"};

/* A listener's counter from nng's stats, 0 if it has none. */
static uint64_t
counter(nng_stat *all, nng_listener l, const char *name)
{
	nng_stat *ls = nng_stat_find_listener(all, l), *c;
	return ls != NULL && (c = nng_stat_find(ls, name)) != NULL ? nng_stat_value(c) : 0;
}

/* Waits until fd is readable (or has an error) within PROBE_MS: 1, 0 on timeout, -1 on error. */
static int
readable(int fd)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	int rv;
	do
		rv = poll(&p, 1, PROBE_MS);
	while (rv < 0 && errno == EINTR);
	return rv;
}

/*
 * False only when the ipc:// endpoint at url took a connection from here
 * (its SP handshake done) and then left a request unanswered for PROBE_MS:
 * the stuck listener. Spoken on a plain socket (nng's ipc framing: the
 * 8-byte SP header, then a 0x01 byte and a 64-bit big-endian length per
 * message), so no nng socket of the probe is still being torn down when
 * the daemon exits. The request is a REQ header and nothing else: kvpoold
 * answers it at once, counting nothing. Where this cannot tell (no socket,
 * a connect that fails, a handshake that never comes: at the open-files
 * limit the listener's errors grow too, and must not cost the endpoint),
 * true.
 */
static bool
answers(const char *url)
{
	static const uint8_t hello[8] = {0x00, 'S', 'P', 0x00, 0x00, 0x30, 0x00, 0x00};
	/* a message of 4 bytes: a request id with its top bit set */
	static const uint8_t req[13] = {0x01, 0, 0, 0, 0, 0, 0, 0, 4, 0x80, 0, 0, 1};
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	uint8_t peer[8];
	bool ok = true;
	int fd;

	if (strncmp(url, "ipc://", 6) != 0 || strlen(url + 6) >= sizeof(a.sun_path))
		return true;
	memcpy(a.sun_path, url + 6, strlen(url + 6) + 1);
	if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
		return true;
	struct timeval tv = {.tv_sec = 0, .tv_usec = PROBE_MS * 1000};
	(void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)); /* bounds MSG_WAITALL */
	(void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
	    send(fd, hello, sizeof(hello), MSG_NOSIGNAL) == (ssize_t)sizeof(hello) &&
	    readable(fd) == 1 && recv(fd, peer, sizeof(peer), MSG_WAITALL) == (ssize_t)sizeof(peer) &&
	    send(fd, req, sizeof(req), MSG_NOSIGNAL) == (ssize_t)sizeof(req))
		ok = readable(fd) != 0; /* an answer, or the endpoint closing: it is alive */
	close(fd);
	return ok;
}

/* Whether fd is a connection accepted on one of t's ipc paths whose peer has gone; its inode. */
static bool
hung_up(const struct kvpd_transport *t, int fd, uint64_t *ino)
{
	struct sockaddr_un a;
	socklen_t al = sizeof(a), ol = sizeof(int);
	struct stat st;
	int listening = 0;

	if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode) ||
	    getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &ol) != 0 || listening ||
	    getsockname(fd, (struct sockaddr *)&a, &al) != 0 || a.sun_family != AF_UNIX ||
	    al <= offsetof(struct sockaddr_un, sun_path))
		return false;
	size_t n = strnlen(a.sun_path, al - offsetof(struct sockaddr_un, sun_path));
	bool ours = false;
	for (size_t i = 0; i < t->num_listeners && !ours; i++)
		ours = n > 0 && strncmp(t->urls[i], "ipc://", 6) == 0 &&
		       strlen(t->urls[i] + 6) == n && memcmp(t->urls[i] + 6, a.sun_path, n) == 0;
	struct pollfd p = {.fd = fd, .events = POLLIN};
	if (!ours || poll(&p, 1, 0) != 1 || !(p.revents & POLLHUP))
		return false;
	*ino = (uint64_t)st.st_ino;
	return true;
}

/* Closes fd's connection in place, an unconnected socket taking its number. */
static bool
close_in_place(int fd)
{
	int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s < 0)
		return false;
	int rv = dup3(s, fd, O_CLOEXEC);
	close(s);
	return rv == fd;
}

/* One look for hung-up connections (see the top of the file). With listen_mu held. */
static void
reap_hung(struct kvpd_transport *t)
{
	__typeof__(t->hung[0]) now[KVPD_MAX_HUNG];
	size_t n = 0, closed = 0;
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;

	if (d == NULL)
		return;
	while ((e = readdir(d)) != NULL && n < KVPD_MAX_HUNG) {
		char *end;
		long fd = strtol(e->d_name, &end, 10);
		uint64_t ino;
		if (end == e->d_name || *end != '\0' || fd < 0 || fd > INT_MAX || fd == dirfd(d) ||
		    !hung_up(t, (int)fd, &ino))
			continue;
		bool seen = false;
		for (size_t k = 0; k < t->num_hung && !seen; k++)
			seen = t->hung[k].fd == (int)fd && t->hung[k].ino == ino;
		if (seen && close_in_place((int)fd)) {
			closed++;
			continue;
		}
		now[n].fd = (int)fd;
		now[n++].ino = ino;
	}
	closedir(d);
	memcpy(t->hung, now, n * sizeof(now[0]));
	t->num_hung = n;
	if (closed > 0) {
		char count[24];
		snprintf(count, sizeof(count), "%zu", closed);
		struct kvpd_log_field f[] = {{"connections", count}};
		kvpd_log_fields(KVPD_INFO, "transport",
		                "closed connections a stuck listener held after their clients left", f,
		                1);
	}
}

int
kvpd_tr_listen(struct kvpd_transport *t, size_t i, char *err, size_t len)
{
	const char *url = t->urls[i];
	nng_listener l;
	int rv;

	if (kvpd_ipc_check(url, err, len) != 0)
		return -1;
	if ((rv = nng_listener_create(&l, t->sock, url)) != 0) {
		snprintf(err, len, "endpoint %s: %s", url, nng_strerror(rv));
		return -1;
	}
	if (strncmp(url, "tls+", 4) == 0 &&
	    (rv = nng_listener_set_ptr(l, NNG_OPT_TLS_CONFIG, t->tls)) != 0) {
		nng_listener_close(l);
		snprintf(err, len, "endpoint %s: TLS: %s", url, nng_strerror(rv));
		return -1;
	}
	/* ipc-mode again (main's umask covers only the first bind). */
	if (strncmp(url, "ipc://", 6) == 0)
		(void)nng_listener_set_int(l, NNG_OPT_IPC_PERMISSIONS, (int)t->ipc_mode);
	if ((rv = nng_listener_start(l, 0)) != 0) {
		nng_listener_close(l);
		snprintf(err, len, "cannot listen on %s: %s", url, nng_strerror(rv));
		return -1;
	}
	t->listeners[i] = l;
	t->seen[i].errors = 0;
	t->seen[i].unproven = true; /* probed at the next look */
	return 0;
}

/* Listener i, which stopped answering: a new one in its place. With listen_mu held. */
static void
renew(struct kvpd_transport *t, size_t i)
{
	char err[256] = "";
	/*
	 * Its path unlinked, the stuck listener is put aside, reachable by no
	 * one: the connections it took keep going (closing it would close
	 * them, and was seen to hang nng's reaper). Beyond KVPD_MAX_RETIRED
	 * renewals the oldest is closed after all.
	 */
	if (strncmp(t->urls[i], "ipc://", 6) == 0) {
		(void)unlink(t->urls[i] + 6);
		if (t->num_retired == KVPD_MAX_RETIRED) {
			nng_listener_close(t->retired[0]);
			memmove(t->retired, t->retired + 1, sizeof(t->retired[0]) * (KVPD_MAX_RETIRED - 1));
			t->num_retired--;
		}
		t->retired[t->num_retired++] = t->listeners[i];
	} else {
		nng_listener_close(t->listeners[i]);
	}
	int rv = kvpd_tr_listen(t, i, err, sizeof(err));
	struct kvpd_log_field f[] = {{"endpoint", t->urls[i]},
	                             {"cause", "a connection failed, after which nng 1.5 accepts "
	                                       "no more (seen after kvpoold was paused, when a "
	                                       "client had given up)"},
	                             {"error", err}};
	kvpd_log_fields(rv == 0 ? KVPD_WARN : KVPD_ERROR, "transport",
	                rv == 0 ? "the endpoint stopped taking new connections; listening again"
	                        : "the endpoint stopped taking new connections and cannot listen "
	                          "again",
	                f, rv == 0 ? 2 : 3);
}

static void
watch_main(void *arg)
{
	struct kvpd_transport *t = arg;

	for (;;) {
		nng_mtx_lock(t->listen_mu);
		if (t->listening)
			(void)nng_cv_until(t->listen_cv, nng_clock() + WATCH_MS);
		if (!t->listening) {
			nng_mtx_unlock(t->listen_mu);
			return;
		}
		nng_stat *all = NULL;
		if (nng_stats_get(&all) != 0) {
			nng_mtx_unlock(t->listen_mu);
			continue;
		}
		for (size_t i = 0; i < t->num_listeners; i++) {
			if (strncmp(t->urls[i], "ipc://", 6) != 0)
				continue;
			uint64_t errors = 0;
			for (size_t k = 0; k < sizeof(error_kinds) / sizeof(error_kinds[0]); k++)
				errors += counter(all, t->listeners[i], error_kinds[k]);
			bool suspect = errors > t->seen[i].errors || t->seen[i].unproven ||
			               ++t->seen[i].looks >= ROUTINE;
			if (suspect)
				t->seen[i].looks = 0;
			/* The probe's own connection ends as an error too: not a cause to look again. */
			t->seen[i].errors = errors + (suspect ? 1 : 0);
			/* The probe waits without the lock: close() may come meanwhile. */
			nng_mtx_unlock(t->listen_mu);
			bool stuck = suspect && !answers(t->urls[i]);
			nng_mtx_lock(t->listen_mu);
			if (suspect && !stuck)
				t->seen[i].unproven = false;
			if (stuck && t->listening)
				renew(t, i);
		}
		if (t->num_retired > 0 && t->listening)
			reap_hung(t);
		nng_mtx_unlock(t->listen_mu);
		nng_stats_free(all);
	}
}

int
kvpd_tr_listen_watch_start(struct kvpd_transport *t)
{
	return nng_thread_create(&t->listen_thr, watch_main, t) == 0 ? 0 : -1;
}

void
kvpd_tr_listen_watch_stop(struct kvpd_transport *t)
{
	nng_mtx_lock(t->listen_mu);
	t->listening = false;
	nng_cv_wake(t->listen_cv);
	nng_mtx_unlock(t->listen_mu);
	if (t->listen_thr != NULL) {
		nng_thread_destroy(t->listen_thr); /* joins it */
		t->listen_thr = NULL;
	}
}
