/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vllm_pub_impl.h: what the vLLM wire's publisher (vllm_pub.c) shares with
 * its replay server (vllm_replay.c). Internal to the daemon.
 */
#ifndef KVPD_VLLM_PUB_IMPL_H
#define KVPD_VLLM_PUB_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/vllm_wire.h"
#include "service/streams/ring.h"
#include "service/pool/server.h"
#include "service/streams/vllm_pub.h"

struct queued;
struct replay;
struct ghost;

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

static inline void
kvpd_vllm_count(_Atomic uint64_t *c, uint64_t n)
{
	atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}

/* The replays' tables for v (REPLAYS_MAX, GHOSTS_MAX): 0, or -1 out of memory. */
int kvpd_vllm_replays_init(struct kvpd_vllm *v);
/* Frees them; accepts tables never allocated. */
void kvpd_vllm_replays_fini(struct kvpd_vllm *v);
/* The replay thread: serves the ROUTER endpoints of v's pools until v->stop. */
void *kvpd_vllm_replay_main(void *arg);

#endif
