/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vllm_replay.c: vLLM's replay endpoints (ROUTER sockets), served by one
 * thread, each replay paced by what its peer takes.
 */
#define _POSIX_C_SOURCE 200809L

#include "service/streams/vllm_pub_impl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "proto/vllm_zmq.h"
#include "service/log.h"

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
		kvpd_vllm_count(&x->p->ctr->replays, 1);
	} else {
		kvpd_vllm_count(&x->p->ctr->replays_cut, 1);
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
			kvpd_vllm_count(&p->ctr->replays_cut, 1);
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
				kvpd_vllm_count(&p->ctr->replays_cut, 1);
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
	kvpd_vllm_count(&p->ctr->bad_replay_requests, 1);
	goto done;
}

void *
kvpd_vllm_replay_main(void *arg)
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

int
kvpd_vllm_replays_init(struct kvpd_vllm *v)
{
	v->replays = calloc(REPLAYS_MAX, sizeof(*v->replays));
	v->ghosts = calloc(GHOSTS_MAX, sizeof(*v->ghosts));
	return v->replays != NULL && v->ghosts != NULL ? 0 : -1;
}

void
kvpd_vllm_replays_fini(struct kvpd_vllm *v)
{
	free(v->ghosts);
	free(v->replays);
	v->ghosts = NULL;
	v->replays = NULL;
}
