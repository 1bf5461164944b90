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
};

/* Forgets the pending key of block id, whose last reference went (pool_keyed.c). */
void kvp_pool__drop_pending(struct kvp_pool *p, int32_t id);

#endif /* KVP_POOL_IMPL_H */
