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
#include <time.h>
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
	/* The PUB's endpoint, to open it again, and the payload bytes libzmq still holds. */
	void *ctx;
	char ep[KVPD_PATH_MAX];
	bool ep_bind;
	uint32_t hwm;
	struct queued *queued;           /* the current socket's count */
	size_t queued_max;
};

struct kvpd_vllm {
	struct kvpd_server *srv;
	void *ctx;
	struct pub *pubs;
	size_t n;
	bool has_thread;
	pthread_t thr;
	atomic_bool stop;
	/* Replays in progress (the replay thread's), and their unsent bytes. */
	struct replay *replays;
	struct ghost *ghosts;
	size_t nreplays, nghosts, peer_max, total_max;
	atomic_size_t total_out;
};

static void
count(_Atomic uint64_t *c, uint64_t n)
{
	atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}

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
	count(&p->ctr->publisher_resets, 1);
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
		count(&p->ctr->send_failures, 1);
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
		count(&p->ctr->batches, 1);
		count(&p->ctr->bytes, p->buf.len);
	} else {
		count(&p->ctr->send_failures, 1);
	}
}


/*
 * Replays are paced by what each peer takes. Every payload goes to libzmq
 * as a message whose free callback returns its bytes to the peer's and the
 * daemon's counts: libzmq calls it once the bytes are written to the
 * connection, or dropped with it. A replay sends while its peer has less
 * than replay_peer_mib unsent and every peer together less than
 * replay_total_mib, and waits otherwise; one that gains nothing for
 * STALL_S is cut off (no end marker), as is a request when REPLAYS_MAX
 * replays are in progress. A peer's new request replaces its replay in
 * progress, so repeating requests gains nothing.
 */
#define REPLAYS_MAX 64
#define GHOSTS_MAX 256
#define STALL_S 30
#define ID_MAX 256 /* libzmq's routing ids are 5 bytes, a peer's own at most 255 */

struct acct {               /* one replay's bytes in libzmq's hands */
	atomic_size_t out;
	atomic_int refs;        /* its replay's, and one per message in flight */
	atomic_size_t *total;   /* the daemon's count */
};

struct replay {
	struct pub *p;
	int r;
	struct acct *acct;
	uint8_t id[ID_MAX];
	size_t id_len;
	bool delim;
	uint64_t next, end;
	time_t last;            /* last progress */
};

/* A peer whose replay ended with bytes still unsent: its next request starts from its count. */
struct ghost {
	struct pub *p;
	int r;
	struct acct *acct;
	uint8_t id[ID_MAX];
	size_t id_len;
};

static void
acct_put(struct acct *a)
{
	if (atomic_fetch_sub(&a->refs, 1) == 1)
		free(a);
}

/* libzmq is done with a payload: its bytes leave the counts. */
static void
payload_free(void *data, void *hint)
{
	struct acct *a = hint;
	size_t n = *((size_t *)data - 1);

	atomic_fetch_sub(&a->out, n);
	atomic_fetch_sub(a->total, n);
	free((size_t *)data - 1);
	acct_put(a);
}

static time_t
now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec;
}

/*
 * The reply envelope: identity, the empty delimiter (REQ), the topic.
 * 0: sent; 1: the peer's queue is full (try later); -1: the peer is gone
 * (the ROUTER is mandatory: libzmq says so rather than drop silently).
 */
static int
send_head(struct replay *x)
{
	struct pub *p = x->p;
	if (zmq_send(p->router[x->r], x->id, x->id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
		return errno == EAGAIN ? 1 : -1;
	if (x->delim)
		zmq_send(p->router[x->r], "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
	if (p->router_topic[x->r])
		zmq_send(p->router[x->r], p->topic, p->topic_len, ZMQ_SNDMORE | ZMQ_DONTWAIT);
	return 0;
}

/* Keeps a peer's count (still owed bytes) for its next request; the oldest goes first. */
static void
ghost_keep(struct kvpd_vllm *v, struct replay *x)
{
	if (v->nghosts == GHOSTS_MAX) {
		acct_put(v->ghosts[0].acct);
		memmove(&v->ghosts[0], &v->ghosts[1], (GHOSTS_MAX - 1) * sizeof(*v->ghosts));
		v->nghosts--;
	}
	struct ghost *g = &v->ghosts[v->nghosts++];
	*g = (struct ghost){.p = x->p, .r = x->r, .acct = x->acct, .id_len = x->id_len};
	memcpy(g->id, x->id, x->id_len);
}

/* Forgets the ghosts whose bytes have all gone. */
static void
ghosts_sweep(struct kvpd_vllm *v)
{
	for (size_t i = 0; i < v->nghosts;) {
		if (atomic_load(&v->ghosts[i].acct->out) == 0) {
			acct_put(v->ghosts[i].acct);
			v->ghosts[i] = v->ghosts[--v->nghosts];
		} else {
			i++;
		}
	}
}

static void
replay_end(struct kvpd_vllm *v, size_t i, bool finished)
{
	struct replay *x = &v->replays[i];

	if (finished) {
		uint8_t endb[8];
		kvp_vllm_seq_put(endb, KVP_VLLM_END_SEQ);
		if (send_head(x) == 0) {
			zmq_send(x->p->router[x->r], endb, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT);
			zmq_send(x->p->router[x->r], "", 0, ZMQ_DONTWAIT);
		}
		count(&x->p->ctr->replays, 1);
	} else {
		count(&x->p->ctr->replays_cut, 1);
	}
	if (atomic_load(&x->acct->out) > 0 && !atomic_load(&v->stop))
		ghost_keep(v, x);
	else
		acct_put(x->acct);
	v->replays[i] = v->replays[--v->nreplays];
}

/*
 * Sends what replay i's budget allows. Returns 1 when it is over (ended or
 * cut off; slot i now holds another), else 0.
 */
static int
replay_pump(struct kvpd_vllm *v, size_t i)
{
	struct replay *x = &v->replays[i];
	struct pub *p = x->p;
	size_t peer_max = v->peer_max, total_max = v->total_max;
	bool moved = false;

	while (x->next < x->end) {
		pthread_mutex_lock(&p->mu);
		const struct kvpd_ring_slot *sl = kvpd_ring_get(&p->ring, x->next);
		size_t len = sl ? sl->len : 0, out = atomic_load(&x->acct->out);
		size_t total = atomic_load(&v->total_out);
		/*
		 * Within both budgets; or, for a peer that has taken everything sent
		 * to it, one batch even past them: peers that never read cannot stop
		 * one that does, while the total stays under twice its budget.
		 */
		if (sl != NULL && (out > 0 ? out + len > peer_max || total + len > total_max
		                           : total > 0 && total + len > 2 * total_max)) {
			pthread_mutex_unlock(&p->mu); /* wait for the peers to take some */
			break;
		}
		size_t *buf = sl ? malloc(sizeof(size_t) + (len ? len : 1)) : NULL;
		if (buf != NULL) {
			buf[0] = len;
			memcpy(buf + 1, sl->bytes, len);
		}
		pthread_mutex_unlock(&p->mu);
		if (buf == NULL) { /* left the ring meanwhile (or no memory): a gap, as live */
			x->next++;
			moved = true;
			continue;
		}
		int h = send_head(x);
		if (h != 0) {
			free(buf);
			if (h > 0)
				break; /* its queue is full: later */
			replay_end(v, i, false); /* the peer went: what it had went with it */
			return 1;
		}
		uint64_t s = x->next++;
		moved = true;
		zmq_msg_t payload;
		atomic_fetch_add(&x->acct->out, len);
		atomic_fetch_add(&v->total_out, len);
		atomic_fetch_add(&x->acct->refs, 1);
		zmq_msg_init_data(&payload, buf + 1, len, payload_free, x->acct);
		uint8_t seqb[8];
		kvp_vllm_seq_put(seqb, s);
		zmq_send(p->router[x->r], seqb, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT);
		if (zmq_msg_send(&payload, p->router[x->r], ZMQ_DONTWAIT) < 0)
			zmq_msg_close(&payload);
	}
	time_t t = now_s();
	if (x->next >= x->end) {
		replay_end(v, i, true);
		return 1;
	}
	if (moved)
		x->last = t;
	else if (t - x->last >= STALL_S) {
		replay_end(v, i, false);
		return 1;
	}
	return 0;
}

/* One replay request: [id, "", seq8] (REQ) or [id, seq8] (DEALER), from seq on. */
static void
serve_replay(struct kvpd_vllm *v, struct pub *p, int r)
{
	zmq_msg_t f[4];
	int nf = kvp_vllm_recv_frames(p->router[r], ZMQ_DONTWAIT, f, 4);
	bool delim;
	size_t i;

	if (nf == 3 && zmq_msg_size(&f[1]) == 0 && zmq_msg_size(&f[2]) == 8)
		delim = true;
	else if (nf == 2 && zmq_msg_size(&f[1]) == 8)
		delim = false;
	else
		goto bad;
	if (zmq_msg_size(&f[0]) == 0 || zmq_msg_size(&f[0]) > ID_MAX)
		goto bad;
	uint64_t start = kvp_vllm_seq_get(zmq_msg_data(&f[nf - 1]));
	/* The peer's replay in progress on this endpoint, replaced; else a new one. */
	for (i = 0; i < v->nreplays; i++) {
		struct replay *x = &v->replays[i];
		if (x->p == p && x->r == r && x->id_len == zmq_msg_size(&f[0]) &&
		    memcmp(x->id, zmq_msg_data(&f[0]), x->id_len) == 0)
			break;
	}
	if (i == v->nreplays) {
		struct acct *a = NULL;
		if (v->nreplays == REPLAYS_MAX) {
			count(&p->ctr->replays_cut, 1);
			goto done;
		}
		/* A peer whose earlier replay still has bytes unsent carries them on. */
		for (size_t g = 0; g < v->nghosts && a == NULL; g++) {
			struct ghost *gh = &v->ghosts[g];
			if (gh->p == p && gh->r == r && gh->id_len == zmq_msg_size(&f[0]) &&
			    memcmp(gh->id, zmq_msg_data(&f[0]), gh->id_len) == 0) {
				a = gh->acct;
				v->ghosts[g] = v->ghosts[--v->nghosts];
			}
		}
		if (a == NULL) {
			if ((a = calloc(1, sizeof(*a))) == NULL) {
				count(&p->ctr->replays_cut, 1);
				goto done;
			}
			atomic_init(&a->refs, 1);
			a->total = &v->total_out;
		}
		v->replays[i] = (struct replay){.p = p, .r = r, .acct = a,
		                                .id_len = zmq_msg_size(&f[0])};
		memcpy(v->replays[i].id, zmq_msg_data(&f[0]), v->replays[i].id_len);
		v->nreplays++;
	}
	struct replay *x = &v->replays[i];
	pthread_mutex_lock(&p->mu);
	uint64_t oldest = kvpd_ring_oldest(&p->ring);
	x->end = p->next_seq;
	pthread_mutex_unlock(&p->mu);
	x->next = start > oldest ? start : oldest;
	x->delim = delim;
	x->last = now_s();
	(void)replay_pump(v, i);
done:
	for (int k = 0; k < nf; k++)
		zmq_msg_close(&f[k]);
	return;
bad:
	count(&p->ctr->bad_replay_requests, 1);
	goto done;
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
		/* Replays waiting on their peers are looked at every few milliseconds. */
		if (zmq_poll(items, k, v->nreplays ? 5 : 100) < 0) {
			if (errno == ETERM)
				break;
			continue;
		}
		for (int i = 0; i < k; i++)
			if (items[i].revents & ZMQ_POLLIN)
				serve_replay(v, owner[i], which[i]);
		for (size_t i = 0; i < v->nreplays;)
			if (replay_pump(v, i) == 0)
				i++;
		ghosts_sweep(v);
	}
	while (v->nreplays > 0)
		replay_end(v, 0, false);
	while (v->nghosts > 0)
		acct_put(v->ghosts[--v->nghosts].acct);
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
	if ((v->replays = calloc(REPLAYS_MAX, sizeof(*v->replays))) == NULL ||
	    (v->ghosts = calloc(GHOSTS_MAX, sizeof(*v->ghosts))) == NULL ||
	    (v->ctx = zmq_ctx_new()) == NULL) {
		free(v->ghosts);
		free(v->replays);
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
		queued_put(p->queued); /* messages libzmq still holds keep their own references */
		pthread_mutex_destroy(&p->mu);
	}
	zmq_ctx_term(v->ctx); /* frees what libzmq still held: the replays' counts go with it */
	free(v->ghosts);
	free(v->replays);
	free(v->pubs);
	free(v);
}
