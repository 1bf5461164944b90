/* SPDX-License-Identifier: Apache-2.0 */
/*
 * session.h: a client's session on one pool: the block references it holds
 * (a multiset with the order they were taken, so a lost session releases
 * them newest first, as the scheduler would have), its lease, and its
 * recent replies (so a retried call id is answered, not applied twice).
 *
 * Internal to the daemon; callers hold the pool's lock. Never prints.
 */
#ifndef KVPD_SESSION_H
#define KVPD_SESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "service/rpc/u64map.h"

#define KVPD_REPLY_CACHE 16
#define KVPD_REPLY_CACHE_BYTES (4u << 20)

struct kvpd_cached_reply {
	uint64_t call_id; /* 0: empty */
	uint32_t request_crc; /* CRC32C of the request: a reused call id is not a retry */
	uint64_t stamp;       /* the pool's order of storing, so its oldest go first */
	uint8_t *bytes;
	size_t len;
};

struct kvpd_session {
	uint64_t id;
	uint64_t last_seen_ms;
	uint32_t lease_ms;
	char client[64];
	char vllm_pod[64];    /* the engine pod it serves (HelloRequest.vllm_pod); "" none */
	/*
	 * Held references: open addressing (linear probing) id -> count, an id
	 * and its count side by side so a probe touches one line. An id leaves
	 * its slot when its count reaches 0 (backward-shift deletion, no
	 * tombstones), so used is the ids held and the table stays their size.
	 */
	struct kvpd_ref {
		int32_t id; /* -1: empty */
		uint32_t count;
	} *refs;
	uint32_t cap, used;
	uint64_t held;        /* references in total */
	uint64_t rows;        /* of those, region rows reserved or locked (the region calls' count) */
	uint64_t *pool_held;  /* the pool's count over its sessions, kept with held; may be NULL */
	int32_t *log;         /* acquisition order; may hold released entries */
	size_t log_len, log_cap;
	uint32_t *seen;       /* the log's compaction counts per slot, all 0 between uses */
	uint32_t seen_cap;    /* seen's length; cap's when last compacted */
	/*
	 * Requests this session created: its ids -> the manager's (pool-wide,
	 * increasing, so also creation order; never 0). Every request call
	 * looks one up, so a scan would be O(requests) per call.
	 */
	struct kvpd_u64map reqs;
	struct kvpd_cached_reply cache[KVPD_REPLY_CACHE];
	unsigned cache_next;
	size_t cache_bytes;
};

/* Creates a session; NULL on allocation failure. */
struct kvpd_session *kvpd_session_create(uint64_t id, uint32_t lease_ms, const char *client,
                                         uint64_t now_ms);
void kvpd_session_destroy(struct kvpd_session *s);

/* References this session holds on block id. */
uint32_t kvpd_session_held(const struct kvpd_session *s, int32_t id);
/*
 * Makes room for n more references (so recording them after the engine
 * succeeded cannot fail). KVP_OK or KVP_ENOMEM.
 */
int kvpd_session_reserve(struct kvpd_session *s, size_t n);
/* Records one more reference on id (after kvpd_session_reserve). */
void kvpd_session_add(struct kvpd_session *s, int32_t id);
/* Drops one reference on id; the caller checked it is held. */
void kvpd_session_remove(struct kvpd_session *s, int32_t id);
/*
 * Drops one reference per occurrence of each id but skip, in order, if the
 * session holds them all (a repeated id needs a reference per occurrence):
 * returns n. Otherwise it drops nothing and returns the index of the first
 * occurrence not held. One probe per id, where checking each id's earlier
 * repeats first cost more than the free itself.
 */
size_t kvpd_session_take(struct kvpd_session *s, const int32_t *ids, size_t n, int32_t skip);
/* Gives back what a successful kvpd_session_take(s, ids, n, skip) dropped. */
void kvpd_session_untake(struct kvpd_session *s, const int32_t *ids, size_t n, int32_t skip);
/*
 * Releases the session's references newest first, examining at most max
 * entries of its acquisition log: free_one(ctx, id) for each reference
 * still held (KVP_OK: released). It consumes the log from its end, so a
 * later call goes on where this one stopped; the session is done when
 * s->held or s->log_len is 0. Returns how many entries it examined.
 */
size_t kvpd_session_release_some(struct kvpd_session *s, size_t max,
                                 int (*free_one)(void *ctx, int32_t id), void *ctx);
/* Forgets every stored reply; returns the bytes freed. */
size_t kvpd_session_forget_replies(struct kvpd_session *s);

/* The manager id of this session's request client_id, or 0 if none. */
uint64_t kvpd_session_request(const struct kvpd_session *s, uint64_t client_id);
/* Records a new request mapping. KVP_OK or KVP_ENOMEM. */
int kvpd_session_add_request(struct kvpd_session *s, uint64_t client_id, uint64_t mgr_id);
/* Forgets a request mapping (no-op if absent). */
void kvpd_session_remove_request(struct kvpd_session *s, uint64_t client_id);
/*
 * Ends every request mapping: calls fn(ctx, mgr_id) for each, newest first
 * (sorted in the table's own storage: nothing to allocate, nothing to fail),
 * and leaves the table empty.
 */
void kvpd_session_end_requests(struct kvpd_session *s, void (*fn)(void *ctx, uint64_t mgr_id),
                               void *ctx);

/* Calls fn(ctx, mgr_id) for each of this session's requests, in no order. */
void kvpd_session_each_request(const struct kvpd_session *s,
                               void (*fn)(void *ctx, uint64_t mgr_id), void *ctx);

/* A stored reply for call_id, or NULL. */
const struct kvpd_cached_reply *kvpd_session_cached(const struct kvpd_session *s,
                                                    uint64_t call_id);
/*
 * Stores a copy of a reply with the pool's stamp (evicting this session's
 * oldest until it fits the session's budget, or all of them for a reply
 * larger than the budget); silently skips on ENOMEM. The caller reads
 * s->cache_bytes before and after to keep the pool's total.
 */
void kvpd_session_remember(struct kvpd_session *s, uint64_t call_id, uint32_t request_crc,
                           const uint8_t *reply, size_t len, uint64_t stamp);
/* The stamp of this session's oldest stored reply; UINT64_MAX if it has none. */
uint64_t kvpd_session_oldest_stamp(const struct kvpd_session *s);
/* Whether this session still stores the reply stored with stamp. */
bool kvpd_session_holds_stamp(const struct kvpd_session *s, uint64_t stamp);
/* Forgets this session's oldest stored reply; returns the bytes it freed. */
size_t kvpd_session_forget_oldest(struct kvpd_session *s);

#endif /* KVPD_SESSION_H */
