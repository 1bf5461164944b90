/* SPDX-License-Identifier: Apache-2.0 */
#define _POSIX_C_SOURCE 200809L

#include "service/vllm_pub.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "common/kvp_status.h"
#include "proto/vllm_wire.h"
#include "proto/vllm_zmq.h"
#include "service/ipc.h"
#include "service/log.h"
#include "service/ring.h"
#include "service/server.h"

/* Largest replay request or subscription a peer may send; vLLM's are 8 bytes. */
#define MAX_INBOUND_BYTES 4096

struct pub {
	char topic[KVPD_PATH_MAX];
	char ipc_paths[3][KVPD_PATH_MAX]; /* ipc files we bound, removed at close */
	size_t topic_len;
	uint32_t rank;
	void *pub;
	void *router[2];                 /* vllm-replay, vllm-replay-plain; NULL: none */
	bool router_topic[2];            /* whether that endpoint's replies carry the topic */
	pthread_mutex_t mu;              /* pub socket, ring, next_seq */
	uint64_t next_seq;
	struct kvpd_ring ring;           /* slots NULL without a replay endpoint */
	struct kvp_vllm_opts opts;
	struct kvp_vllm_buf buf;         /* encoding scratch; under the pool's lock */
	struct kvpd_vllm_counters *ctr;
	bool off;                        /* a pool with a token, not published (vllm-token-pools off) */
	/* Engine pods the pool's sessions serve: each batch also goes out under their topics. */
	const struct kvpd_pool_pods *pods;
	char tmpl[KVPD_PATH_MAX], model[KVPD_NAME_MAX], name[KVPD_NAME_MAX];
};

struct kvpd_vllm {
	struct kvpd_server *srv;
	void *ctx;
	struct pub *pubs;
	size_t n;
	bool has_thread;
	pthread_t thr;
	atomic_bool stop;
};

static void
count(_Atomic uint64_t *c, uint64_t n)
{
	atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}

/* One message [topic, seq, batch] on the PUB socket (p->buf holds the batch). */
static bool
send_batch(struct pub *p, const char *topic, size_t topic_len, const uint8_t seqb[8])
{
	return zmq_send(p->pub, topic, topic_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0 &&
	       zmq_send(p->pub, seqb, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0 &&
	       zmq_send(p->pub, p->buf.data, p->buf.len, ZMQ_DONTWAIT) >= 0;
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
		count(&p->ctr->send_failures, 1);
		return;
	}
	kvp_vllm_seq_put(seqb, seq);
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
		count(&p->ctr->batches, 1);
		count(&p->ctr->bytes, p->buf.len);
	} else {
		count(&p->ctr->send_failures, 1);
	}
}

/* Sends the reply envelope: identity, the empty delimiter (REQ), the topic. */
static void
send_head(struct pub *p, int r, const zmq_msg_t *id, bool delim)
{
	zmq_send(p->router[r], zmq_msg_data((zmq_msg_t *)id), zmq_msg_size(id),
	         ZMQ_SNDMORE | ZMQ_DONTWAIT);
	if (delim)
		zmq_send(p->router[r], "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
	if (p->router_topic[r])
		zmq_send(p->router[r], p->topic, p->topic_len, ZMQ_SNDMORE | ZMQ_DONTWAIT);
}

/*
 * One replay request: [id, "", seq8] (REQ) or [id, seq8] (DEALER). Every
 * batch the ring holds from seq on, then the end marker. The pool's lock is
 * never taken; the ring's lock only while one payload is copied.
 */
static void
serve_replay(struct pub *p, int r)
{
	zmq_msg_t f[4];
	int nf = kvp_vllm_recv_frames(p->router[r], ZMQ_DONTWAIT, f, 4);
	bool delim;
	uint64_t start;

	if (nf == 3 && zmq_msg_size(&f[1]) == 0 && zmq_msg_size(&f[2]) == 8)
		delim = true;
	else if (nf == 2 && zmq_msg_size(&f[1]) == 8)
		delim = false;
	else
		goto bad;
	start = kvp_vllm_seq_get(zmq_msg_data(&f[nf - 1]));

	pthread_mutex_lock(&p->mu);
	uint64_t end = p->next_seq, oldest = kvpd_ring_oldest(&p->ring);
	pthread_mutex_unlock(&p->mu);
	for (uint64_t s = start > oldest ? start : oldest; s < end; s++) {
		zmq_msg_t payload;
		bool have = false;
		pthread_mutex_lock(&p->mu);
		const struct kvpd_ring_slot *sl = kvpd_ring_get(&p->ring, s);
		if (sl != NULL && zmq_msg_init_size(&payload, sl->len) == 0) {
			memcpy(zmq_msg_data(&payload), sl->bytes, sl->len);
			have = true;
		}
		pthread_mutex_unlock(&p->mu);
		if (!have)
			continue;
		uint8_t seqb[8];
		kvp_vllm_seq_put(seqb, s);
		send_head(p, r, &f[0], delim);
		zmq_send(p->router[r], seqb, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT);
		if (zmq_msg_send(&payload, p->router[r], ZMQ_DONTWAIT) < 0)
			zmq_msg_close(&payload);
	}
	uint8_t endb[8];
	kvp_vllm_seq_put(endb, KVP_VLLM_END_SEQ);
	send_head(p, r, &f[0], delim);
	zmq_send(p->router[r], endb, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT);
	zmq_send(p->router[r], "", 0, ZMQ_DONTWAIT);
	count(&p->ctr->replays, 1);
	for (int i = 0; i < nf; i++)
		zmq_msg_close(&f[i]);
	return;
bad:
	count(&p->ctr->bad_replay_requests, 1);
	for (int i = 0; i < nf; i++)
		zmq_msg_close(&f[i]);
}

static void *
replay_main(void *arg)
{
	struct kvpd_vllm *v = arg;
	zmq_pollitem_t items[2 * KVPD_MAX_POOLS];
	struct pub *owner[2 * KVPD_MAX_POOLS];
	int which[2 * KVPD_MAX_POOLS];
	int k = 0;

	for (size_t i = 0; i < v->n; i++)
		for (int r = 0; r < 2; r++)
			if (v->pubs[i].router[r] != NULL) {
				items[k] = (zmq_pollitem_t){.socket = v->pubs[i].router[r],
				                            .events = ZMQ_POLLIN};
				which[k] = r;
				owner[k++] = &v->pubs[i];
			}
	while (!atomic_load(&v->stop)) {
		if (zmq_poll(items, k, 100) < 0) {
			if (errno == ETERM)
				break;
			continue;
		}
		for (int i = 0; i < k; i++)
			if (items[i].revents & ZMQ_POLLIN)
				serve_replay(owner[i], which[i]);
	}
	return NULL;
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
	p->pub = open_socket(v->ctx, ZMQ_PUB, w->hwm, ep, kvp_vllm_binds(ep), err, len);
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
	if ((v->ctx = zmq_ctx_new()) == NULL) {
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
		if (pthread_create(&v->thr, NULL, replay_main, v) != 0) {
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
		pthread_mutex_destroy(&p->mu);
	}
	zmq_ctx_term(v->ctx);
	free(v->pubs);
	free(v);
}
