/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pool.h: vLLM V1's BlockPool in C (reference section 4; checklist 11).
 *
 * A pool owns num_blocks KV blocks. Block 0 is the null block: never in the
 * free queue, never handed out, never cached. The free queue starts in id
 * order (1..N-1); allocation pops from its head, evicting lazily: a popped
 * block that still has a hash loses it and a BlockRemoved event is queued.
 * Freed blocks keep their hashes (evictable cached blocks that prefix
 * lookups can still hit and touch can revive). The prefix-cache map is keyed
 * by hash || 4-byte big-endian group id with no de-duplication.
 *
 * Two rules follow the vLLM a pool reproduces (kvp_pool_config.semantics):
 *  - vLLM 0.33 (the default): freed blocks that reach ref count 0 with no
 *    hash (every block, with caching off) go to the queue's head in the
 *    order given, to be reused first; hashed ones are appended to the tail
 *    in the order given. A coarse block (block_size = k·hash_block_size) is
 *    keyed by its last fine hash, which chains over the whole prefix.
 *  - vLLM at 9aaf83ef5: every freed block is appended to the tail in the
 *    order given, and a coarse block is keyed by its k fine hashes
 *    concatenated.
 *
 * Deliberate differences from vLLM (a remote service cannot trust its
 * caller, so misuse is rejected with a status and nothing changes; vLLM
 * asserts, raises, or silently corrupts its state):
 *  - free_blocks of a block whose ref count is 0: KVP_ESTATE (vLLM: -1).
 *  - free_blocks naming one non-null block twice: KVP_EINVAL (vLLM appends
 *    it twice and corrupts the queue).
 *  - The null block's ref count is pinned at 0: touch and free accept id 0
 *    and leave it alone (vLLM drifts it, even below zero).
 *  - Any id >= num_blocks: KVP_ERANGE for the whole call, before any change
 *    (vLLM's evict_blocks asserts midway, after earlier ids took effect).
 *  - get_new_blocks(n > free): KVP_ENOSPACE (vLLM: ValueError, also atomic).
 *  - cache_full_blocks of a block that already has a hash, or that named
 *    twice: KVP_ESTATE / KVP_EINVAL (vLLM asserts); of a block with ref
 *    count 0: KVP_ESTATE (vLLM would cache a free block's stale contents).
 *  - Preconditions vLLM asserts (hash list too short, mask length, block
 *    size not a multiple of hash_block_size) are KVP_EINVAL.
 *  - cache_full_blocks on a pool created with caching off: KVP_ENOTSUP
 *    (vLLM would insert hashes that allocation then never evicts).
 *  - reset_prefix_cache while blocks are in use: KVP_ESTATE (vLLM: False).
 *  - touch would overflow a ref count: KVP_ESTATE.
 * Every operation validates its whole argument list first, reserves any
 * memory it needs (events), and only then mutates: on any error the pool,
 * its event queue and its metrics are unchanged.
 *
 * Not thread-safe: one thread at a time per pool (two pools in one process
 * are independent). Pure: no I/O, clocks (metrics take a clock callback),
 * threads or printing. Never allocates on the allocate/free/touch/lookup
 * paths; event queuing allocates only when its buffer must grow.
 */
#ifndef KVP_POOL_H
#define KVP_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/block_hash.h"
#include "common/events.h"
#include "engine/metrics.h"

#define KVP_NULL_BLOCK 0

/* The vLLM whose BlockPool rules a pool reproduces (see the top comment). */
enum kvp_vllm_semantics {
	KVP_VLLM_0_33 = 0,       /* vLLM 0.33 (2026-11): the default */
	KVP_VLLM_9AAF83EF5 = 1,  /* vLLM at commit 9aaf83ef5 (2025) */
};

/* "0.33" or "9aaf83ef5", or NULL for a value that is not one of ours. */
const char *kvp_vllm_semantics_name(enum kvp_vllm_semantics s);
/* Parses those names; KVP_EINVAL for anything else; *out only on success. */
int kvp_vllm_semantics_parse(const char *name, enum kvp_vllm_semantics *out);

struct kvp_pool_config {
	uint32_t num_blocks;       /* N >= 1, the null block included */
	uint32_t hash_block_size;  /* tokens per fine hash, >= 1 */
	uint32_t hash_len;         /* bytes per fine hash (one digest): 32 or 16; 0: 32 */
	uint32_t max_hash_len;     /* longest block hash cached, hash_len·k, k <= 32; 0: hash_len.
	                            * Only 9aaf83ef5's concatenated keys are longer than hash_len. */
	enum kvp_vllm_semantics semantics; /* 0: vLLM 0.33 */
	bool enable_caching;
	bool enable_events;
	const char *medium;        /* events' medium; NULL: "GPU" (vLLM's) */
	struct kvp_metrics *metrics; /* optional, not owned; sized >= num_blocks */
	/*
	 * Optional: called with every n blocks get_new_blocks hands out (and so
	 * reserve and the manager's allocations), after they left the queue and
	 * before the call returns: the service clears their bytes there for a
	 * pool that must not show one tenant's KV to the next. Must not call
	 * back into the pool.
	 */
	void (*on_alloc)(void *ctx, const int32_t *ids, uint32_t n);
	void *on_alloc_ctx;
};

struct kvp_pool_stats {
	uint64_t blocks_allocated;  /* blocks handed out by get_new_blocks */
	uint64_t blocks_evicted;    /* hashes dropped (each is a BlockRemoved) */
	uint64_t alloc_failures;    /* get_new_blocks calls refused with KVP_ENOSPACE */
	uint64_t blocks_stored;     /* blocks cached by cache_full_blocks */
	uint64_t resets;            /* successful reset_prefix_cache calls */
};

struct kvp_pool;

/*
 * Creates a pool. KVP_EINVAL for a bad config (num_blocks 0 or above
 * 2^31-3, hash_block_size 0, hash_len not 32 or 16, max_hash_len not a
 * multiple of hash_len or over 32·hash_len, an unknown semantics, metrics
 * sized for fewer blocks), KVP_ENOMEM. *out only on success.
 */
int kvp_pool_create(const struct kvp_pool_config *cfg, struct kvp_pool **out);
/* Destroys a pool (events still queued are dropped). NULL is a no-op. */
void kvp_pool_destroy(struct kvp_pool *p);

/*
 * get_new_blocks: pops n blocks from the free-queue head into ids[0..n),
 * evicting their hashes (one BlockRemoved each, in pop order), and sets their
 * ref counts to 1. KVP_ENOSPACE if n > kvp_pool_num_free(); KVP_EINVAL if ids
 * is NULL with n > 0; KVP_ENOMEM if the event queue cannot grow.
 */
int kvp_pool_get_new_blocks(struct kvp_pool *p, uint32_t n, int32_t *ids);

/*
 * get_cached_block: for each group in groups[0..ngroups), the first block
 * cached under hash || group. All or nothing: KVP_ENOTFOUND (ids untouched)
 * if any group misses. Pure lookup: no ref count or queue change.
 * KVP_EINVAL for a bad length (0, or over max_hash_len) or NULL pointers.
 */
int kvp_pool_get_cached_block(const struct kvp_pool *p, const uint8_t *hash, size_t hash_len,
                              const uint32_t *groups, size_t ngroups, int32_t *ids);

/*
 * touch: for each id in order, a free block (ref 0) leaves the queue, and
 * its ref count rises by one (duplicates count twice). KVP_ERANGE,
 * KVP_ESTATE (ref count would overflow), KVP_EINVAL (ids NULL, n > 0).
 */
int kvp_pool_touch(struct kvp_pool *p, const int32_t *ids, size_t n);

/*
 * free_blocks: decrements each block's ref count and queues those that
 * reach 0 in the order given (the first is reused first; managers pass a
 * request's blocks in reverse): vLLM 0.33 puts the unhashed ones at the head
 * and appends the hashed ones, 9aaf83ef5 appends all. Hashes are kept.
 * KVP_ERANGE, KVP_ESTATE (a ref count is already 0), KVP_EINVAL (a non-null
 * id repeated, or ids NULL with n > 0).
 */
int kvp_pool_free_blocks(struct kvp_pool *p, const int32_t *ids, size_t n);

/* cache_full_blocks arguments (vLLM's request, range, group and mask). */
struct kvp_cache_args {
	const uint8_t *block_hashes;   /* the request's fine hashes, hash_len bytes each */
	size_t num_block_hashes;
	const int64_t *token_ids;      /* request.all_token_ids (event only) */
	size_t num_tokens;
	size_t first_token;            /* position of token_ids[0] (0: the whole request) */
	const struct kvp_request_keys *keys; /* extra-key sources (event only); NULL: none */
	bool has_lora_id;              /* lora_request.adapter_id (event only) */
	int64_t lora_id;
	uint32_t num_cached_blocks;
	uint32_t num_full_blocks;
	uint32_t block_size;           /* the group's; a multiple of hash_block_size */
	uint32_t group_id;
	const bool *block_mask;        /* NULL, or num_full - num_cached entries */
};

/*
 * The key hash of coarse block i of a request whose fine hashes (the pool's
 * hash_len each) start at fine, for a group of block_size = k·hash_block_size:
 * fine hash (i+1)·k-1 under vLLM 0.33, fine hashes [i·k, (i+1)·k)
 * concatenated under 9aaf83ef5. Points into fine; *len gets its length. The
 * one place the rule lives: the manager, the service and the clients' lookups
 * all call it. p, fine, len valid; k >= 1.
 */
const uint8_t *kvp_pool_coarse_hash(const struct kvp_pool *p, const uint8_t *fine, uint32_t k,
                                    size_t i, size_t *len);
/* The pool's semantics. */
enum kvp_vllm_semantics kvp_pool_semantics(const struct kvp_pool *p);

/*
 * cache_full_blocks: caches blocks[num_cached..num_full) under the request's
 * hashes (kvp_pool_coarse_hash of the fine hashes, k = block_size /
 * hash_block_size), skipping the null block and masked-out
 * blocks, and queues exactly one BlockStored (parent = the logical previous
 * hash, token ids of the whole range, one extra-keys item per stored block).
 * num_cached >= num_full: KVP_OK, no change, no event.
 * KVP_EINVAL (range, hash list too short, block size, hash too long for the
 * pool, a block named twice, token_ids NULL with num_tokens > 0, bad keys),
 * KVP_ERANGE, KVP_ESTATE (a block already has a hash, has ref count 0, or
 * is reserved for a key),
 * KVP_ENOTSUP (caching is off), KVP_ENOMEM.
 */
int kvp_pool_cache_full_blocks(struct kvp_pool *p, const int32_t *blocks, size_t num_blocks,
                               const struct kvp_cache_args *a);

/*
 * ---- Partial entries (vLLM 0.33's cache_partial_block) ----
 * A block may be reachable from more than one key: its primary (the first
 * it got; vLLM's block_hash, with the tokens it covers, block_hash_num_tokens)
 * and extras, each a prefix boundary inside the block. Lookups find a block
 * by any of its keys, in the order the keys' entries were added; eviction,
 * promotion and replacement drop all of a block's keys, one BlockRemoved
 * each (the primary first, then the extras in the order added: vLLM
 * iterates a set there, in no order a caller may rely on). At most
 * num_blocks extras exist at once (KVP_ENOSPACE past that; vLLM has no
 * bound); their room (about 60 bytes per block) is made on the first.
 * cache_full_blocks promotes a block whose primary is a partial entry
 * covering fewer tokens than the block's position ((i+1)·block_size): its
 * keys go (BlockRemoved each, before the BlockStored), the full key comes
 * in. (vLLM 0.33 re-keys any hashed block covering fewer tokens; kvpool
 * refuses a full block's re-keying with KVP_ESTATE, as before: a block's
 * full key never changes under its other holders.) Not in 9aaf83ef5 pools
 * (KVP_ENOTSUP).
 */

/*
 * cache_partial_block: makes block id reachable from the prefix boundary at
 * num_tokens (a positive multiple of hash_block_size, at most the hashes
 * given): the key a->block_hashes[num_tokens/hash_block_size - 1] ||
 * a->group_id. a gives the request's fine hashes, tokens, keys and lora;
 * its block_size (the group's) must be a multiple of hash_block_size; its
 * range and mask are not read. replace drops the block's keys first (its
 * contents changed). Otherwise, a block whose primary covers fewer tokens
 * loses its keys first; a block already under the key is left alone; a
 * block with no primary takes the key as its primary; else the key is an
 * extra. A new entry queues one BlockStored (the key's hash, parent the
 * previous fine hash, the tokens of its last hash block, block_size
 * hash_block_size). *stored (may be NULL): whether an entry was added.
 * The null block: KVP_OK, nothing. KVP_ERANGE, KVP_EINVAL, KVP_ESTATE (ref
 * count 0, reserved), KVP_ENOTSUP (caching off, or a 9aaf83ef5 pool),
 * KVP_ENOSPACE (num_blocks extras exist), KVP_ENOMEM. Nothing changes on error.
 */
int kvp_pool_cache_partial_block(struct kvp_pool *p, int32_t id, uint32_t num_tokens, bool replace,
                                 const struct kvp_cache_args *a, bool *stored);
/*
 * move_block_hashes: every key of src now names dst instead, each at its
 * key's tail (vLLM's pop + insert), with no event; dst takes src's
 * block_hash_num_tokens. src with no key: KVP_OK, nothing. KVP_ERANGE,
 * KVP_EINVAL (dst is the null block or src), KVP_ESTATE (dst has a key, a
 * ref count 0, or is reserved).
 */
int kvp_pool_move_block_hashes(struct kvp_pool *p, int32_t src, int32_t dst);
/* Tokens block id's primary key covers (vLLM's block_hash_num_tokens), 0 if unhashed or unknown. */
uint32_t kvp_pool_block_hash_tokens(const struct kvp_pool *p, int32_t id);
/* Block id's key i (0: its primary; then its extras in the order added), or NULL past the last. */
const uint8_t *kvp_pool_block_key_at(const struct kvp_pool *p, int32_t id, size_t i, size_t *len);
/* Extra keys in the map (vLLM's cached_block_hashes_by_block entries). */
uint32_t kvp_pool_num_partial_keys(const struct kvp_pool *p);

/*
 * report_cached (vLLM 0.33's emit_cached_block_events): one BlockStored
 * for a request's prefix-cache hits, blocks [0, a->num_full_blocks) of
 * a->block_hashes in group a->group_id (parent None, tokens
 * [0, n·block_size), one extra-keys item per block, the request's LoRA and
 * session id), changing nothing else. Every hash given is reported, as
 * vLLM does, cached or not (a sliding window's hit holds blocks that left
 * the cache; over a network another session may evict a hit before this
 * call): *reported gets how many, 0 with no event when the pool records
 * no events. a->num_cached_blocks must be 0;
 * a's blocks, mask and first_token are not read. KVP_EINVAL (as
 * cache_full_blocks), KVP_ENOTSUP (caching off), KVP_ENOMEM.
 */
int kvp_pool_report_cached(struct kvp_pool *p, const struct kvp_cache_args *a, uint32_t *reported);

/*
 * evict_blocks: drops the hash of each listed block, in the order given
 * (duplicates once: vLLM evicts in its set's iteration order, which its
 * caller passes on), queuing a BlockRemoved for each key it had. Ref counts and the queue are unchanged; the null
 * block and uncached ids are no-ops. KVP_ERANGE (nothing evicted),
 * KVP_EINVAL, KVP_ENOMEM.
 */
int kvp_pool_evict_blocks(struct kvp_pool *p, const int32_t *ids, size_t n);

/*
 * reset_prefix_cache: with every non-null block free, empties the map,
 * clears every block's hash, resets metrics and queues one AllBlocksCleared
 * (no BlockRemoved); the queue order is kept. KVP_ESTATE if any non-null
 * block is in use (nothing changes), KVP_ENOMEM.
 */
int kvp_pool_reset_prefix_cache(struct kvp_pool *p);

/*
 * ---- Keyed stores: two-phase, content-addressed (the data plane) ----
 *
 * A key is a map key, hash || 4-byte big-endian group (vLLM's offload
 * keys), key_len bytes (hash at most max_hash_len). A reserved block is an
 * allocated block (ref count 1, the reserver's) whose key is pending:
 * invisible to get_cached_block, snapshots and events until commit makes
 * it cached. When a reserved block's last reference goes any other way
 * (free_blocks, a lost session's release), its key goes with it: nothing
 * half-written ever becomes visible.
 */

/*
 * reserve: for each key, ids[i] = a block popped from the free queue's head
 * (evicting its old hash as get_new_blocks does), or -1 when the key is
 * cached, pending, or named earlier in the call ("already stored"). All or
 * nothing: KVP_ENOSPACE (every ids[i] = -1) if fewer blocks are free than
 * keys need one. evicted (may be NULL; room for n keys) gets the keys of
 * key_len bytes that the popped blocks lost, *num_evicted their count.
 * KVP_EINVAL (NULL pointers, key_len, n over num_blocks), KVP_ENOTSUP
 * (caching off), KVP_ENOMEM. Allocates a set of 2n entries per call.
 */
int kvp_pool_reserve(struct kvp_pool *p, const uint8_t *keys, size_t key_len, size_t n,
                     int32_t *ids, uint8_t *evicted, size_t *num_evicted);
/*
 * commit: each reserved block's key becomes cached (one BlockStored per run
 * of one group, in order, with no tokens or parent, block_size
 * block_sizes[group] or 0 past num_groups, as vLLM's offloading
 * placeholders), then the reserver's reference is released (free_blocks).
 * KVP_ERANGE, KVP_EINVAL (an id twice), KVP_ESTATE (an id not reserved),
 * KVP_ENOMEM. Nothing changes on error.
 */
int kvp_pool_commit(struct kvp_pool *p, const int32_t *ids, size_t n, const uint32_t *block_sizes,
                    size_t num_groups);
/* abort: forgets each reserved block's key (no event) and releases its reference. As commit. */
int kvp_pool_abort(struct kvp_pool *p, const int32_t *ids, size_t n);
/* The block reserved for key, or -1. */
int32_t kvp_pool_pending_block(const struct kvp_pool *p, const uint8_t *key, size_t key_len);
/* Whether block id is reserved for a key. */
bool kvp_pool_is_pending(const struct kvp_pool *p, int32_t id);
/* Reserved blocks. */
uint32_t kvp_pool_num_pending(const struct kvp_pool *p);

/*
 * adopt: blocks an earlier life committed, with their keys (each key_len
 * bytes, the group last, as reserve's), taken back: each block must be free
 * and keyless, each key neither cached nor reserved, no block or key twice.
 * Each becomes cached and free, the LRU's newest in the order given, with
 * one BlockStored per run of one group as commit's. KVP_EINVAL (NULL
 * pointers, key_len, a block or key twice), KVP_ERANGE (an id), KVP_ESTATE
 * (a block in use or keyed, a key cached or reserved), KVP_ENOTSUP (caching
 * off), KVP_ENOMEM. Nothing changes on error.
 */
int kvp_pool_adopt(struct kvp_pool *p, const uint8_t *keys, size_t key_len, const int32_t *ids,
                   size_t n, const uint32_t *block_sizes, size_t num_groups);
/*
 * Calls fn(ctx, id) whenever block id's primary key leaves the cache (an
 * eviction, a move to another block, an evict call), and fn(ctx, -1) when a
 * reset empties it, under whatever serialises calls on p; fn must not call
 * into p. NULL fn: none. For a store of committed rows that must not outlive
 * their keys (a kept region's records).
 */
void kvp_pool_set_unkey_hook(struct kvp_pool *p, void (*fn)(void *ctx, int32_t id), void *ctx);

/*
 * announce: keys (each key_len bytes, the group last, as reserve's) that a
 * tier below the pool now holds (stored) or no longer holds, in another
 * medium (the disk tier's "STORAGE"): one BlockStored per run of one group,
 * or a BlockRemoved each, queued in order with the pool's own events. The
 * pool's blocks and map do not change. Nothing with events off. KVP_EINVAL
 * (NULL pointers, key_len, an empty medium), KVP_ENOMEM (nothing queued).
 */
int kvp_pool_announce(struct kvp_pool *p, bool stored, const uint8_t *keys, size_t key_len,
                      size_t n, const char *medium, const uint32_t *block_sizes,
                      size_t num_groups);

/* Moves the queued events into *out (whose previous contents are dropped). */
int kvp_pool_take_events(struct kvp_pool *p, struct kvp_event_batch *out);

/* Observers (p and ids valid; out-of-range ids return -1 / NULL / false). */
uint32_t kvp_pool_num_blocks(const struct kvp_pool *p);
uint32_t kvp_pool_num_free(const struct kvp_pool *p);
/* 1 - free/(N-1), or 0 when N == 1. */
double kvp_pool_usage(const struct kvp_pool *p);
/* Distinct keys in the prefix-cache map (vLLM's len()). */
uint32_t kvp_pool_num_cached_keys(const struct kvp_pool *p);
/* Blocks that currently hold a hash. */
uint32_t kvp_pool_num_cached_blocks(const struct kvp_pool *p);
int32_t kvp_pool_ref_cnt(const struct kvp_pool *p, int32_t id);
/* The block's map key (hash || group) and its length, or NULL if unhashed. */
const uint8_t *kvp_pool_block_key(const struct kvp_pool *p, int32_t id, size_t *len);
/* Free-queue order head to tail: writes up to cap ids, returns the count. */
size_t kvp_pool_free_queue(const struct kvp_pool *p, int32_t *out, size_t cap);
/*
 * The same from the block after `after` (0: from the head), a page of up
 * to cap ids, O(cap): KVP_OK with *n written and *more (blocks follow);
 * KVP_ENOTFOUND if after is not a free block now; KVP_EINVAL on bad args.
 */
int kvp_pool_free_queue_page(const struct kvp_pool *p, int32_t after, int32_t *out, size_t cap,
                             size_t *n, bool *more);
uint32_t kvp_pool_hash_block_size(const struct kvp_pool *p);
uint32_t kvp_pool_hash_len(const struct kvp_pool *p);
uint32_t kvp_pool_max_hash_len(const struct kvp_pool *p);
bool kvp_pool_caching_enabled(const struct kvp_pool *p);
void kvp_pool_get_stats(const struct kvp_pool *p, struct kvp_pool_stats *out);
/*
 * Bytes the pool allocated: per-block metadata (block array and the map's
 * per-block links), and the map's buckets plus key slab in *map_bytes.
 */
size_t kvp_pool_metadata_bytes(const struct kvp_pool *p, size_t *map_bytes);

/*
 * Invariant checker for tests and debug endpoints: ref 0 and non-null iff
 * in the free queue; queue links and count consistent; hashed iff in the map
 * under that key; map key count consistent; null block unhashed. Returns
 * KVP_OK or KVP_EINTERNAL with a description in detail (if non-NULL). O(N).
 */
int kvp_pool_check(const struct kvp_pool *p, char *detail, size_t detail_len);

#endif /* KVP_POOL_H */
