/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The RPC transport: nng REP contexts that receive, decode, lock the pool,
 * dispatch and send; the watch over connections (idle ones, unread replies,
 * failed TLS handshakes) is transport_conns.c's.
 */
#include "service/net/transport.h"

#include <nng/nng.h>
#include <nng/protocol/pubsub0/pub.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/supplemental/tls/tls.h>
#include <nng/supplemental/util/platform.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kvp_status.h"
#include "common/nng_close.h"
#include "proto/wire.h"
#include "service/net/ipc.h"
#include "service/net/refusal.h"
#include "service/net/transport_impl.h"

/* A refusal worth an operator's eye, at most a few lines a second whatever a peer sends. */
static void
log_refusal(struct kvpd_transport *t, nng_pipe p, const struct kvpd_sink *sink)
{
	char peer[160], conn[24];
	if (sink->refusal == 0)
		return;
	kvpd_tr_peer_name(p, peer, sizeof(peer));
	snprintf(conn, sizeof(conn), "%u", (unsigned)nng_pipe_id(p));
	kvpd_log_refusal(t->refusal_log, peer, conn, sink);
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
		uint64_t pv = kvpd_tr_conn_seen(t, w->pipe);
		if (!kvpd_tr_within_bounds(t, w, pv)) {
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
			kvpd_tr_conn_trust(t, w->pipe);
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
				kvpd_tr_cut(t, (uint32_t)nng_pipe_id(w->pipe), KVPD_CLOSE_NO_READ,
				    "closed a connection that took no reply", "send_timeout_ms", ms);
			}
		} else {
			atomic_fetch_add(&t->served, 1);
			kvpd_tr_conn_touch(t, w->pipe); /* a long call is not idleness */
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
	if (nng_mtx_alloc(&t->conns.mu) != 0 || nng_mtx_alloc(&t->listen_mu) != 0 ||
	    nng_cv_alloc(&t->listen_cv, t->listen_mu) != 0 ||
	    nng_aio_alloc(&t->reaper, kvpd_tr_reaper_cb, t) != 0 ||
	    nng_aio_alloc(&t->pressure, kvpd_tr_pressure_cb, t) != 0) {
		snprintf(err, len, "out of memory");
		if (t->reaper)
			nng_aio_free(t->reaper);
		if (t->listen_cv)
			nng_cv_free(t->listen_cv);
		if (t->listen_mu)
			nng_mtx_free(t->listen_mu);
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
	if ((rv = nng_pipe_notify(t->sock, NNG_PIPE_EV_ADD_POST, kvpd_tr_pipe_cb, t)) != 0 ||
	    (rv = nng_pipe_notify(t->sock, NNG_PIPE_EV_REM_POST, kvpd_tr_pipe_cb, t)) != 0) {
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
	t->ipc_mode = cfg->ipc_mode;
	for (size_t i = 0; i < cfg->num_rpc; i++) {
		snprintf(t->urls[i], sizeof(t->urls[i]), "%s", cfg->rpc[i]);
		if (kvpd_tr_listen(t, i, err, len) != 0)
			goto fail;
		t->num_listeners++;
	}
	t->listening = true;
	/* Same-host channels beside the first ipc:// endpoint (chan.h). */
	for (size_t i = 0; i < cfg->num_rpc && cfg->shm_channels > 0; i++) {
		if (strncmp(cfg->rpc[i], "ipc://", 6) != 0)
			continue;
		if (kvpd_chans_open(srv, cfg->rpc[i] + 6, cfg->ipc_mode, cfg->shm_channels,
		                    (size_t)cfg->max_msg_bytes + 65536, &t->chans, err, len) != KVP_OK)
			goto fail;
		break;
	}
	if (kvpd_tr_listen_watch_start(t) != 0) {
		snprintf(err, len, "cannot start a thread");
		goto fail;
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
	kvpd_tr_listen_watch_stop(t);
	/* Same-host channels finish the call each serves, then end. */
	kvpd_chans_close(t->chans);
	t->chans = NULL;
	for (size_t i = 0; i < t->num_listeners; i++)
		nng_listener_close(t->listeners[i]);
	for (size_t i = 0; i < t->num_retired; i++)
		nng_listener_close(t->retired[i]);
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
	nng_cv_free(t->listen_cv);
	nng_mtx_free(t->listen_mu);
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
