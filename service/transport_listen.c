/* SPDX-License-Identifier: Apache-2.0 */
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
 * replaced again meanwhile. Open connections keep going; new clients are
 * served within a few hundred milliseconds.
 */
#include "service/transport_impl.h"

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/util/platform.h>
#include <stdio.h>
#include <string.h>

#include "common/nng_close.h"
#include "service/ipc.h"

enum {
	WATCH_MS = 200, /* between looks at the listeners */
	PROBE_MS = 500, /* how long the endpoint may take to answer the probe */
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

/*
 * False only when url took a connection from here (its handshake done) and
 * then left a request unanswered for PROBE_MS: the stuck listener. The
 * request is empty: kvpoold answers it UNKNOWN_POOL at once, counting
 * nothing. Where this cannot tell (no socket, a dial that fails: at the
 * open-files limit the listener's errors grow too, and must not cost the
 * endpoint), true.
 */
static bool
answers(const char *url)
{
	nng_socket s;
	bool ok = true;
	if (nng_req0_open(&s) != 0)
		return true;
	(void)nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, PROBE_MS);
	(void)nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, PROBE_MS);
	if (nng_dial(s, url, NULL, 0) == 0) {
		nng_msg *m = NULL;
		if (nng_msg_alloc(&m, 0) != 0)
			m = NULL;
		else if (nng_sendmsg(s, m, 0) != 0)
			nng_msg_free(m);
		else if (nng_recvmsg(s, &m, 0) == 0)
			nng_msg_free(m);
		else
			ok = false;
	}
	(void)kvp_nng_close_bounded(s, PROBE_MS, NULL, NULL);
	return ok;
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
	nng_listener_close(t->listeners[i]);
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
			bool suspect = errors > t->seen[i].errors || t->seen[i].unproven;
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
