/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mgr_impl.h: the request manager's state, shared by its parts (manager.c,
 * mgr_hit.c). Internal to the engine.
 */
#ifndef KVP_MGR_IMPL_H
#define KVP_MGR_IMPL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/kvp_status.h"
#include "engine/group_mgr.h"
#include "engine/manager.h"
#include "engine/mgr_request.h"
#include "engine/pool.h"

/* vLLM's attention groups: groups with identical specs, searched together. */
struct attn_group {
	uint32_t n;
	uint32_t gids[KVP_MGR_MAX_GROUPS];
};

struct kvp_mgr {
	struct kvp_pool *pool;
	struct kvp_hasher *hasher;
	uint32_t num_groups;
	struct kvp_group_spec spec[KVP_MGR_MAX_GROUPS];
	uint32_t num_attn;             /* full attention first, as vLLM sorts them */
	struct attn_group attn[KVP_MGR_MAX_GROUPS];
	bool simple_hybrid;            /* 1 full + 1 other: one pass of the fixed point */
	bool all_full;                 /* only full attention: nothing skipped or masked */
	bool has_mamba_align;          /* refuses external tokens */
	bool has_cross;                /* a cross-attention group: refuses external tokens too */
	uint32_t lcm;
	bool *cache_mask;              /* cache_full_blocks mask scratch */
	size_t mask_cap;
	int32_t *hit_ids;              /* the search's hits, group g at g * hit_stride */
	size_t hit_cap, hit_stride;
	uint32_t hash_bs;
	uint32_t hlen;                 /* bytes per fine hash: the hasher's digest */
	uint32_t max_model_len;
	uint32_t max_requests;
	struct kvp_mreq_table requests;
	struct kvp_mgr_stats stats;
};

/* Grows *p (cap elements of elem bytes) to hold need, doubling: KVP_OK, or KVP_ENOMEM unchanged. */
static inline int
kvp_mgr_grow(void **p, size_t *cap, size_t need, size_t elem)
{
	size_t c = *cap ? *cap : 16;
	void *np;

	if (need <= *cap)
		return KVP_OK;
	while (c < need)
		c *= 2;
	if ((np = realloc(*p, c * elem)) == NULL)
		return KVP_ENOMEM;
	*p = np;
	*cap = c;
	return KVP_OK;
}

/* The key hash of group block i (kvp_pool_coarse_hash: the pool's rule); *len its length. */
static inline const uint8_t *
kvp_mgr_coarse(const struct kvp_mgr *m, const struct kvp_mreq *r, uint32_t k, size_t i, size_t *len)
{
	return kvp_pool_coarse_hash(m->pool, r->hashes, k, i, len);
}

#endif
