/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvpool.h: libkvpool, the C client of kvpoold.
 *
 * A client is one session on one pool of one daemon: kvp_client_open()
 * dials the URL (ipc://, tcp://, tls+tcp://) and says Hello; every call
 * then carries the session id. nng reconnects by itself if the connection
 * drops, and the session survives a reconnect as long as its lease does.
 * A call that times out is sent again with the same call id, and the
 * daemon answers a repeated call id with its first reply instead of
 * applying the call twice. Errors are the kvp_status codes of the engine
 * (the wire's numbers); kvp_client_last_detail() has the daemon's text.
 *
 * Not thread-safe: one thread at a time per client (open one per thread).
 * Never prints.
 *
 * ABI: before 1.0 a minor release may change the ABI (a struct here may
 * gain trailing fields), so the shared library's soname carries the minor
 * (libkvpool.so.0.2 for 0.2.x); releases of one minor only add functions.
 */
#ifndef KVPOOL_CLIENT_H
#define KVPOOL_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/block_hash.h"
#include "common/group_spec.h"
#include "common/kvp_status.h"

/* kvp_client_options.retries: the library's default, 2 retries. */
#define KVP_RETRIES_DEFAULT UINT32_MAX

struct kvp_client_options {
	const char *url;            /* required */
	const char *pool;           /* NULL: "default" */
	const char *token;          /* the pool's auth token; NULL: none */
	const char *client_name;    /* shown in the daemon's logs; NULL: "libkvpool" */
	uint32_t lease_ms;          /* requested lease; 0: the daemon's default */
	uint32_t timeout_ms;        /* per attempt; 0: 5000 */
	uint32_t retries;           /* attempts after a timeout, same call id: 0 is none
	                             * (a call waits timeout_ms at most);
	                             * KVP_RETRIES_DEFAULT: 2 */
	const char *tls_ca_file;    /* tls+tcp://: CA that signed the daemon's cert */
	const char *tls_cert_file;  /* tls+tcp:// with mutual TLS: our certificate... */
	const char *tls_key_file;   /* ...and its key */
	const char *tls_server_name; /* NULL: the URL's host */
	uint64_t session_id;        /* non-zero: resume this session instead of Hello (a
	                             * Heartbeat checks it and fetches the pool's info;
	                             * an unknown session: KVP_EUNAUTH) */
	uint32_t connect_timeout_ms; /* how long kvp_client_open waits for a first
	                              * connection before KVP_EUNAVAILABLE; 0:
	                              * timeout_ms x (retries + 1), which also lets a
	                              * daemon that is still starting come up */
	bool tls_insecure;          /* tls+tcp:// without verifying the daemon (tests
	                             * only); otherwise tls_ca_file or the system's
	                             * CA bundle verifies it, and an IP address URL
	                             * needs tls_server_name */
	const char *vllm_pod;       /* the engine pod this session serves: the pool's
	                             * vLLM-wire events also go out under its topic
	                             * while the session lives; NULL: none */
};

/* What Hello said about the pool and the session. */
/* The pool's KV memory, from Hello. backend[0] == '\0': the pool has none. */
struct kvp_client_executor {
	char backend[8];            /* "cpu" or "cuda" */
	uint32_t num_layers, num_heads, head_size, block_size;
	char dtype[8];              /* "fp16", "bf16", "fp32" */
	char layout[8];             /* "nhd", "hnd" */
	uint64_t block_bytes;       /* one block's payload */
	uint64_t memory_bytes;
};

struct kvp_client_info {
	uint64_t session_id;
	uint32_t lease_ms;
	char pool[128];
	uint32_t num_blocks;
	uint32_t hash_block_size;
	uint32_t block_size;        /* group 0's */
	bool prefix_caching;        /* false: the pool hashes, caches and hits nothing */
	uint32_t num_groups;        /* KV cache groups (ids 0 .. num_groups - 1) */
	struct kvp_group_spec groups[KVP_MAX_GROUPS];
	char hash_algorithm[32];
	uint8_t none_hash_fingerprint[8];
	char medium[16];
	uint64_t event_epoch, event_seq;
	uint32_t max_model_len, max_ids_per_call, max_hash_len;
	uint32_t max_msg_bytes;     /* the daemon's message limit; transfers are split below it */
	struct kvp_client_executor executor;
	char server_version[64];    /* kvpoold's version (Hello); "" for a resumed session */
	uint32_t hash_len;          /* bytes per fine hash: 32 (SHA-256) or 16 (xxhash) */
	bool region;                /* the executor's memory is a shared region (kvp_region_open) */
};

struct kvp_client_stats {
	uint32_t num_blocks, num_free, num_cached_blocks, num_cached_keys;
	double usage;
	uint64_t blocks_allocated, blocks_evicted, alloc_failures, blocks_stored, resets;
	uint64_t prefix_requests, prefix_queries, prefix_hits;
	uint32_t sessions;
	uint64_t leases_expired, events_emitted;
	uint32_t active_requests;
};

struct kvp_client;

/*
 * Connects and opens a session. KVP_EINVAL (no URL, a bad URL),
 * KVP_EUNAVAILABLE (no connection within connect_timeout_ms: no daemon
 * listening, or a TLS handshake refused), KVP_EUNAUTH (no token, a wrong
 * token, a session that is gone: the detail says which), KVP_EUNKNOWNPOOL,
 * KVP_EVERSION, KVP_EBUSY (no reply in time, or the daemon's session limit),
 * KVP_EINTERNAL (TLS files), KVP_ENOMEM. On failure there is no client:
 * kvp_client_open_detail() has the text.
 */
int kvp_client_open(const struct kvp_client_options *o, struct kvp_client **out);
/*
 * Why this thread's last kvp_client_open failed (the daemon's detail or the
 * library's), "" if it succeeded. Valid until this thread's next open.
 */
const char *kvp_client_open_detail(void);
/*
 * Says Goodbye (releasing the session's blocks) and closes. NULL: no-op.
 * Returns within the call's timeout plus about a second: nng 1.5 can hang
 * closing a socket (nanomsg/nng#1813); past a second the close goes on in
 * the background and frees the client if nng ever finishes it.
 */
void kvp_client_close(struct kvp_client *c);
/*
 * A new session in place of this client's, in one round trip: Hello on the
 * same connection, naming the old session, which the daemon ends as by
 * Goodbye (its locks, reservations and references released) where it
 * still exists; a restarted daemon never knew it. For a client that no
 * longer trusts its session (a call timed out, and may still run). KVP_OK
 * with the new session's info (kvp_client_info); on failure the old
 * session id is kept, its fate unknown (a later call answers
 * UNAUTHENTICATED if it ended). Not with a client opened by session_id
 * whose token it was not given.
 */
int kvp_client_renew(struct kvp_client *c);
/* Closes without Goodbye: the session and its blocks live until the lease ends. */
void kvp_client_detach(struct kvp_client *c);

const struct kvp_client_info *kvp_client_info(const struct kvp_client *c);
/* The daemon's (or the transport's) text for the last failed call. */
const char *kvp_client_last_detail(const struct kvp_client *c);

/* get_new_blocks: n ids into ids[0..n). KVP_ENOSPACE: the pool is full. */
int kvp_client_allocate(struct kvp_client *c, uint32_t n, int32_t *ids);
int kvp_client_touch(struct kvp_client *c, const int32_t *ids, size_t n);
/* free_blocks in the order given; KVP_ENOTOWNER for references not held. */
int kvp_client_free(struct kvp_client *c, const int32_t *ids, size_t n);

/*
 * cache_full_blocks: either hashes (fine, hash_len bytes each) or tokens
 * (hashed by the daemon). hash_len 0: the pool's (kvp_client_info()->hash_len)
 * for a direct call, 32 in a batch (a batch knows its pool only when sent).
 */
struct kvp_client_cache {
	const int32_t *block_ids;
	size_t num_block_ids;
	uint32_t num_cached_blocks, num_full_blocks;
	uint32_t group_id;
	uint32_t block_size;        /* 0: the pool's */
	const uint8_t *hashes;      /* NULL: hash tokens */
	size_t num_hashes;
	const int64_t *tokens;      /* the request's tokens from position 0, or... */
	size_t num_tokens;
	const uint8_t *parent_hash; /* ...with this (block num_cached-1's hash), from block num_cached */
	const struct kvp_request_keys *keys;
	bool has_lora_id;
	int64_t lora_id;
	/* NULL, or num_full_blocks - num_cached_blocks bytes: 0 skips that block (vLLM's block_mask) */
	const uint8_t *block_mask;
	uint32_t hash_len;          /* bytes per hash and of parent_hash: 32, 16, or 0 (above) */
};
int kvp_client_cache(struct kvp_client *c, const struct kvp_client_cache *a, uint32_t *num_stored);
/*
 * cache_partial_block (vLLM 0.33): makes a->block_ids[0] (num_block_ids 1),
 * which this session holds, reachable from the prefix boundary at num_tokens
 * (a multiple of the pool's hash block size) of the request a describes
 * (hashes or tokens, keys, lora, group, the group's block_size; no range,
 * mask or parent_hash). replace_existing drops the block's keys first.
 * *stored (may be NULL): whether a new entry (and its BlockStored) was made.
 * NOT_OWNER, INVALID_ARGUMENT, WRONG_STATE, NOT_SUPPORTED (caching off, or a
 * pool reproducing 9aaf83ef5), NO_SPACE (as many partial keys as blocks).
 */
int kvp_client_cache_partial(struct kvp_client *c, const struct kvp_client_cache *a,
                             uint32_t num_tokens, bool replace_existing, bool *stored);
/*
 * move_block_hashes (vLLM 0.33): every key of src_block now names dst_block,
 * which has none; the session holds both. No events. WRONG_STATE (dst has a key).
 */
int kvp_client_move_hashes(struct kvp_client *c, int32_t src_block, int32_t dst_block);
/*
 * emit_cached_block_events (vLLM 0.33, kv_cache_report_mode "full"): the
 * pool publishes one BlockStored for the request a describes' prefix-cache
 * hits, its first a->num_full_blocks blocks (hashes or tokens, keys with
 * session_id, lora, group, the group's block_size; no block ids, range
 * start, mask or parent_hash). Nothing else changes. *num_reported (may be
 * NULL): the leading blocks still cached, which the event names; 0 when the
 * daemon publishes no events. INVALID_ARGUMENT, NOT_SUPPORTED (caching off).
 */
int kvp_client_report_cached(struct kvp_client *c, const struct kvp_client_cache *a,
                             uint32_t *num_reported);

/*
 * The longest cached prefix (all groups per position). Writes up to cap ids
 * per group, group after group, the hit length in blocks and tokens, and,
 * when hashing tokens and hashes_out is not NULL, up to hashes_cap hashes.
 * hash_len as kvp_client_cache's.
 */
struct kvp_client_lookup {
	const uint8_t *hashes;      /* NULL: hash tokens */
	size_t num_hashes;
	const int64_t *tokens;
	size_t num_tokens;
	const struct kvp_request_keys *keys;
	const uint32_t *group_ids;  /* NULL: group 0 */
	size_t num_groups;
	uint32_t block_size;        /* 0: the pool's */
	uint32_t hash_len;          /* bytes per hash: 32, 16, or 0 (kvp_client_cache's rule) */
};
int kvp_client_lookup(struct kvp_client *c, const struct kvp_client_lookup *q, int32_t *ids,
                      size_t cap, uint32_t *num_hit_blocks, uint32_t *hit_tokens);
/*
 * As kvp_client_lookup, and ref_cnts (laid out as ids) gets each hit block's
 * ref count as the daemon saw it during the lookup (0: an evictable cached
 * block). Another session may change it at once after. KVP_ENOTSUP from a
 * daemon that does not report them.
 */
int kvp_client_lookup_refs(struct kvp_client *c, const struct kvp_client_lookup *q, int32_t *ids,
                           uint32_t *ref_cnts, size_t cap, uint32_t *num_hit_blocks,
                           uint32_t *hit_tokens);
/*
 * vLLM's coordinator lookup (find_longest_cache_hit) over a waiting
 * request's fine hashes (hash_len bytes each; 0: the pool's): the hit every
 * KV cache group of the pool agrees on, at most max_tokens tokens (vLLM's
 * max_cache_hit_length). Group g's hit goes to ids + g * cap (hit_tokens /
 * its block size entries, KVP_NULL_BLOCK where a sliding window or a Mamba
 * group skips a block) and its ref counts likewise to ref_cnts (NULL: not
 * wanted); blocks_per_group[g] (KVP_MAX_GROUPS entries) gets how many,
 * *uncached vLLM 0.33's num_uncached_common_prefix_tokens. No reference is
 * taken. KVP_EINVAL (bad arguments, or cap below a group's hit: nothing
 * written).
 */
int kvp_client_find_hit(struct kvp_client *c, const uint8_t *hashes, size_t num_hashes,
                        uint32_t hash_len, uint32_t max_tokens, int32_t *ids, uint32_t *ref_cnts,
                        size_t cap, uint32_t *blocks_per_group, uint32_t *hit_tokens,
                        uint32_t *uncached);

int kvp_client_evict(struct kvp_client *c, const int32_t *ids, size_t n, uint32_t *num_evicted);
int kvp_client_reset(struct kvp_client *c);
int kvp_client_stats(struct kvp_client *c, struct kvp_client_stats *out);
/*
 * A read-only view of the pool's free queue, head to tail, a page at a
 * time (tests and debugging, as vLLM's free_block_queue.get_all_free_blocks;
 * never the hot path): up to cap ids (at most the daemon's max-ids) after
 * block `after` (0: from the head) into ids, *n of them, and *more when
 * blocks follow. KVP_ENOTFOUND when `after` is no longer free (the queue
 * moved on: start again from 0); KVP_EINVAL; transport statuses.
 */
int kvp_client_free_queue(struct kvp_client *c, int32_t after, int32_t *ids, size_t cap, size_t *n,
                          bool *more);
/*
 * Each of n blocks' prefix-cache keys (hash || 4-byte group; tests and
 * debugging, as vLLM 0.33's cached_block_hashes_by_block): num_keys[i] keys
 * of block ids[i], its primary first, then its partial entries; the keys
 * back to back in keys (keys_cap bytes), their lengths in key_lens
 * (lens_cap entries), *total of them. KVP_ETOOLARGE (nothing written past
 * the caps) when they do not fit; KVP_ERANGE for an id outside the pool.
 */
int kvp_client_block_keys(struct kvp_client *c, const int32_t *ids, size_t n, uint32_t *num_keys,
                          uint8_t *keys, size_t keys_cap, uint32_t *key_lens, size_t lens_cap,
                          size_t *total);
int kvp_client_heartbeat(struct kvp_client *c);
/*
 * The pool's event stream position now (a Heartbeat): its epoch and the seq
 * its next batch will get. Every event of a call that returned before this
 * one is in a batch below next_seq, so a subscriber that has delivered up
 * to next_seq has seen them all.
 */
int kvp_client_event_position(struct kvp_client *c, uint64_t *epoch, uint64_t *next_seq);

/*
 * The request-level calls (vLLM's KVCacheManager, group 0). A request id is
 * the caller's, scoped to this session. The first AllocateSlots of a request
 * carries its prompt (and keys); later ones carry the tokens generated since.
 */
struct kvp_client_slots {
	uint64_t request_id;
	const int64_t *prompt;          /* first call only */
	size_t num_prompt;
	const struct kvp_request_keys *keys; /* first call only */
	bool has_lora_id;
	int64_t lora_id;
	const int64_t *new_tokens;      /* generated since the last call */
	size_t num_new_token_ids;
	uint32_t num_new_tokens;        /* to compute now; 0: all remaining (capped by token_budget) */
	uint32_t token_budget;
	uint32_t num_lookahead_tokens;
	bool use_prefix_cache;          /* a request holding no blocks takes its prefix hit */
	bool delay_cache_blocks;
	bool full_sequence_must_fit;    /* KVP_ENOSPACE unless the whole request fits (vLLM's gate) */
	uint32_t num_external_computed_tokens; /* a KV connector's tokens after the hit */
	bool no_new_tokens;             /* schedule none (an async load): num_new_tokens ignored */
	uint32_t num_in_flight_tokens;  /* earlier steps' tokens still in flight (async scheduling) */
	uint32_t num_encoder_tokens;    /* a cross-attention group's tokens (encoder-decoder) */
};
struct kvp_client_slots_result {
	uint32_t hit_tokens;
	uint32_t num_scheduled_tokens;
	uint32_t num_computed_tokens;
	size_t num_new_blocks;      /* in new_blocks: each group's, group after group */
	uint32_t num_groups;
	uint32_t new_blocks_per_group[KVP_MAX_GROUPS];
	/* Of each group's new blocks, how many lead them as the external tokens' blocks. */
	uint32_t external_blocks_per_group[KVP_MAX_GROUPS];
};
/* KVP_ENOSPACE: not enough free blocks; nothing was allocated (preempt or wait). */
int kvp_client_allocate_slots(struct kvp_client *c, const struct kvp_client_slots *a,
                              int32_t *new_blocks, size_t cap,
                              struct kvp_client_slots_result *res);
/* Frees a request's blocks (tail first); preempt keeps the request for later. */
int kvp_client_free_request(struct kvp_client *c, uint64_t request_id, bool preempt);
/* The request's current prefix hit (no references taken). */
int kvp_client_get_computed_blocks(struct kvp_client *c, uint64_t request_id, int32_t *ids,
                                   size_t cap, size_t *num_ids, uint32_t *hit_tokens);

/*
 * The data plane: block contents in the pool's executor. A block's payload
 * is its 2 x layers chunks back to back (layer 0 K, layer 0 V, layer 1 K,
 * ...), each one block of one layer in the pool's cache layout; a list of
 * blocks is their payloads back to back (kvp_client_info()->executor gives
 * block_bytes and the layout). Transfers larger than the daemon's message
 * limit are split into several calls transparently; a split transfer that
 * fails part-way has moved the parts before the failing one, and the detail
 * says which blocks failed. A pool without an executor answers
 * KVP_ENOTSUP.
 */

/*
 * Reads blocks ids[0..n) (held by this session or its requests: Touch a
 * looked-up block first; KVP_ENOTOWNER otherwise) into buf, which
 * must be exactly n x block_bytes. Every block's CRC32C is checked on
 * arrival (a mismatch is KVP_EINTERNAL); crcs, if not NULL, receives them.
 */
int kvp_client_read_blocks(struct kvp_client *c, const int32_t *ids, size_t n, void *buf,
                           size_t len, uint32_t *crcs);

/*
 * Writes buf (n x block_bytes) into blocks ids[0..n), which this session
 * must hold (directly or through one of its requests) and which must not
 * be cached. Each block travels with its
 * CRC32C, which the daemon checks before writing anything of that call.
 */
int kvp_client_write_blocks(struct kvp_client *c, const int32_t *ids, size_t n, const void *buf,
                            size_t len);

/*
 * The shared region (same host): a cpu pool's memory is a file this client
 * maps, so KV rows are written and read in place, never through the
 * socket. Rows are found by key: a block hash (info.hash_len bytes) then
 * its group as 4 big-endian bytes (vLLM's offload key), kvp_client_key_len()
 * bytes each, keys back to back. A writer reserves rows, writes them and
 * commits (or aborts); a reader looks keys up and locks their rows, reads
 * them and unlocks. Reserved rows and locks are this session's: closing the
 * client (or losing its lease) releases them, and an uncommitted row never
 * becomes visible. Every holder of the mapping can write every row: check
 * a row against the CRC32C recorded at commit (kvp_region_check) before
 * trusting it. Calls take at most info.max_ids_per_call keys.
 */
struct kvp_region;
struct kvp_region_info {
	char path[4096];        /* the file mapped */
	uint64_t bytes;         /* its size */
	uint64_t row_bytes;     /* one block's payload (executor.block_bytes) */
	uint64_t row_stride;    /* row i at i x row_stride from the base */
	uint32_t num_rows;      /* row 0, the null block's, is never handed out */
	uint32_t shards;        /* slices per row, one per tensor-parallel worker */
	uint64_t shard_bytes;   /* shard s at s x shard_bytes into a row */
};

/* Bytes per key: info.hash_len + 4 (0 for NULL). */
size_t kvp_client_key_len(const struct kvp_client *c);
/*
 * Asks the daemon for the pool's region and maps it (read and write,
 * shared). KVP_OK; KVP_ENOTSUP (the pool has no region); KVP_ENOTFOUND (the
 * file is not on this host, or not readable by this user: the detail says
 * which); KVP_ENOTOWNER (the file named is not one kvpoold made: not a
 * plain file of one link named kvpool-<pool>-<pid>-<16 hex digits>, or over
 * ipc:// not owned by the daemon's user as the kernel reports it; nothing
 * is mapped, so a daemon or an impostor cannot make this process write
 * another file); KVP_EINVAL; KVP_ENOMEM. *out only on success; the mapping
 * is independent of the client and outlives it.
 */
int kvp_region_open(struct kvp_client *c, struct kvp_region **out);
/* Unmaps and closes the file. NULL: no-op. */
void kvp_region_close(struct kvp_region *r);
/*
 * The region's file, open read-write, as checked by kvp_region_open (-1 for
 * NULL): a binding maps it again through it, not by path, and a process
 * may hand it to another (it keeps the file alive after kvpoold unlinks
 * it). Owned by r: closed by kvp_region_close.
 */
int kvp_region_fd(const struct kvp_region *r);
const struct kvp_region_info *kvp_region_info(const struct kvp_region *r);
/* Row id's address in this mapping; NULL for an id outside 1 .. num_rows - 1. */
void *kvp_region_row(const struct kvp_region *r, int32_t row);
/* Whether row's payload has checksum crc (a CRC32C of row_bytes bytes). */
bool kvp_region_check(const struct kvp_region *r, int32_t row, uint32_t crc);
/* Row's CRC32C (of row_bytes bytes) into *crc: KVP_OK, or KVP_EINVAL for a bad row. */
int kvp_region_crc(const struct kvp_region *r, int32_t row, uint32_t *crc);
/*
 * Copies n pieces, src[i] to dst[i], len[i] bytes each (a job's pages to or
 * from their rows), split over up to threads threads (0 or 1: this one) by
 * bytes. For bindings that would otherwise loop in their own language. The
 * pieces must not overlap (a thread that cannot be started leaves its part
 * to this one). KVP_OK, or KVP_EINVAL for NULL arrays with n > 0.
 */
int kvp_copy_many(void *const *dst, const void *const *src, const uint64_t *len, size_t n,
                  unsigned threads);

/*
 * Reserves a row for each key: rows[i] is the row to write, or -1 if the key
 * is already stored (cached, being stored by someone, or earlier in this
 * call). Free cached rows are evicted by the pool's LRU to make room; evicted
 * (may be NULL; room for n keys) gets their keys and *num_evicted their
 * count. All or nothing: KVP_ENOSPACE when too few rows can be had.
 */
int kvp_client_reserve(struct kvp_client *c, const uint8_t *keys, size_t n, int32_t *rows,
                       uint8_t *evicted, size_t *num_evicted);
/*
 * Makes reserved keys visible (cached, BlockStored) with the CRC32C of each
 * row: crcs[i] if crcs is not NULL; else, with checksum, the daemon reads
 * the row (before it takes the pool's lock, so other calls do not wait on
 * it; about a third of a store's time for 2 MiB rows, BENCHMARKS.md); else
 * none is recorded (readers see 0). Each key
 * must be reserved by this session: KVP_ENOTFOUND, KVP_ENOTOWNER otherwise.
 */
int kvp_client_commit(struct kvp_client *c, const uint8_t *keys, size_t n, const uint32_t *crcs,
                      bool checksum);
/* Gives reserved rows back unseen (no event). As commit. */
int kvp_client_abort(struct kvp_client *c, const uint8_t *keys, size_t n);
/*
 * Looks keys up and locks each hit's row against eviction and reuse until
 * kvp_client_unlock or the session's end. rows[i] (n entries) is the row or
 * -1 (a miss, not locked), or -2 (pending: the pool's cluster tier is
 * filling it; ask again, docs/cluster.md); crcs (may be NULL) the CRC32C
 * recorded at commit (0: none recorded).
 * With prefix, the lookup stops at the first miss: *num_looked (may be NULL)
 * is how many keys were looked up, *num_hits (may be NULL) how many hit.
 * Keys must be distinct (KVP_EINVAL).
 */
int kvp_client_lookup_lock(struct kvp_client *c, const uint8_t *keys, size_t n, bool prefix,
                           int32_t *rows, uint32_t *crcs, size_t *num_looked, uint32_t *num_hits);
/*
 * As kvp_client_lookup_lock (no prefix), for the cluster tier's agent
 * reading rows to put: the lookup counts as no hit, and hits[i] (n entries)
 * is how many counted lookups hit key i's row since its commit (0 for a
 * miss), for a write-behind policy of blocks hit more than once. A miss is
 * a plain -1: the look asks no disk or cluster tier to fill the key.
 */
int kvp_client_lookup_lock_uncounted(struct kvp_client *c, const uint8_t *keys, size_t n,
                                     int32_t *rows, uint32_t *crcs, uint32_t *hits);
/* Releases this session's lock on each key's row. KVP_ENOTOWNER if one is not locked by it. */
int kvp_client_unlock(struct kvp_client *c, const uint8_t *keys, size_t n);
/*
 * The cluster tier's agent (docs/cluster.md): reports n_absent keys the
 * cluster lacks (lookups then miss them for the pool's cluster_miss_ms)
 * and takes up to max_wants of the keys lookups have missed since, into
 * wanted (max_wants keys' room), *n_wanted of them; *waiting (may be NULL)
 * gets how many stay queued. Fill a wanted key with reserve, a write into
 * its row, and commit. KVP_ENOTSUP on a pool without a cluster tier.
 */
int kvp_client_cluster_fill(struct kvp_client *c, const uint8_t *absent, size_t n_absent,
                            uint8_t *wanted, size_t max_wants, size_t *n_wanted,
                            uint32_t *waiting);
/*
 * The cluster tier's agent: tells the pool that the cluster store now holds
 * the n_stored keys of stored and no longer holds the n_removed of removed;
 * the pool publishes them as BlockStored / BlockRemoved of medium CLUSTER
 * (docs/cluster.md, "Events"). Takes no wanted keys and keeps no fill
 * alive. KVP_ENOTSUP on a pool without a cluster tier.
 */
int kvp_client_cluster_announce(struct kvp_client *c, const uint8_t *stored, size_t n_stored,
                                const uint8_t *removed, size_t n_removed);

/* Copies block src[i] to dst[i] (copy-on-write); dst held by this session, not cached. */
int kvp_client_copy_blocks(struct kvp_client *c, const int32_t *src, const int32_t *dst,
                           size_t n);

/*
 * vLLM's reshape_and_cache_flash: K and V of n tokens placed by slot
 * (-1: skipped). With all_layers, k and v are [layers][n][heads][head_size],
 * otherwise [n][heads][head_size] for `layer`; kv_len is each one's bytes.
 * Every slot's block must be held by this session or one of its requests.
 */
int kvp_client_write_tokens(struct kvp_client *c, bool all_layers, uint32_t layer,
                            const int64_t *slots, size_t n, const void *k, const void *v,
                            size_t kv_len);

/*
 * A batch: several calls sent as one Batch, executed in order under the
 * pool's lock (a scheduler step in one round trip). By default execution
 * stops at the first call that fails; with KVP_BATCH_CONTINUE every call
 * runs and each has its own status (a request that does not fit is refused,
 * changing nothing, and the step goes on). The builder copies every
 * argument, so the caller's buffers may be reused at once; with
 * KVP_BATCH_BORROW it references the caller's arrays and strings instead
 * (token ids, block ids, hashes, keys), which must then stay unchanged until
 * the batch is sent. After kvp_client_batch(), each executed call's status
 * and results stay readable until the batch changes, is sent again, cleared
 * or destroyed. A batch reused step after step allocates nothing once it has
 * grown to its largest step.
 */
struct kvp_batch;
int kvp_batch_create(struct kvp_batch **out);
void kvp_batch_destroy(struct kvp_batch *b);
/* Drops every call and result, keeping the batch (and its flags) for reuse. */
void kvp_batch_clear(struct kvp_batch *b);
size_t kvp_batch_count(const struct kvp_batch *b);

#define KVP_BATCH_CONTINUE 0x1u /* run every call even after one fails */
#define KVP_BATCH_BORROW 0x2u   /* reference the caller's arrays instead of copying */
/*
 * Send kvp_batch_allocate_slots_n's calls as plain calls, not as one slots
 * run (packed arrays; the default where the daemon runs them, which its
 * Hello says: else the client sends plain calls by itself). Same results.
 */
#define KVP_BATCH_PLAIN 0x4u
/* Sets the flags for the calls added from now on and the next sends. KVP_EINVAL: unknown flag. */
int kvp_batch_set_flags(struct kvp_batch *b, unsigned flags);

/* Each adder returns KVP_OK, KVP_EINVAL (bad arguments) or KVP_ENOMEM (nothing added). */
int kvp_batch_allocate(struct kvp_batch *b, uint32_t n);
int kvp_batch_touch(struct kvp_batch *b, const int32_t *ids, size_t n);
int kvp_batch_free(struct kvp_batch *b, const int32_t *ids, size_t n);
int kvp_batch_evict(struct kvp_batch *b, const int32_t *ids, size_t n);
int kvp_batch_cache(struct kvp_batch *b, const struct kvp_client_cache *a);
int kvp_batch_lookup(struct kvp_batch *b, const struct kvp_client_lookup *q);
int kvp_batch_allocate_slots(struct kvp_batch *b, const struct kvp_client_slots *a);
/*
 * n AllocateSlots calls at once for requests the daemon already has (a
 * decode step), the same as n kvp_batch_allocate_slots calls: call i appends
 * num_token_ids[i] token ids (the next ones of token_ids; num_token_ids NULL:
 * none) and schedules num_new_tokens[i]; the lookahead and delay apply to
 * every call. On failure none of them is added. They go on the wire as one
 * slots run, a message of packed arrays (kvpool.proto), but count, run,
 * stop and report as n calls.
 */
int kvp_batch_allocate_slots_n(struct kvp_batch *b, size_t n, const uint64_t *request_ids,
                               const uint32_t *num_new_tokens, const uint32_t *num_token_ids,
                               const int64_t *token_ids, uint32_t num_lookahead_tokens,
                               bool delay_cache_blocks);
int kvp_batch_free_request(struct kvp_batch *b, uint64_t request_id, bool preempt);
int kvp_batch_get_computed_blocks(struct kvp_batch *b, uint64_t request_id);
int kvp_batch_stats(struct kvp_batch *b);
/*
 * The shared region's calls by key (as kvp_client_reserve and the rest):
 * n keys of key_len bytes each (kvp_client_key_len). A Commit in a batch
 * carries its checksums (crc32c, one per key) or records none (NULL): the
 * daemon's own are taken outside the pool's lock, for a Commit sent alone.
 * Results: reserve, block_ids the rows (-1: no row needed) and hashes the
 * evicted keys (num_hashes keys of hash_len + 4 bytes); lookup_lock,
 * block_ids the rows, ref_cnts their CRC32C, count the hits; commit, count
 * the keys committed. A scheduler's step sends its releases, stores and
 * lookups in one round trip this way.
 */
int kvp_batch_reserve(struct kvp_batch *b, const uint8_t *keys, size_t n, size_t key_len);
int kvp_batch_commit(struct kvp_batch *b, const uint8_t *keys, size_t n, size_t key_len,
                     const uint32_t *crc32c);
int kvp_batch_abort(struct kvp_batch *b, const uint8_t *keys, size_t n, size_t key_len);
int kvp_batch_lookup_lock(struct kvp_batch *b, const uint8_t *keys, size_t n, size_t key_len,
                          bool prefix);
int kvp_batch_unlock(struct kvp_batch *b, const uint8_t *keys, size_t n, size_t key_len);
/*
 * Sends the batch. Returns KVP_OK if every call succeeded, else the status
 * of the first call that failed (transport errors as for any call; the
 * detail names the call and gives its reason); *num_run gets how many calls
 * ran (the failing one included; every call with KVP_BATCH_CONTINUE).
 */
int kvp_client_batch(struct kvp_client *c, struct kvp_batch *b, size_t *num_run);
/* Call i's status after a send (KVP_ENOTFOUND if it did not run). */
int kvp_batch_status(const struct kvp_batch *b, size_t i);
/*
 * Call i's block ids: an allocate's new blocks, a lookup's or a
 * get_computed_blocks' hits (group after group), an allocate_slots' new
 * blocks. KVP_ENOTFOUND if it did not run, failed, or has none.
 */
int kvp_batch_block_ids(const struct kvp_batch *b, size_t i, const int32_t **ids, size_t *n);

/* Everything call i returned. Pointers are valid until the batch changes. */
struct kvp_batch_result {
	int status;                 /* KVP_ENOTFOUND: the call did not run */
	const char *detail;         /* the daemon's reason when it failed, else "" */
	bool has_block_ids;         /* allocate, lookup, allocate_slots, get_computed_blocks */
	const int32_t *block_ids;   /* as kvp_batch_block_ids */
	size_t num_block_ids;
	uint32_t count;             /* cache: blocks stored; evict: evicted; lookup: hit blocks */
	/* allocate_slots: all of it; lookup and get_computed_blocks: hit_tokens */
	struct kvp_client_slots_result slots;
	const uint8_t *hashes;      /* lookup of tokens: the fine hashes computed */
	size_t num_hashes;
	bool has_stats;
	struct kvp_client_stats stats; /* stats */
	const uint32_t *ref_cnts;   /* lookup: each hit's ref count, as block_ids; NULL if none */
};
/* KVP_OK (out filled), KVP_ENOTFOUND (call i did not run: out->status says so), KVP_EINVAL. */
int kvp_batch_result(const struct kvp_batch *b, size_t i, struct kvp_batch_result *out);
/*
 * The results of AllocateSlots calls first..first+n-1 after a send, in flat
 * arrays (one C call instead of n kvp_batch_result calls): status[i] (a call
 * that did not run: KVP_ENOTFOUND), num_computed_tokens[i], new_blocks[i *
 * num_groups + g] the number of call i's new blocks in group g, and their
 * ids in block_ids, call after call and group after group (*num_ids in
 * all). A failed call has zeros. KVP_EINVAL: a call in the range that
 * succeeded is not an AllocateSlots, has more groups than num_groups, or
 * the ids do not fit in cap (nothing written).
 */
int kvp_batch_slots_results(const struct kvp_batch *b, size_t first, size_t n, size_t num_groups,
                            int32_t *status, uint32_t *num_computed_tokens, uint32_t *new_blocks,
                            int32_t *block_ids, size_t cap, size_t *num_ids);
/* The last send's request and reply sizes on the wire, in bytes (0 before a send). */
int kvp_batch_wire_bytes(const struct kvp_batch *b, size_t *request, size_t *reply);

/* ---- the event stream's repair (see subscriber.h for the subscriber) ---- */

struct kvp_snapshot_entry {
	const uint8_t *hash;        /* full width, group id stripped */
	size_t hash_len;
	uint32_t group_idx;
	uint32_t num_blocks;        /* blocks caching this (hash, group) */
};
struct kvp_snapshot {
	uint64_t epoch, next_seq;   /* apply batches from next_seq on */
	struct kvp_snapshot_entry *entries;
	size_t num_entries;
	void *storage;
};
/*
 * Every cached (hash, group) now, exact at next_seq. Free with
 * kvp_snapshot_free. Taken in pages (the daemon holds the pool's lock for
 * one page at a time) joined by a Replay of the batches published while
 * paging; a reset or restart meanwhile starts over, and KVP_EBUSY says it
 * happened on every try. Entries are in map-key order.
 */
int kvp_client_snapshot(struct kvp_client *c, struct kvp_snapshot **out);
/* The same with at most max_entries entries a page (0: the daemon's page). */
int kvp_client_snapshot_paged(struct kvp_client *c, uint32_t max_entries,
                              struct kvp_snapshot **out);
void kvp_snapshot_free(struct kvp_snapshot *s);

/*
 * The pool's encoded EventBatch messages from from_seq on (epoch must be
 * current): calls each(ctx, bytes, len) per batch in order. *available is
 * false when they are gone (or the epoch changed): take a snapshot.
 * *next_seq gets the seq the pool will publish next.
 */
int kvp_client_replay(struct kvp_client *c, uint64_t epoch, uint64_t from_seq, bool *available,
                      uint64_t *next_seq,
                      void (*each)(void *ctx, const uint8_t *batch, size_t len), void *ctx);

/*
 * Sends one pre-encoded kvpool.v1.Request and returns the raw reply bytes
 * (malloc'd): for tools and tests that speak the wire directly. A client
 * opened with a token appends it to the bytes (Request.token, whose last
 * occurrence wins), as every call of a pool with a token must carry it.
 */
int kvp_client_raw(struct kvp_client *c, const uint8_t *req, size_t len, uint8_t **reply,
                   size_t *reply_len);

#endif /* KVPOOL_CLIENT_H */
