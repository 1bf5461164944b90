/* SPDX-License-Identifier: Apache-2.0 */
#define _POSIX_C_SOURCE 200809L

#include "service/streams/vllm_pub.h"
#include "service/streams/vllm_pub_impl.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "common/kvp_status.h"
#include "proto/vllm_wire.h"
#include "proto/vllm_zmq.h"
#include "service/net/ipc.h"
#include "service/log.h"
#include "service/streams/ring.h"
#include "service/pool/server.h"

/* Payload bytes libzmq holds for one PUB socket: the socket's reference and one per message. */
struct queued {
	atomic_size_t bytes;
	atomic_int refs;
};

static void
queued_put(struct queued *q)
{
	if (q != NULL && atomic_fetch_sub(&q->refs, 1) == 1)
		free(q);
}

static struct queued *
queued_new(void)
{
	struct queued *q = calloc(1, sizeof(*q));
	if (q != NULL)
		atomic_init(&q->refs, 1);
	return q;
}

/* libzmq is done with a published payload (every subscriber's queue let it go). */
static void
queued_free(void *data, void *hint)
{
	struct queued *q = hint;
	size_t *b = (size_t *)data - 1;
	atomic_fetch_sub(&q->bytes, b[0]);
	free(b);
	queued_put(q);
}

/* One message [topic, seq, batch] on the PUB socket (p->buf holds the batch). */
static bool
send_batch(struct pub *p, const char *topic, size_t topic_len, const uint8_t seqb[8])
{
	size_t n = p->buf.len;
	size_t *b = malloc(sizeof(size_t) + (n ? n : 1));
	zmq_msg_t m;

	if (b == NULL || p->pub == NULL || p->queued == NULL) {
		free(b);
		return false;
	}
	b[0] = n;
	memcpy(b + 1, p->buf.data, n);
	atomic_fetch_add(&p->queued->bytes, n);
	atomic_fetch_add(&p->queued->refs, 1);
	zmq_msg_init_data(&m, b + 1, n, queued_free, p->queued);
	if (zmq_send(p->pub, topic, topic_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
	    zmq_send(p->pub, seqb, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
	    zmq_msg_send(&m, p->pub, ZMQ_DONTWAIT) < 0) {
		zmq_msg_close(&m);
		return false;
	}
	return true;
}

static void *open_socket(void *ctx, int type, uint32_t hwm, const char *ep, bool bind, char *err,
                         size_t len);

/*
 * Subscribers that do not read keep every batch libzmq queued for them (up
 * to vllm-hwm messages each, whatever their size). Past vllm-queue-mib of
 * them the PUB socket is closed and opened again: every subscriber's queue
 * goes, and each reconnects by itself and sees the gap in seq (replay fills
 * it). Under the pool's lock.
 */
static void
reopen_pub(struct pub *p)
{
	char err[256];

	if (p->pub != NULL)
		zmq_close(p->pub); /* libzmq drops its queues on its own thread: their bytes leave the old count */
	p->pub = NULL;
	queued_put(p->queued);
	if ((p->queued = queued_new()) == NULL)
		return;
	for (int i = 0; i < 20 && p->pub == NULL; i++) {
		p->pub = open_socket(p->ctx, ZMQ_PUB, p->hwm, p->ep, p->ep_bind, err, sizeof(err));
		if (p->pub == NULL)
			nanosleep(&(struct timespec){0, 5 * 1000 * 1000}, NULL); /* libzmq frees the old listener later */
	}
	kvpd_vllm_count(&p->ctr->publisher_resets, 1);
	struct kvpd_log_field f[] = {{"pool", p->name}, {"endpoint", p->ep}};
	kvpd_log_fields(p->pub ? KVPD_WARN : KVPD_ERROR, "vllm",
	                p->pub ? "subscribers held vllm-queue-mib of batches unread: the publisher "
	                         "was opened again (they reconnect and replay the gap)"
	                       : "cannot open the publisher again; retried at the next batch",
	                f, 2);
}

/* Under the pool's lock: encode, number, keep for replay, send. Never blocks. */
static void
emit(void *ctx, const struct kvp_event_batch *b, uint64_t ts_unix_ns)
{
	struct pub *p = ctx;
	double ts = (double)(ts_unix_ns / 1000000000u) + (double)(ts_unix_ns % 1000000000u) * 1e-9;
	uint8_t seqb[8];
	bool encoded = kvp_vllm_encode(b, ts, p->rank, &p->opts, &p->buf) == KVP_OK;
	uint8_t *copy = NULL; /* the ring's; NULL: lost to replay */

	if (encoded && p->ring.slots != NULL && (copy = malloc(p->buf.len ? p->buf.len : 1)) != NULL)
		memcpy(copy, p->buf.data, p->buf.len);
	pthread_mutex_lock(&p->mu);
	uint64_t seq = p->next_seq++; /* used even on failure: subscribers see the gap */
	if (p->ring.slots != NULL)
		kvpd_ring_put(&p->ring, seq, copy, p->buf.len);
	if (!encoded) {
		pthread_mutex_unlock(&p->mu);
		kvpd_vllm_count(&p->ctr->send_failures, 1);
		return;
	}
	kvp_vllm_seq_put(seqb, seq);
	if (p->pub == NULL || p->queued == NULL || atomic_load(&p->queued->bytes) > p->queued_max)
		reopen_pub(p);
	bool ok = send_batch(p, p->topic, p->topic_len, seqb);
	/* The same batch, number and all, credited to each engine pod the pool serves. */
	for (size_t i = 0; p->pods != NULL && i < p->pods->n; i++) {
		char t[KVPD_PATH_MAX];
		if (kvp_vllm_topic(p->tmpl, p->pods->pod[i].name, p->model, p->name, p->rank, t,
		                   sizeof(t)) == KVP_OK && strcmp(t, p->topic) != 0)
			ok &= send_batch(p, t, strlen(t), seqb);
	}
	pthread_mutex_unlock(&p->mu);
	if (ok) {
		kvpd_vllm_count(&p->ctr->batches, 1);
		kvpd_vllm_count(&p->ctr->bytes, p->buf.len);
	} else {
		kvpd_vllm_count(&p->ctr->send_failures, 1);
	}
}


static void *
open_socket(void *ctx, int type, uint32_t hwm, const char *ep, bool bind, char *err, size_t len)
{
	void *s = zmq_socket(ctx, type);
	int zero = 0, h = (int)hwm;
	int64_t max_in = MAX_INBOUND_BYTES;

	if (s == NULL) {
		snprintf(err, len, "vLLM wire: cannot create a socket: %s", zmq_strerror(errno));
		return NULL;
	}
	if (bind && kvpd_ipc_check(ep, err, len) != 0) {
		zmq_close(s);
		return NULL;
	}
	if (zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero)) != 0 ||
	    zmq_setsockopt(s, ZMQ_SNDHWM, &h, sizeof(h)) != 0 ||
	    zmq_setsockopt(s, ZMQ_RCVHWM, &h, sizeof(h)) != 0 ||
	    zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &max_in, sizeof(max_in)) != 0 ||
	    (bind ? zmq_bind(s, ep) : zmq_connect(s, ep)) != 0) {
		snprintf(err, len, "vLLM wire: cannot %s %s: %s", bind ? "bind" : "connect to", ep,
		         zmq_strerror(errno));
		zmq_close(s);
		return NULL;
	}
	return s;
}

static int
open_pub(struct kvpd_vllm *v, struct pub *p, const struct kvpd_config *cfg,
         const struct kvpd_pool_config *pc, char *err, size_t len)
{
	const struct kvpd_vllm_config *w = &cfg->vllm;
	char ep[KVPD_PATH_MAX];

	p->rank = (uint32_t)pc->dp_rank;
	p->opts.form = w->array_form ? KVP_VLLM_ARRAY : KVP_VLLM_MAP;
	p->opts.hash_bytes = w->hash_bytes;
	if (pthread_mutex_init(&p->mu, NULL) != 0) {
		snprintf(err, len, "vLLM wire: out of resources");
		return KVP_ENOMEM;
	}
	/* config.c checked the topic and endpoints; a failure here is ours. */
	if (kvp_vllm_topic(w->topic, w->pod, pc->model, pc->name, p->rank, p->topic,
	                   sizeof(p->topic)) != KVP_OK ||
	    kvp_vllm_offset_endpoint(w->endpoint, p->rank, ep, sizeof(ep)) != KVP_OK) {
		snprintf(err, len, "vLLM wire: pool %s: bad topic or endpoint", pc->name);
		return KVP_EINVAL;
	}
	p->topic_len = strlen(p->topic);
	snprintf(p->tmpl, sizeof(p->tmpl), "%s", w->topic);
	snprintf(p->model, sizeof(p->model), "%s", pc->model);
	snprintf(p->name, sizeof(p->name), "%s", pc->name);
	p->ctx = v->ctx;
	snprintf(p->ep, sizeof(p->ep), "%s", ep);
	p->ep_bind = kvp_vllm_binds(ep);
	p->hwm = w->hwm;
	p->queued_max = (size_t)w->queue_mib << 20;
	if ((p->queued = queued_new()) == NULL) {
		snprintf(err, len, "vLLM wire: out of memory");
		return KVP_ENOMEM;
	}
	p->pub = open_socket(v->ctx, ZMQ_PUB, w->hwm, ep, p->ep_bind, err, len);
	if (p->pub == NULL)
		return KVP_EINVAL;
	if (strncmp(ep, "ipc://", 6) == 0)
		snprintf(p->ipc_paths[0], sizeof(p->ipc_paths[0]), "%s", ep + 6);
	/* One ring serves both replay endpoints; they differ in the topic frame only. */
	const char *replay[2] = {w->replay, w->replay_plain};
	p->router_topic[0] = w->replay_topic;
	p->router_topic[1] = false;
	if ((replay[0][0] != '\0' || replay[1][0] != '\0') &&
	    kvpd_ring_init(&p->ring, w->buffer_steps, (size_t)w->buffer_mib << 20) != KVP_OK) {
		snprintf(err, len, "vLLM wire: no memory for the replay ring");
		return KVP_ENOMEM;
	}
	for (int r = 0; r < 2; r++) {
		if (replay[r][0] == '\0')
			continue;
		if (kvp_vllm_offset_endpoint(replay[r], p->rank, ep, sizeof(ep)) != KVP_OK) {
			snprintf(err, len, "vLLM wire: pool %s: bad replay endpoint", pc->name);
			return KVP_EINVAL;
		}
		p->router[r] = open_socket(v->ctx, ZMQ_ROUTER, w->hwm, ep, true, err, len);
		int one = 1; /* a peer that went is reported, so its replay ends at once */
		if (p->router[r] != NULL &&
		    zmq_setsockopt(p->router[r], ZMQ_ROUTER_MANDATORY, &one, sizeof(one)) != 0) {
			snprintf(err, len, "vLLM wire: ROUTER_MANDATORY: %s", zmq_strerror(errno));
			return KVP_EINTERNAL;
		}
		if (p->router[r] == NULL)
			return KVP_EINVAL;
		if (strncmp(ep, "ipc://", 6) == 0)
			snprintf(p->ipc_paths[1 + r], sizeof(p->ipc_paths[1 + r]), "%s", ep + 6);
	}
	return KVP_OK;
}

int
kvpd_vllm_open(struct kvpd_server *srv, const struct kvpd_config *cfg, struct kvpd_vllm **out,
               char *err, size_t len)
{
	struct kvpd_vllm *v;
	int rv = KVP_OK;
	bool any_replay = false;

	*out = NULL;
	if (cfg->vllm.endpoint[0] == '\0')
		return KVP_OK;
	if ((v = calloc(1, sizeof(*v))) == NULL ||
	    (v->pubs = calloc(cfg->num_pools, sizeof(*v->pubs))) == NULL) {
		free(v);
		snprintf(err, len, "vLLM wire: out of memory");
		return KVP_ENOMEM;
	}
	v->srv = srv;
	v->peer_max = (size_t)cfg->vllm.replay_peer_mib << 20;
	v->total_max = (size_t)cfg->vllm.replay_total_mib << 20;
	atomic_init(&v->total_out, 0);
	if (kvpd_vllm_replays_init(v) != 0 || (v->ctx = zmq_ctx_new()) == NULL) {
		kvpd_vllm_replays_fini(v);
		free(v->pubs);
		free(v);
		snprintf(err, len, "vLLM wire: cannot create a ZeroMQ context: %s", zmq_strerror(errno));
		return KVP_ENOMEM;
	}
	for (size_t i = 0; i < cfg->num_pools && rv == KVP_OK; i++) {
		v->n = i + 1;
		if (cfg->pools[i].token[0] != '\0' && !cfg->vllm.token_pools) {
			/* The vLLM wire has no authentication: a token's events stay off it. */
			struct kvpd_log_field f[] = {{"pool", cfg->pools[i].name}};
			kvpd_log_fields(KVPD_WARN, "vllm", "pool has a token: not published on the "
			                "vLLM wire, which has no authentication (vllm-token-pools on "
			                "publishes it)", f, 1);
			v->pubs[i].off = true;
			continue;
		}
		rv = open_pub(v, &v->pubs[i], cfg, &cfg->pools[i], err, len);
		any_replay |= v->pubs[i].router[0] != NULL || v->pubs[i].router[1] != NULL;
	}
	if (rv == KVP_OK && any_replay) {
		if (pthread_create(&v->thr, NULL, kvpd_vllm_replay_main, v) != 0) {
			snprintf(err, len, "vLLM wire: cannot start the replay thread");
			rv = KVP_ENOMEM;
		} else {
			v->has_thread = true;
		}
	}
	if (rv != KVP_OK) {
		kvpd_vllm_close(v);
		return rv;
	}
	for (size_t i = 0; i < v->n; i++)
		if (!v->pubs[i].off) {
			v->pubs[i].pods = kvpd_server_pool_pods(srv, i);
			v->pubs[i].ctr = kvpd_server_set_event_sink(srv, i, emit, &v->pubs[i]);
		}
	*out = v;
	return KVP_OK;
}

void
kvpd_vllm_close(struct kvpd_vllm *v)
{
	if (v == NULL)
		return;
	/* Detached under each pool's lock: no call is inside emit() after this. */
	for (size_t i = 0; i < v->n; i++)
		if (v->pubs[i].ctr != NULL)
			(void)kvpd_server_set_event_sink(v->srv, i, NULL, NULL);
	atomic_store(&v->stop, true);
	if (v->has_thread)
		pthread_join(v->thr, NULL);
	for (size_t i = 0; i < v->n; i++) {
		struct pub *p = &v->pubs[i];
		if (p->off)
			continue;
		if (p->pub)
			zmq_close(p->pub);
		for (int r = 0; r < 2; r++)
			if (p->router[r])
				zmq_close(p->router[r]);
		for (int k = 0; k < 3; k++) /* libzmq leaves the socket files behind */
			if (p->ipc_paths[k][0] != '\0')
				(void)unlink(p->ipc_paths[k]);
		kvpd_ring_fini(&p->ring);
		kvp_vllm_buf_fini(&p->buf);
		queued_put(p->queued); /* messages libzmq still holds keep their own references */
		pthread_mutex_destroy(&p->mu);
	}
	zmq_ctx_term(v->ctx); /* frees what libzmq still held: the replays' counts go with it */
	kvpd_vllm_replays_fini(v);
	free(v->pubs);
	free(v);
}
