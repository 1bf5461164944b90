/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The RPC transport's connection watch: which connections are open and when
 * each last sent, closing idle ones; the bounds on one connection's and the
 * unauthenticated peers' unread replies; the pressure watch that closes a
 * non-reader once half the contexts wait on their peers; failed TLS
 * handshakes counted. transport.c calls these from its workers and timers.
 */
#include <nng/nng.h>
#include <nng/supplemental/util/platform.h>
#include <stdio.h>
#include <string.h>

#include <arpa/inet.h>

#include "service/net/transport_impl.h"

/* A connection's peer as text: ip:port, [ip6]:port, or the ipc path. */
void
kvpd_tr_peer_name(nng_pipe p, char *buf, size_t cap)
{
	nng_sockaddr sa;
	char ip[INET6_ADDRSTRLEN] = "?";

	snprintf(buf, cap, "unknown");
	if (nng_pipe_get_addr(p, NNG_OPT_REMADDR, &sa) != 0)
		return;
	switch (sa.s_family) {
	case NNG_AF_INET:
		inet_ntop(AF_INET, &sa.s_in.sa_addr, ip, sizeof(ip));
		snprintf(buf, cap, "%s:%u", ip, (unsigned)ntohs(sa.s_in.sa_port));
		break;
	case NNG_AF_INET6:
		inet_ntop(AF_INET6, sa.s_in6.sa_addr, ip, sizeof(ip));
		snprintf(buf, cap, "[%s]:%u", ip, (unsigned)ntohs(sa.s_in6.sa_port));
		break;
	case NNG_AF_IPC:
		snprintf(buf, cap, "ipc:%s", sa.s_ipc.sa_path[0] ? sa.s_ipc.sa_path : "(local)");
		break;
	default:
		break;
	}
}

/* ---- idle connections ---- */

/* A conns.m value of a connection still watched for idling (not absent, not closing). */
static bool
watched(uint64_t v)
{
	return v != 0 && v != KVPD_CONN_CLOSING;
}

void
kvpd_tr_conn_touch(struct kvpd_transport *t, nng_pipe p)
{
	uint32_t id = (uint32_t)nng_pipe_id(p);
	if (t->idle_timeout <= 0 || (int32_t)id <= 0)
		return;
	nng_mtx_lock(t->conns.mu);
	if (watched(kvpd_u64map_get(&t->conns.m, id))) /* a replace: never allocates */
		(void)kvpd_u64map_put(&t->conns.m, id, (uint64_t)nng_clock() + 1);
	nng_mtx_unlock(t->conns.mu);
}

void
kvpd_tr_pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
{
	struct kvpd_transport *t = arg;
	uint32_t id = (uint32_t)nng_pipe_id(p);

	nng_sockaddr sa;
	uint64_t peer = 0;

	if (ev == NNG_PIPE_EV_ADD_POST)
		peer = kvpd_peer_value(nng_pipe_get_addr(p, NNG_OPT_REMADDR, &sa) == 0 ? &sa : NULL);
	nng_mtx_lock(t->conns.mu);
	if (ev == NNG_PIPE_EV_ADD_POST) {
		/* Out of memory: untracked, never closed for idling, no address bound. */
		if (t->idle_timeout > 0)
			(void)kvpd_u64map_put(&t->conns.m, id, (uint64_t)nng_clock() + 1);
		(void)kvpd_u64map_put(&t->conns.peers, id, peer);
	} else if (ev == NNG_PIPE_EV_REM_POST) {
		(void)kvpd_u64map_del(&t->conns.m, id);
		(void)kvpd_u64map_del(&t->conns.peers, id);
	}
	nng_mtx_unlock(t->conns.mu);
}

/* A request came on p: it is not idle; its peer value (conn_bounds.h), in one lock. */
uint64_t
kvpd_tr_conn_seen(struct kvpd_transport *t, nng_pipe p)
{
	uint32_t id = (uint32_t)nng_pipe_id(p);
	uint64_t v;
	nng_mtx_lock(t->conns.mu);
	if (t->idle_timeout > 0 && watched(kvpd_u64map_get(&t->conns.m, id)))
		(void)kvpd_u64map_put(&t->conns.m, id, (uint64_t)nng_clock() + 1); /* a replace */
	v = kvpd_u64map_get(&t->conns.peers, id);
	nng_mtx_unlock(t->conns.mu);
	return v != 0 ? v : kvpd_peer_value(NULL);
}

/* The connection has shown a pool's token: it keeps precedence while it lasts. */
void
kvpd_tr_conn_trust(struct kvpd_transport *t, nng_pipe p)
{
	uint32_t id = (uint32_t)nng_pipe_id(p);
	nng_mtx_lock(t->conns.mu);
	uint64_t v = kvpd_u64map_get(&t->conns.peers, id);
	if (v != 0 && !(v & KVPD_PEER_TRUSTED)) /* a replace: never allocates */
		(void)kvpd_u64map_put(&t->conns.peers, id, v | KVPD_PEER_TRUSTED);
	nng_mtx_unlock(t->conns.mu);
}

/*
 * The contexts other than self that hold a reply their peer has not taken,
 * into out (num_workers entries). Each field is read on its own: a context
 * that changes meanwhile is seen before or after, which only makes one
 * decision a request early or late.
 */
static size_t
held_snapshot(struct kvpd_transport *t, const struct worker *self, struct kvpd_held *out)
{
	size_t n = 0;
	for (size_t i = 0; i < t->num_workers; i++) {
		struct worker *w = &t->workers[i];
		uint64_t at = atomic_load(&w->send_at);
		if (w == self || at == 0)
			continue;
		out[n].since_ms = at;
		out[n].pipe = (uint32_t)atomic_load(&w->send_pipe);
		out[n].peer = (uint64_t)atomic_load(&w->send_peer);
		n++;
	}
	return n;
}

/*
 * Closes connections that sent no request within the idle timeout. nng's
 * clients redial by themselves, so a live client only reconnects; a silent
 * peer loses its socket. Closing happens outside the lock (it calls kvpd_tr_pipe_cb).
 */
void
kvpd_tr_reaper_cb(void *arg)
{
	struct kvpd_transport *t = arg;
	enum { BATCH = 64 };
	uint32_t idle[BATCH];
	size_t n = 0;
	nng_time now = nng_clock();

	if (nng_aio_result(t->reaper) != 0 || atomic_load(&t->closing))
		return;
	nng_mtx_lock(t->conns.mu);
	for (size_t i = 0; i < t->conns.m.cap && n < BATCH; i++) {
		const struct kvpd_u64pair *e = &t->conns.m.v[i];
		if (watched(e->val) && now - (nng_time)(e->val - 1) >= (nng_time)t->idle_timeout)
			idle[n++] = (uint32_t)e->key;
	}
	for (size_t k = 0; k < n; k++) /* replaces: never allocate */
		(void)kvpd_u64map_put(&t->conns.m, idle[k], KVPD_CONN_CLOSING);
	nng_mtx_unlock(t->conns.mu);
	for (size_t k = 0; k < n; k++) {
		nng_pipe p = NNG_PIPE_INITIALIZER;
		char peer[160] = "", conn[24], ms[24];
		p.id = idle[k];
		kvpd_tr_peer_name(p, peer, sizeof(peer));
		if (nng_pipe_close(p) != 0)
			continue;
		kvpd_server_count_close(t->srv, KVPD_CLOSE_IDLE);
		snprintf(conn, sizeof(conn), "%u", (unsigned)idle[k]);
		snprintf(ms, sizeof(ms), "%d", (int)t->idle_timeout);
		struct kvpd_log_field f[] = {{"connection", conn}, {"peer", peer}, {"idle_timeout_ms", ms}};
		kvpd_log_fields(KVPD_INFO, "transport", "closed an idle connection", f, 3);
	}
	nng_sleep_aio(t->idle_timeout / 4 > 1000 ? 1000 : t->idle_timeout / 4 + 1, t->reaper);
}

/*
 * Failed TLS handshakes on the RPC listeners, from nng's listener statistics
 * ("auth": NNG_ECRYPTO / NNG_EPEERAUTH at accept): counted as closes and
 * logged, the first at once, then one line in 10 s at most with the count.
 * nng 1.5 drops such a connection before it is a pipe, so its peer address
 * is not known here; the client side names the reason (kvp_client_open's
 * detail).
 */
static void
count_tls_failures(struct kvpd_transport *t)
{
	nng_stat *all = NULL;
	uint64_t total = 0, dropped = 0;

	if (t->tls == NULL || nng_stats_get(&all) != 0)
		return;
	for (size_t i = 0; i < t->num_listeners; i++) {
		nng_stat *ls = nng_stat_find_listener(all, t->listeners[i]), *auth;
		if (ls != NULL && (auth = nng_stat_find(ls, "auth")) != NULL)
			total += nng_stat_value(auth);
	}
	nng_stats_free(all);
	if (total <= t->tls_failed)
		return;
	uint64_t n = total - t->tls_failed;
	t->tls_failed = total;
	t->tls_unlogged += n;
	for (uint64_t k = 0; k < n; k++)
		kvpd_server_count_close(t->srv, KVPD_CLOSE_TLS);
	if (!kvpd_log_enabled(KVPD_WARN) ||
	    !kvpd_log_limit_take(&t->tls_log, (uint64_t)nng_clock(), &dropped))
		return;
	char count[24];
	snprintf(count, sizeof(count), "%llu", (unsigned long long)t->tls_unlogged);
	t->tls_unlogged = 0;
	struct kvpd_log_field f[] = {{"handshakes", count},
	                             {"peer", "not known (the connection never completed)"},
	                             {"reason", "no or untrusted client certificate, an untrusted "
	                                        "daemon certificate, or not TLS"}};
	kvpd_log_fields(KVPD_WARN, "tls", "TLS handshakes on the RPC endpoint failed", f, 3);
}

/*
 * Closes connection id for reason; the first time it is cut (its other
 * replies fail and close it again), counts and logs it with msg and, when
 * key is set, one more field.
 */
void
kvpd_tr_cut(struct kvpd_transport *t, uint32_t id, enum kvpd_close_reason reason, const char *msg,
    const char *key, const char *val)
{
	nng_pipe p = NNG_PIPE_INITIALIZER;
	char peer[160] = "", conn[24];
	p.id = id;
	kvpd_tr_peer_name(p, peer, sizeof(peer)); /* before it closes */
	if (nng_pipe_close(p) != 0 || atomic_exchange(&t->last_cut, id) == id)
		return;
	kvpd_server_count_close(t->srv, reason);
	snprintf(conn, sizeof(conn), "%u", (unsigned)id);
	struct kvpd_log_field f[] = {{"connection", conn}, {"peer", peer},
	                             {"reason", kvpd_close_reason_name(reason)}, {key, val}};
	kvpd_log_fields(KVPD_WARN, "transport", msg, f, key != NULL ? 4 : 3);
}

void
kvpd_tr_pressure_cb(void *arg)
{
	struct kvpd_transport *t = arg;
	size_t slow = 0;

	if (nng_aio_result(t->pressure) != 0 || atomic_load(&t->closing))
		return;
	enum kvpd_close_reason why = KVPD_CLOSE_NO_READ;
	size_t nh = held_snapshot(t, NULL, t->held);
	unsigned victim = kvpd_pressure_victim(t->held, nh, t->num_workers, (uint64_t)nng_clock(),
	                                       SLOW_SEND_MS, STALE_SEND_MS, &slow, &why);
	if (victim > 0) {
		char n[24];
		snprintf(n, sizeof(n), "%zu", slow);
		kvpd_tr_cut(t, victim, why,
		    why == KVPD_CLOSE_NO_READ ? "closed a connection that took no reply while half "
		                                "the contexts waited on their peers"
		                              : "closed an unauthenticated connection that took no "
		                                "reply, past its share of the contexts",
		    "contexts_waiting", n);
	}
	if (t->tls != NULL && ++t->tls_ticks >= 1000 / PRESSURE_TICK_MS) {
		t->tls_ticks = 0;
		count_tls_failures(t);
	}
	nng_sleep_aio(PRESSURE_TICK_MS, t->pressure);
}

/*
 * Before a request is served: the bounds of conn_bounds.h. False when the
 * request's own connection was closed (the request is dropped); otherwise
 * another connection may have been closed to make room.
 */
bool
kvpd_tr_within_bounds(struct kvpd_transport *t, struct worker *w, uint64_t peer)
{
	struct kvpd_bound_verdict v;
	uint32_t self = (uint32_t)nng_pipe_id(w->pipe);

	if ((int32_t)self <= 0)
		return true;
	size_t n = held_snapshot(t, w, w->held);
	kvpd_bound_check(w->held, n, t->num_workers, self, peer, (uint64_t)nng_clock(), STALE_SEND_MS,
	                 &v);
	if (v.close == 0)
		return true;
	kvpd_tr_cut(t, v.close, v.reason, kvpd_bound_why(v.reason), NULL, NULL);
	return v.serve;
}
