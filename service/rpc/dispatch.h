/* SPDX-License-Identifier: Apache-2.0 */
/*
 * dispatch.h: a hosted pool and the handlers of every call on it.
 *
 * Internal to the daemon. Every function here runs under the pool's lock
 * (server.c takes it). The handlers validate the whole call (limits,
 * ranges, ownership) before the engine changes anything, and record
 * ownership only after the engine succeeded.
 */
#ifndef KVPD_DISPATCH_H
#define KVPD_DISPATCH_H

#include <nng/nng.h>
#include <nng/supplemental/util/platform.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "service/config/config.h"
#include "common/events.h"
#include "kvpool.pb-c.h"
#include "service/rpc/envelope.h"
#include "service/rpc/fill.h"
#include "service/rpc/pool_types.h"
#include "service/rpc/sink.h"
#include "service/rpc/u64map.h"
#include "service/rpc/session.h"
#include "service/streams/stream.h"

struct kvp_pool;
struct kvp_hasher;
struct kvp_mgr;
struct kvp_exec;

/* A bump allocator for one call's reply messages, reset after each call. */
#define KVPD_CHUNK (64u << 10)
#define KVPD_ARENA_KEEP (1u << 20)
struct kvpd_chunk {
	struct kvpd_chunk *next;
	size_t used, cap;
	_Alignas(16) unsigned char data[];
};
struct kvpd_arena {
	struct kvpd_chunk *head, *cur;
};
void kvpd_arena_fini(struct kvpd_arena *a);

struct kvpd_pool {
	struct kvpd_pool_config cfg;
	struct {
		uint32_t max_ids, lease_ms, max_sessions;
		uint64_t max_refs;        /* every session's references together */
		uint64_t session_refs;    /* one session's references (its quota) */
		uint64_t session_rows;    /* one session's region rows reserved or locked */
		uint32_t max_session_requests;
		size_t max_reply_bytes;
		size_t reply_cache_bytes; /* stored replies over every session */
		uint32_t deadline_skew_ms; /* allowed past a call's deadline */
	} limits;
	size_t reply_cache_used;        /* bytes of stored replies, every session */
	uint64_t refs_held;             /* block references every session holds */
	struct kvpd_session **ending;   /* ended sessions whose references are being released */
	size_t num_ending, cap_ending;
	uint64_t reply_stamp;           /* order of storing, pool-wide */
	/*
	 * Every stored reply's (session id, stamp), oldest first, from
	 * ages[ages_head]; entries whose reply has gone since are skipped when
	 * met and dropped when the array is full, so finding the pool's oldest
	 * stored reply is O(1) amortized, whatever the number of sessions.
	 */
	struct kvpd_reply_age {
		uint64_t session_id, stamp;
	} *ages;
	size_t ages_head, ages_len, ages_cap;
	nng_mtx *lock;
	struct kvp_pool *pool;
	struct kvp_hasher *hasher;
	struct kvp_mgr *mgr;
	struct kvp_exec *exec;          /* the KV memory; NULL with executor=none */
	uint32_t *row_crc;              /* with a region: each row's CRC32C at its commit; else NULL */
	uint32_t *row_hits;             /* with a region: each row's counted lookups since then */
	struct kvpd_keep *keep;         /* restart=warm: the rows' records (keep.h); else NULL */
	struct kvpd_disk *disk;         /* disk=: the disk tier below the region (disk.h); else NULL */
	struct kvpd_fill fill;          /* with a region and cluster_wait_ms: keys the cluster fills */
	uint8_t *zeros;                 /* clear=alloc: one block of zeros to write over each new one */
	struct kvpd_pool_pods pods;     /* read by the vLLM wire's publisher, under the lock */
	char exec_note[512];            /* how the executor was chosen and sized, for the log */
	struct kvp_event_batch events;  /* drained after every call (published by #4) */
	struct kvpd_session **sessions;
	size_t num_sessions, cap_sessions;
	struct kvpd_u64map session_index; /* session id -> its index in sessions + 1 */
	size_t expire_at;                 /* where kvpd_pool_expire's round goes on */
	uint8_t none_fp[8];
	struct kvpd_stream stream;      /* epoch, seq, replay ring, publisher */
	bool events_on;                 /* a publisher consumes events (else none are recorded) */
	uint64_t next_mgr_id;           /* pool-wide ids for the manager's requests */
	struct kvpd_pool_counters counters;
	struct kvpd_arena arena;
	struct kvpd_gone_session gone[KVPD_GONE_KEEP]; /* ring: ended sessions */
	uint64_t gone_total;                           /* ends so far; the next goes at % KEEP */
};

/* The ended session id, if the pool still remembers it; else NULL. */
const struct kvpd_gone_session *kvpd_pool_find_gone(const struct kvpd_pool *p, uint64_t id);

struct kvpd_server {
	struct kvpd_config cfg;
	struct kvpd_pool *pools;
	size_t num_pools;
	_Atomic uint64_t closes[KVPD_CLOSE_REASONS]; /* connections the transport closed */
	_Atomic uint64_t shm_channels, shm_calls;    /* same-host channels open; calls over them */
};

/* Encodes a reply into the sink. KVP_OK or KVP_ENOMEM. */
int kvpd_pack_reply(const Kvpool__V1__Reply *r, struct kvpd_sink *sink);

/*
 * What a call computed before it took the pool's lock: a Commit's rows and
 * their checksums (the daemon's, over the rows as the writer left them),
 * so that hashing a large commit does not hold every other call. The
 * handler uses them only if the keys still name the same rows.
 */
struct kvpd_precomputed {
	int32_t *ids;
	uint32_t *crcs;
	size_t n;
};

/*
 * For a Commit that asks the daemon to checksum its rows: with p's lock
 * held, the rows its keys name if this session reserved them all, into
 * pre (allocated; kvpd_precomputed_fini frees). pre->n stays 0 otherwise
 * (the handler then refuses the call or checksums under the lock).
 */
void kvpd_commit_prepare(struct kvpd_pool *p, const Kvpool__V1__Request *rq,
                         struct kvpd_precomputed *pre);
/* Without p's lock: the checksums of pre's rows. */
void kvpd_commit_checksum(struct kvpd_pool *p, struct kvpd_precomputed *pre);
void kvpd_precomputed_fini(struct kvpd_precomputed *pre);

/*
 * Runs one decoded request on pool p and encodes the reply into the sink.
 * request_crc: CRC32C of the request's bytes, which tells a retry (same
 * call id, same bytes: the first reply again) from a reused call id. pre:
 * what the call computed before the lock, or NULL.
 */
int kvpd_dispatch(struct kvpd_pool *p, const Kvpool__V1__Request *rq, uint32_t request_crc,
                  uint64_t now_ms, const struct kvpd_precomputed *pre, struct kvpd_sink *sink);

/*
 * Before a request's body is decoded (p's lock held): a call that needs a
 * session names one that p has and, on a pool with a token, carries that
 * token. KVP_OK to go on; else the UNAUTHENTICATED reply is in the sink
 * (counted as the call's), and *pack_rv is its encoding status.
 */
int kvpd_dispatch_precheck(struct kvpd_pool *p, const struct kvpd_envelope *e, uint64_t now_ms,
                           struct kvpd_sink *sink, int *pack_rv);

/* The pool's session with this id, and its slot in *index; NULL if none. */
struct kvpd_session *kvpd_pool_find_session(struct kvpd_pool *p, uint64_t id, size_t *index);

/* Whether got (len bytes) is the token want, compared in constant time. */
bool kvpd_token_matches(const char *want, const uint8_t *got, size_t len);

/*
 * Ends session index of p now (why: Goodbye or expiry): it leaves the
 * table, its requests end, its stored replies go, its pod's count drops;
 * its references join the pool's pending releases (or, out of memory, are
 * released at once). Publishes nothing.
 */
void kvpd_pool_drop_session(struct kvpd_pool *p, size_t index, enum kvpd_gone_why why,
                            uint64_t now_ms);

/* Ends a session's requests and releases every reference it holds, newest first. */
size_t kvpd_pool_release_session(struct kvpd_pool *p, struct kvpd_session *s);

/* References an ended session's release examines per lock hold. */
#define KVPD_RELEASE_SLICE 65536u

/*
 * Goes on releasing ended sessions' references (Goodbye, expiry), at most
 * max of them; true while some remain. The caller drops and retakes the
 * lock between calls, so other calls run between slices.
 */
bool kvpd_pool_release_pending(struct kvpd_pool *p, size_t max);

/* Publishes the events the last calls produced as one batch (if any). */
void kvpd_pool_publish(struct kvpd_pool *p);

/*
 * Ends at most max of the pool's sessions whose lease ran out, looking at
 * no more than KVPD_EXPIRE_SCAN sessions, from where the previous call
 * stopped. Returns how many it ended; *more says whether this round has
 * sessions left to look at (call again, the lock released in between; a
 * round ends with *more false and the next starts at the first session).
 */
#define KVPD_EXPIRE_SCAN 256
size_t kvpd_pool_expire(struct kvpd_pool *p, uint64_t now_ms, size_t max, bool *more);

/* The pool's engine gauges and counters (for Stats and /metrics). */
void kvpd_pool_gauges(struct kvpd_pool *p, struct kvpd_pool_gauges *out);

/* The engine's invariants plus ownership: sessions hold no more than the ref counts. */
int kvpd_pool_check(struct kvpd_pool *p, char *detail, size_t len);

#endif /* KVPD_DISPATCH_H */
