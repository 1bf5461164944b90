/* SPDX-License-Identifier: Apache-2.0 */
/*
 * group_mgr.h: one KV cache group's block logic for one request, by kind
 * (vLLM's SingleTypeKVCacheManager subclasses: full attention, sliding
 * window, chunked local attention, Mamba). Internal to the engine: the
 * manager (manager.c) owns the requests and the coordinator's fixed point
 * and calls these per group.
 *
 * Mamba: num_speculative_blocks is 0 (no MTP/EAGLE drafts on Mamba layers);
 * modes align, all and none as vLLM's MambaManager.
 *
 * Not thread-safe; no I/O; allocates only in kvp_grp_reserve().
 */
#ifndef KVP_GROUP_MGR_H
#define KVP_GROUP_MGR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/group_spec.h"
#include "engine/pool.h"

/* A request's blocks in one group (vLLM: req_to_blocks and friends). */
struct kvp_grp_blocks {
	int32_t *ids;          /* the block table; KVP_NULL_BLOCK where skipped */
	size_t n, cap;
	uint32_t num_cached;   /* num_cached_block[req] */
	bool started;          /* req in num_cached_block */
	bool allocated;        /* Mamba align: req in _allocated_block_reqs */
	int64_t last_state;    /* Mamba align: last_state_block_idx, or -1 */
};

void kvp_grp_blocks_reset(struct kvp_grp_blocks *b);

/* Does block i of this group hit in every group of its attention group? */
typedef bool (*kvp_grp_probe)(void *ctx, size_t i);

/*
 * find_longest_cache_hit for one attention group: the hit is len blocks,
 * of which blocks [0, first) are the null block and [first, len) are hits
 * (probe true). align: the coordinator's alignment in tokens.
 */
struct kvp_grp_hit {
	size_t len, first;
};
struct kvp_grp_hit kvp_grp_search(const struct kvp_group_spec *s, size_t max_len, uint32_t align,
                                  kvp_grp_probe probe, void *ctx);

/* get_num_skipped_tokens(n): tokens before the attention window (0: none). */
size_t kvp_grp_skipped_tokens(const struct kvp_group_spec *s, size_t n);

/* What one allocate_slots step will do in this group (computed before any change). */
struct kvp_grp_plan {
	size_t to_allocate;   /* get_num_blocks_to_allocate */
	size_t num_returned;  /* entries allocate_new_blocks returns (nulls included) */
	size_t num_external;  /* new blocks for external tokens (allocate_new_computed_blocks) */
	size_t max_len;       /* the longest the block table gets */
};

/*
 * Plans one step: hits/nh the prefix hit (only for a request holding no
 * blocks), total = computed tokens including the hit and ext external
 * (connector) tokens, need = tokens that need a slot (lookahead included),
 * main = without lookahead.
 */
void kvp_grp_plan(const struct kvp_group_spec *s, const struct kvp_grp_blocks *b,
                  const struct kvp_pool *pool, const int32_t *hits, size_t nh, size_t total,
                  size_t ext, size_t need, size_t main, struct kvp_grp_plan *out);

/* Grows the block table to hold n entries. KVP_ENOMEM. */
int kvp_grp_reserve(struct kvp_grp_blocks *b, size_t n);

/* remove_skipped_blocks: frees blocks that left the window (tail first). */
void kvp_grp_remove_skipped(const struct kvp_group_spec *s, struct kvp_grp_blocks *b,
                            struct kvp_pool *pool, size_t total_computed);

/*
 * allocate_new_computed_blocks for a request holding no blocks, first
 * phase: touches and adopts the hit (nulls for skipped blocks). The new
 * blocks the external tokens still in the window need (the plan's
 * num_external) come from kvp_grp_add_external once every group has touched
 * its hits, as vLLM does since its fix for hits evicted across groups. A
 * running request: nothing.
 */
void kvp_grp_adopt_hits(const struct kvp_group_spec *s, struct kvp_grp_blocks *b,
                        struct kvp_pool *pool, const int32_t *hits, size_t nh, size_t total,
                        size_t ext);
/* Appends n new blocks for external tokens (planned: the pool has room); copies them to out. */
int kvp_grp_add_external(struct kvp_grp_blocks *b, struct kvp_pool *pool, size_t n, int32_t *out);

/*
 * allocate_new_blocks: appends new blocks (planned; the pool has room) and
 * copies the entries it added to out (nulls included), *count of them.
 */
int kvp_grp_allocate(const struct kvp_group_spec *s, struct kvp_grp_blocks *b,
                     struct kvp_pool *pool, size_t need, size_t main, int32_t *out, size_t *count);

/*
 * The cache mask for blocks [from, to) under the coordinator's alignment
 * (vLLM's _cache_block_mask): a sliding-window group under a coarser LCM
 * caches only the trailing cdiv(window - 1, bs) blocks of each segment.
 * Returns false when every block is cached (no mask); mask has to - from
 * entries.
 */
bool kvp_grp_cache_mask(const struct kvp_group_spec *s, uint32_t align, size_t from, size_t to,
                        bool *mask);

/* Frees the blocks in reverse order (tail first) and resets the state. */
void kvp_grp_free(struct kvp_grp_blocks *b, struct kvp_pool *pool);

#endif /* KVP_GROUP_MGR_H */
