/* SPDX-License-Identifier: Apache-2.0 */
#include "service/transport.h"

#include <nng/nng.h>
#include <nng/protocol/pubsub0/pub.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/supplemental/tls/tls.h>
#include <nng/supplemental/util/platform.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>

#include "common/kvp_status.h"
#include "common/nng_close.h"
#include "proto/wire.h"
#include "service/config_impl.h"
#include "service/conn_bounds.h"
#include "service/ipc.h"
#include "service/log.h"
#include "service/u64map.h"

enum { RECV, SEND };

struct worker {
	struct kvpd_transport *t;
	nng_ctx ctx;
	nng_aio *aio;
	int state;
	nng_pipe pipe;         /* the connection the reply in flight goes to */
	/* While a reply waits for its peer: when the send began (0: none) and the
	 * pipe id, for the pressure watch (another thread) to read. */
	atomic_uint_fast64_t send_at;
	atomic_uint send_pipe;
	atomic_uint_fast64_t send_peer; /* that connection's peer value (conn_bounds.h) */
	struct kvpd_held *held;         /* scratch: the others' unread replies, at a request */
};

/*
 * Context pressure: when at least half the contexts hold replies their
 * peers have not taken for SLOW_SEND_MS, the connection whose reply has
 * waited longest is closed, an unauthenticated one first (conn_bounds.h;
 * its replies fail at once, freeing their
 * contexts), so peers that pipeline and never read cannot keep the rest
 * waiting up to --send-timeout-ms. Honest peers take a reply within
 * milliseconds; a reply slower than this to a peer that is reading (a huge
 * ReadBlocks over a slow link) is cut only while contexts are that scarce.
 */
#define SLOW_SEND_MS 250
#define PRESSURE_TICK_MS 25
/* A reply waiting this long is a non-reader's, for the unauthenticated shares
 * (a reading peer's send completes within microseconds). */
#define STALE_SEND_MS 50

/*
 * The open connections and when each last sent a request (or took a reply):
 * nng pipe id -> that time + 1 (a u64map value is never 0), so the hot path
 * (one update per request) costs two short probes; and each one's peer
 * value (address key, and whether it has shown a pool's token).
 */
struct conns {
	nng_mtx *mu;
	struct kvpd_u64map m;     /* with --idle-timeout-ms only */
	struct kvpd_u64map peers; /* pipe id -> peer value */
};

struct kvpd_transport {
	struct kvpd_server *srv;
	nng_socket sock;
	nng_listener listeners[KVPD_MAX_URLS];
	size_t num_listeners;
	nng_tls_config *tls;
	nng_socket pub;
	bool has_pub;
	struct worker *workers;
	size_t num_slots;               /* workers allocated */
	size_t num_workers;             /* ...of which opened */
	atomic_int in_flight;
	atomic_bool closing;
	atomic_uint_fast64_t served;
	nng_duration send_timeout;
	atomic_uint last_cut;           /* the connection last closed for not reading */
	nng_duration idle_timeout;      /* 0: idle connections stay */
	struct conns conns;
	nng_aio *reaper;                /* wakes to close idle connections */
	nng_aio *pressure;              /* wakes to watch for contexts held by non-readers */
	struct kvpd_held *held;         /* the pressure watch's scratch */
	/* Refusals a peer can cause by the thousand: a few lines a second of each kind. */
	struct kvpd_log_limit refusal_log[KVPD_NUM_REFUSALS];
	uint64_t tls_failed;            /* failed TLS handshakes counted so far (pressure_cb) */
	uint64_t tls_unlogged;          /* ...of which no log line has told yet */
	unsigned tls_ticks;             /* pressure ticks since they were last counted */
	struct kvpd_log_limit tls_log;
};

/* A connection's peer as text: ip:port, [ip6]:port, or the ipc path. */
static void
peer_name(nng_pipe p, char *buf, size_t cap)
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

/* A refusal worth an operator's eye, at most a few lines a second whatever a peer sends. */
static void
log_refusal(struct kvpd_transport *t, nng_pipe p, const struct kvpd_sink *sink)
{
	static const char *const what[KVPD_NUM_REFUSALS][2] = {
		{"", ""},
		{"auth", "refused authentication"},
		{"session", "refused a session: the pool is at --max-sessions"},
		{"transport", "refused a request larger than --max-msg-bytes"},
	};
	uint64_t dropped = 0;
	char peer[160], conn[24], more[24];
	unsigned k = sink->refusal;
	if (k == 0 || k >= KVPD_NUM_REFUSALS || !kvpd_log_enabled(KVPD_WARN) ||
	    !kvpd_log_limit_take(&t->refusal_log[k], (uint64_t)nng_clock(), &dropped))
		return;
	peer_name(p, peer, sizeof(peer));
	snprintf(conn, sizeof(conn), "%u", (unsigned)nng_pipe_id(p));
	snprintf(more, sizeof(more), "%llu", (unsigned long long)dropped);
	struct kvpd_log_field f[] = {{"pool", sink->refusal_pool}, {"peer", peer},
	                             {"connection", conn}, {"reason", sink->refusal_why},
	                             {"not_logged_before", more}};
	kvpd_log_fields(KVPD_WARN, what[k][0], what[k][1], f, dropped ? 5 : 4);
}

/* The reply goes straight into a new nng message: large replies are written once. */
static void *
msg_sink(void *ctx, size_t len)
{
	nng_msg **m = ctx;
	if (*m != NULL)
		nng_msg_free(*m);
	*m = NULL;
	if (nng_msg_alloc(m, len) != 0) {
		*m = NULL;
		return NULL;
	}
	return nng_msg_body(*m);
}

/* ---- idle connections ---- */

static void
conn_touch(struct kvpd_transport *t, nng_pipe p)
{
	uint32_t id = (uint32_t)nng_pipe_id(p);
	if (t->idle_timeout <= 0 || (int32_t)id <= 0)
		return;
	nng_mtx_lock(t->conns.mu);
	if (kvpd_u64map_get(&t->conns.m, id) != 0) /* a replace: never allocates */
		(void)kvpd_u64map_put(&t->conns.m, id, (uint64_t)nng_clock() + 1);
	nng_mtx_unlock(t->conns.mu);
}

static void
pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
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
static uint64_t
conn_seen(struct kvpd_transport *t, nng_pipe p)
{
	uint32_t id = (uint32_t)nng_pipe_id(p);
	uint64_t v;
	nng_mtx_lock(t->conns.mu);
	if (t->idle_timeout > 0 && kvpd_u64map_get(&t->conns.m, id) != 0)
		(void)kvpd_u64map_put(&t->conns.m, id, (uint64_t)nng_clock() + 1); /* a replace */
	v = kvpd_u64map_get(&t->conns.peers, id);
	nng_mtx_unlock(t->conns.mu);
	return v != 0 ? v : kvpd_peer_value(NULL);
}

/* The connection has shown a pool's token: it keeps precedence while it lasts. */
static void
conn_trust(struct kvpd_transport *t, nng_pipe p)
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
 * peer loses its socket. Closing happens outside the lock (it calls pipe_cb).
 */
static void
reaper_cb(void *arg)
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
		if (e->val != 0 && now - (nng_time)(e->val - 1) >= (nng_time)t->idle_timeout)
			idle[n++] = (uint32_t)e->key;
	}
	nng_mtx_unlock(t->conns.mu);
	for (size_t k = 0; k < n; k++) {
		nng_pipe p = NNG_PIPE_INITIALIZER;
		char peer[160] = "", conn[24], ms[24];
		p.id = idle[k];
		peer_name(p, peer, sizeof(peer));
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
static void
cut(struct kvpd_transport *t, uint32_t id, enum kvpd_close_reason reason, const char *msg,
    const char *key, const char *val)
{
	nng_pipe p = NNG_PIPE_INITIALIZER;
	char peer[160] = "", conn[24];
	p.id = id;
	peer_name(p, peer, sizeof(peer)); /* before it closes */
	if (nng_pipe_close(p) != 0 || atomic_exchange(&t->last_cut, id) == id)
		return;
	kvpd_server_count_close(t->srv, reason);
	snprintf(conn, sizeof(conn), "%u", (unsigned)id);
	struct kvpd_log_field f[] = {{"connection", conn}, {"peer", peer},
	                             {"reason", kvpd_close_reason_name(reason)}, {key, val}};
	kvpd_log_fields(KVPD_WARN, "transport", msg, f, key != NULL ? 4 : 3);
}

static void
pressure_cb(void *arg)
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
		cut(t, victim, why,
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
static bool
within_bounds(struct kvpd_transport *t, struct worker *w, uint64_t peer)
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
	cut(t, v.close, v.reason, kvpd_bound_why(v.reason), NULL, NULL);
	return v.serve;
}

static void
worker_cb(void *arg)
{
	struct worker *w = arg;
	struct kvpd_transport *t = w->t;
	nng_msg *msg;
	int rv;

	switch (w->state) {
	case RECV:
		if ((rv = nng_aio_result(w->aio)) != 0) {
			if (rv == NNG_ECLOSED || atomic_load(&t->closing))
				return;
			nng_ctx_recv(w->ctx, w->aio); /* a broken pipe: keep serving */
			return;
		}
		msg = nng_aio_get_msg(w->aio);
		nng_aio_set_msg(w->aio, NULL); /* ours now: the aio holds only what nng must send */
		atomic_fetch_add(&t->in_flight, 1);
		w->pipe = nng_msg_get_pipe(msg);
		uint64_t pv = conn_seen(t, w->pipe);
		if (!within_bounds(t, w, pv)) {
			nng_msg_free(msg);
			atomic_fetch_sub(&t->in_flight, 1);
			nng_ctx_recv(w->ctx, w->aio);
			return;
		}
		nng_msg *reply = NULL;
		struct kvpd_sink sink = {.alloc = msg_sink, .ctx = &reply};
		rv = kvpd_server_handle_to(t->srv, nng_msg_body(msg), nng_msg_len(msg), nng_clock(),
		                           &sink);
		nng_msg_free(msg);
		if (sink.authenticated && !(pv & KVPD_PEER_TRUSTED)) {
			conn_trust(t, w->pipe);
			pv |= KVPD_PEER_TRUSTED;
		}
		if (sink.refusal)
			log_refusal(t, w->pipe, &sink);
		if (rv != KVP_OK || reply == NULL) {
			/* Not even an error reply fits in memory: drop it; the client retries. */
			if (reply)
				nng_msg_free(reply);
			atomic_fetch_sub(&t->in_flight, 1);
			nng_ctx_recv(w->ctx, w->aio);
			return;
		}
		nng_msg_chop(reply, nng_msg_len(reply) - sink.len);
		nng_aio_set_msg(w->aio, reply);
		w->state = SEND;
		/*
		 * A peer that stops reading fills its socket buffer; without a
		 * bound, each reply to it would hold a context forever and every
		 * other client would wait. Past the bound the connection goes:
		 * its other pending replies fail at once and free their contexts.
		 */
		nng_aio_set_timeout(w->aio, t->send_timeout);
		atomic_store(&w->send_pipe, (unsigned)nng_pipe_id(w->pipe));
		atomic_store(&w->send_peer, pv);
		atomic_store(&w->send_at, (uint64_t)nng_clock() | 1);
		nng_ctx_send(w->ctx, w->aio);
		return;
	case SEND:
		atomic_store(&w->send_at, 0);
		if ((rv = nng_aio_result(w->aio)) != 0) {
			nng_msg_free(nng_aio_get_msg(w->aio));
			nng_aio_set_msg(w->aio, NULL);
			if (rv == NNG_ETIMEDOUT && nng_pipe_id(w->pipe) > 0) {
				char ms[24];
				snprintf(ms, sizeof(ms), "%d", (int)t->send_timeout);
				cut(t, (uint32_t)nng_pipe_id(w->pipe), KVPD_CLOSE_NO_READ,
				    "closed a connection that took no reply", "send_timeout_ms", ms);
			}
		} else {
			atomic_fetch_add(&t->served, 1);
			conn_touch(t, w->pipe); /* a long call is not idleness */
		}
		atomic_fetch_sub(&t->in_flight, 1);
		nng_aio_set_timeout(w->aio, NNG_DURATION_INFINITE); /* receiving waits */
		w->state = RECV;
		if (!atomic_load(&t->closing))
			nng_ctx_recv(w->ctx, w->aio);
		return;
	}
}

int
kvpd_transport_open(struct kvpd_server *srv, const struct kvpd_config *cfg,
                    struct kvpd_transport **out, char *err, size_t len)
{
	struct kvpd_transport *t = calloc(1, sizeof(*t));
	int rv;

	if (t == NULL) {
		snprintf(err, len, "out of memory");
		return KVP_ENOMEM;
	}
	t->srv = srv;
	for (int k = 0; k < KVPD_NUM_REFUSALS; k++)
		t->refusal_log[k] = (struct kvpd_log_limit){.per_window = 5, .window_ms = 1000};
	t->tls_log = (struct kvpd_log_limit){.per_window = 1, .window_ms = 10000};
	t->send_timeout = (nng_duration)cfg->send_timeout_ms;
	t->idle_timeout = (nng_duration)cfg->idle_timeout_ms;
	if (nng_mtx_alloc(&t->conns.mu) != 0 || nng_aio_alloc(&t->reaper, reaper_cb, t) != 0 ||
	    nng_aio_alloc(&t->pressure, pressure_cb, t) != 0) {
		snprintf(err, len, "out of memory");
		if (t->reaper)
			nng_aio_free(t->reaper);
		if (t->conns.mu)
			nng_mtx_free(t->conns.mu);
		free(t);
		return KVP_ENOMEM;
	}
	if ((rv = nng_rep0_open(&t->sock)) != 0) {
		snprintf(err, len, "cannot open a REP socket: %s", nng_strerror(rv));
		nng_aio_free(t->pressure);
		nng_aio_free(t->reaper);
		nng_mtx_free(t->conns.mu);
		free(t);
		return KVP_EINTERNAL;
	}
	if ((rv = nng_pipe_notify(t->sock, NNG_PIPE_EV_ADD_POST, pipe_cb, t)) != 0 ||
	    (rv = nng_pipe_notify(t->sock, NNG_PIPE_EV_REM_POST, pipe_cb, t)) != 0) {
		snprintf(err, len, "cannot watch connections: %s", nng_strerror(rv));
		goto fail;
	}
	/* nng accepts any size by default; a network-facing socket must not. Slack
	 * above max-msg-bytes lets a slightly oversized request get a clear reply. */
	(void)nng_socket_set_size(t->sock, NNG_OPT_RECVMAXSZ, (size_t)cfg->max_msg_bytes + 65536);
	if (cfg->tls_cert[0] != '\0' && kvpd_tls_server_config(cfg, &t->tls, err, len) != 0)
		goto fail;
	t->workers = calloc(cfg->contexts, sizeof(*t->workers));
	t->held = calloc(cfg->contexts, sizeof(*t->held));
	if (t->workers == NULL || t->held == NULL) {
		snprintf(err, len, "out of memory");
		goto fail;
	}
	t->num_slots = cfg->contexts;
	for (uint32_t i = 0; i < cfg->contexts; i++) {
		struct worker *w = &t->workers[i];
		w->t = t;
		if ((w->held = calloc(cfg->contexts, sizeof(*w->held))) == NULL) {
			snprintf(err, len, "out of memory");
			goto fail;
		}
		if ((rv = nng_aio_alloc(&w->aio, worker_cb, w)) != 0 ||
		    (rv = nng_ctx_open(&w->ctx, t->sock)) != 0) {
			snprintf(err, len, "cannot open context %u: %s", i, nng_strerror(rv));
			goto fail;
		}
		t->num_workers++;
	}
	for (size_t i = 0; i < cfg->num_rpc; i++) {
		nng_listener l;
		if (kvpd_ipc_check(cfg->rpc[i], err, len) != 0)
			goto fail;
		if ((rv = nng_listener_create(&l, t->sock, cfg->rpc[i])) != 0) {
			snprintf(err, len, "endpoint %s: %s", cfg->rpc[i], nng_strerror(rv));
			goto fail;
		}
		t->listeners[t->num_listeners++] = l;
		if (strncmp(cfg->rpc[i], "tls+", 4) == 0 &&
		    (rv = nng_listener_set_ptr(l, NNG_OPT_TLS_CONFIG, t->tls)) != 0) {
			snprintf(err, len, "endpoint %s: TLS: %s", cfg->rpc[i], nng_strerror(rv));
			goto fail;
		}
		if ((rv = nng_listener_start(l, 0)) != 0) {
			snprintf(err, len, "cannot listen on %s: %s", cfg->rpc[i], nng_strerror(rv));
			goto fail;
		}
	}
	if (cfg->events[0] != '\0') {
		nng_listener l;
		if (kvpd_ipc_check(cfg->events, err, len) != 0)
			goto fail;
		if ((rv = nng_pub0_open(&t->pub)) != 0) {
			snprintf(err, len, "cannot open a PUB socket: %s", nng_strerror(rv));
			goto fail;
		}
		t->has_pub = true;
		/* PUB drops silently when a subscriber's queue is full: deep queues,
		 * and sequence numbers for the rest. */
		(void)nng_socket_set_int(t->pub, NNG_OPT_SENDBUF, 8192);
		if ((rv = nng_listener_create(&l, t->pub, cfg->events)) != 0 ||
		    (strncmp(cfg->events, "tls+", 4) == 0 &&
		     (rv = nng_listener_set_ptr(l, NNG_OPT_TLS_CONFIG, t->tls)) != 0) ||
		    (rv = nng_listener_start(l, 0)) != 0) {
			snprintf(err, len, "cannot publish events on %s: %s", cfg->events, nng_strerror(rv));
			goto fail;
		}
		kvpd_server_set_publisher(srv, kvpd_transport_publish, t);
	}
	for (size_t i = 0; i < t->num_workers; i++) {
		t->workers[i].state = RECV;
		nng_ctx_recv(t->workers[i].ctx, t->workers[i].aio);
	}
	if (t->idle_timeout > 0)
		nng_sleep_aio(0, t->reaper);
	nng_sleep_aio(PRESSURE_TICK_MS, t->pressure);
	*out = t;
	return KVP_OK;
fail:
	kvpd_transport_close(t, 0);
	return KVP_EINTERNAL;
}

/*
 * nng 1.5 can hang in nng_close (common/nng_close.h). A daemon asked to stop
 * must stop: past CLOSE_GRACE_MS what nng may still touch is left alive
 * (reachable from `abandoned`) and the process exits without it.
 */
enum { CLOSE_GRACE_MS = 1000 };

static struct kvpd_transport *abandoned;

/* Closes s within CLOSE_GRACE_MS; false if nng did not finish (s is then left as it is). */
static bool
close_bounded(nng_socket s, const char *what)
{
	if (kvp_nng_close_bounded(s, CLOSE_GRACE_MS, NULL, NULL))
		return true;
	char ms[24];
	snprintf(ms, sizeof(ms), "%d", CLOSE_GRACE_MS);
	struct kvpd_log_field f[] = {{"socket", what}, {"waited_ms", ms},
	                             {"cause", "nng 1.5 shutdown race (nanomsg/nng#1813)"}};
	kvpd_log_fields(KVPD_WARN, "transport",
	                "a socket did not close in time; exiting without waiting for it", f, 3);
	return false;
}

void
kvpd_transport_close(struct kvpd_transport *t, uint32_t drain_ms)
{
	if (t == NULL)
		return;
	/* Stop accepting connections; let calls in flight finish, within drain_ms. */
	for (size_t i = 0; i < t->num_listeners; i++)
		nng_listener_close(t->listeners[i]);
	atomic_store(&t->closing, true);
	for (uint32_t waited = 0; atomic_load(&t->in_flight) > 0 && waited < drain_ms; waited += 10)
		nng_msleep(10);
	for (size_t i = 0; i < t->num_workers; i++) {
		nng_aio_stop(t->workers[i].aio);
		/*
		 * A reply handed to a stopped aio is refused without a callback
		 * (nng 1.5: nni_aio_begin fails): it is still in the aio, ours.
		 */
		nng_msg *left = nng_aio_get_msg(t->workers[i].aio);
		nng_aio_set_msg(t->workers[i].aio, NULL);
		if (left != NULL)
			nng_msg_free(left);
	}
	nng_aio_stop(t->reaper);
	nng_aio_stop(t->pressure);
	if (t->has_pub)
		kvpd_server_set_publisher(t->srv, NULL, NULL);
	/* Its connections' REM_POST callbacks take conns.mu: t outlives a close that hangs. */
	if (!close_bounded(t->sock, "rpc") || (t->has_pub && !close_bounded(t->pub, "events"))) {
		abandoned = t;
		return;
	}
	for (size_t i = 0; i < t->num_workers; i++)
		nng_aio_free(t->workers[i].aio);
	for (size_t i = 0; t->workers != NULL && i < t->num_slots; i++)
		free(t->workers[i].held);
	nng_aio_free(t->reaper);
	nng_aio_free(t->pressure);
	nng_mtx_free(t->conns.mu);
	kvpd_u64map_fini(&t->conns.m);
	kvpd_u64map_fini(&t->conns.peers);
	free(t->workers);
	free(t->held);
	if (t->tls)
		nng_tls_config_free(t->tls);
	free(t);
}

void
kvpd_transport_publish(void *ctx, const char *pool, const uint8_t *batch, size_t len)
{
	struct kvpd_transport *t = ctx;
	nng_msg *msg;

	/* Topic: the pool's name and a 0 byte, so SUB can filter by pool. */
	if (nng_msg_alloc(&msg, 0) != 0)
		return;
	if (nng_msg_append(msg, pool, strlen(pool) + 1) != 0 ||
	    nng_msg_append(msg, batch, len) != 0 || nng_sendmsg(t->pub, msg, NNG_FLAG_NONBLOCK) != 0)
		nng_msg_free(msg); /* the subscriber repairs from the replay ring */
}

uint64_t
kvpd_transport_served(const struct kvpd_transport *t)
{
	return atomic_load(&((struct kvpd_transport *)t)->served);
}
