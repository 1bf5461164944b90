/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pool_impl.h: the pool's state, private to the engine's pool modules
 * (pool.c, the hot paths; pool_check.c, introspection and invariants).
 */
#ifndef KVP_POOL_IMPL_H
#define KVP_POOL_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/events.h"
#include "common/map_key.h"
#include "engine/free_queue.h"
#include "engine/hash_map.h"
#include "engine/pool.h"

#define GROUP_LEN KVP_MAP_KEY_GROUP_LEN
/* Longest key: a coarse hash of 32 fine hashes (block_size = 32 x
 * hash_block_size) and the group id. Keys are built on the stack. */
#define MAX_HASH (32 * KVP_HASH_LEN)
#define MAX_KEY (MAX_HASH + GROUP_LEN)

struct kvp_pool {
	uint32_t n;               /* blocks, the null block included */
	uint32_t hash_block_size;
	uint32_t hash_len;        /* bytes per fine hash: 32 or 16 */
	uint32_t max_hash_len;
	bool caching, events_on;
	bool free_unhashed_first; /* vLLM 0.33's free order */
	bool coarse_concat;       /* 9aaf83ef5's concatenated coarse keys */
	char medium[32];          /* sizeof: the limit on a configured medium */
	struct kvp_block *blocks; /* n + 2: the queue's sentinels at the end */
	struct kvp_queue queue;
	struct kvp_map map;
	struct kvp_metrics *metrics;
	void (*on_alloc)(void *ctx, const int32_t *ids, uint32_t n);
	void *on_alloc_ctx;
	void (*on_unkey)(void *ctx, int32_t id); /* kvp_pool_set_unkey_hook */
	void *on_unkey_ctx;
	struct kvp_event_batch events;
	uint32_t stamp;           /* current call's mark for duplicate checks */
	uint32_t num_hashed;
	int32_t *scratch;         /* n ids: evict_blocks' sorted set */
	uint8_t *extra_buf;       /* cache_full_blocks' extra-key scratch */
	size_t extra_cap;
	struct kvp_pool_stats stats;
	struct kvp_map pending;   /* reserved keys -> their blocks (pool_keyed.c) */
	bool pending_on;          /* pending is made on the first reserve */
	uint32_t num_pending;
	uint32_t *htok;           /* per block: tokens its primary key covers (vLLM's
	                           * block_hash_num_tokens), | HTOK_PARTIAL when that key
	                           * came from cache_partial_block; 0: not known (a keyed commit) */
	/* Partial entries (vLLM 0.33's cache_partial_block, pool_partial.c): a
	 * block's keys past its primary are map ids n..2n-1, made on first use. */
	int32_t *xowner;          /* per extra slot: its block, or -1 when free */
	int32_t *xnext;           /* per extra slot: the block's next slot, or the next free one */
	int32_t *xhead;           /* per block: its first extra slot, or -1 */
	int32_t xfree;            /* first free extra slot, or -1 */
	uint32_t num_extra;       /* extra entries in the map */
};

#define HTOK_PARTIAL 0x80000000u

/* The block a map id stands for (an extra slot's owner), or -1 for -1. */
static inline int32_t
kvp_pool__owner(const struct kvp_pool *p, int32_t mid)
{
	return mid < (int32_t)p->n ? mid : p->xowner[mid - (int32_t)p->n];
}

/* The event scratch holds one stored block's extra keys of k: KVP_OK or KVP_ENOMEM. */
int kvp_pool__extra_room(struct kvp_pool *p, const struct kvp_request_keys *k);
/* all_token_ids[*t0:*t1] as indexes into a's token window (first_token on), Python-clamped. */
void kvp_pool__token_window(const struct kvp_cache_args *a, size_t *t0, size_t *t1);

/*
 * A BlockStored for a's request, tokens a->token_ids[t0:t1] (from
 * kvp_pool__token_window): its LoRA, session id and group, the pool's
 * medium; the caller sets parent. And the bytes reserve() needs for it
 * with n hashes of hash_len bytes.
 */
static inline struct kvp_stored_desc
kvp_pool__stored_desc(const struct kvp_pool *p, const struct kvp_cache_args *a, size_t hash_len,
                      uint32_t block_size, size_t t0, size_t t1, size_t n)
{
	return (struct kvp_stored_desc){
		.hash_len = hash_len,
		.token_ids = a->token_ids + t0,
		.num_tokens = t1 - t0,
		.block_size = block_size,
		.has_lora_id = a->has_lora_id,
		.lora_id = a->lora_id,
		.lora_name = a->keys ? a->keys->lora_name : NULL,
		.session_id = a->keys ? a->keys->session_id : NULL,
		.medium = p->medium,
		.group_idx = a->group_id,
		.max_hashes = n,
	};
}

static inline size_t
kvp_pool__stored_bytes(const struct kvp_pool *p, const struct kvp_cache_args *a, size_t n,
                       size_t hash_len, bool parent, size_t num_tokens)
{
	return kvp_event_stored_bytes(n, hash_len, parent, num_tokens,
	                              a->keys ? a->keys->lora_name : NULL,
	                              a->keys ? a->keys->session_id : NULL, p->medium,
	                              n * kvp_extra_keys_max_len(a->keys));
}

/* Extra keys of block id (0 when none). */
uint32_t kvp_pool__num_extras(const struct kvp_pool *p, int32_t id);
/* Drops block id's extra keys, queuing a BlockRemoved for each (the caller
 * reserved them), in the order they were added (pool_partial.c). */
void kvp_pool__drop_extras(struct kvp_pool *p, int32_t id);
/* _remove_cached_block_hashes: block id's primary key, then its extras, one
 * BlockRemoved each (the caller reserved them). */
void kvp_pool__drop_all(struct kvp_pool *p, int32_t id);
/* Forgets every extra key (reset_prefix_cache). */
void kvp_pool__clear_extras(struct kvp_pool *p);

/* Forgets the pending key of block id, whose last reference went (pool_keyed.c). */
void kvp_pool__drop_pending(struct kvp_pool *p, int32_t id);

#endif /* KVP_POOL_IMPL_H */
