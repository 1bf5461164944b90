/* SPDX-License-Identifier: Apache-2.0 */
#include "engine/manager.h"

#include <stdlib.h>
#include <string.h>

#include "common/kvp_status.h"
#include "common/map_key.h"
#include "engine/group_mgr.h"
#include "engine/mgr_request.h"
#include "engine/mgr_impl.h"

/* ---- lifecycle ---- */

/* Merges identical specs into attention groups, full attention first (stable). */
static void
split_attention_groups(struct kvp_mgr *m)
{
	for (int pass = 0; pass < 2; pass++) {
		for (uint32_t g = 0; g < m->num_groups; g++) {
			bool full = m->spec[g].kind == KVP_GROUP_FULL, seen = false;
			if (full != (pass == 0))
				continue;
			for (uint32_t e = 0; e < g; e++)
				seen |= kvp_group_spec_equal(&m->spec[e], &m->spec[g]);
			if (seen)
				continue;
			struct attn_group *ag = &m->attn[m->num_attn++];
			for (uint32_t e = g; e < m->num_groups; e++)
				if (kvp_group_spec_equal(&m->spec[e], &m->spec[g]))
					ag->gids[ag->n++] = e;
		}
	}
	m->simple_hybrid = m->num_attn == 2 && m->spec[m->attn[0].gids[0]].kind == KVP_GROUP_FULL;
	m->all_full = m->num_attn == 1 && m->spec[0].kind == KVP_GROUP_FULL;
}

int
kvp_mgr_create(struct kvp_pool *pool, struct kvp_hasher *hasher,
               const struct kvp_mgr_config *cfg, struct kvp_mgr **out)
{
	struct kvp_group_spec spec[KVP_MGR_MAX_GROUPS];
	struct kvp_mgr *m;

	if (pool == NULL || hasher == NULL || cfg == NULL || out == NULL ||
	    cfg->num_groups == 0 || cfg->num_groups > KVP_MGR_MAX_GROUPS ||
	    (cfg->groups == NULL && cfg->block_sizes == NULL) || cfg->max_model_len == 0)
		return KVP_EINVAL;
	for (uint32_t g = 0; g < cfg->num_groups; g++) {
		if (cfg->groups != NULL)
			spec[g] = cfg->groups[g];
		else
			spec[g] = (struct kvp_group_spec){.kind = KVP_GROUP_FULL,
			                                  .block_size = cfg->block_sizes[g]};
	}
	bool caching = kvp_pool_caching_enabled(pool);
	uint32_t hbs = kvp_pool_hash_block_size(pool), hlen = kvp_pool_hash_len(pool);
	if (kvp_hasher_len(hasher) != hlen)
		return KVP_EINVAL;
	kvp_group_specs_resolve(spec, cfg->num_groups, caching);
	if (kvp_group_specs_validate(spec, cfg->num_groups, hbs, caching, NULL, 0) != KVP_OK)
		return KVP_EINVAL;
	/* 9aaf83ef5's concatenated keys must fit the pool's longest key. */
	for (uint32_t g = 0; g < cfg->num_groups && caching &&
	                     kvp_pool_semantics(pool) == KVP_VLLM_9AAF83EF5; g++)
		if ((uint64_t)(spec[g].block_size / hbs) * hlen > kvp_pool_max_hash_len(pool))
			return KVP_EINVAL;
	uint32_t maxr = cfg->max_requests ? cfg->max_requests : 65536;
	int rv;
	if (maxr > (1u << 30))
		return KVP_EINVAL;
	if ((m = calloc(1, sizeof(*m))) == NULL)
		return KVP_ENOMEM;
	if ((rv = kvp_mreq_table_init(&m->requests, maxr)) != KVP_OK) {
		free(m);
		return rv;
	}
	m->pool = pool;
	m->hasher = hasher;
	m->num_groups = cfg->num_groups;
	memcpy(m->spec, spec, cfg->num_groups * sizeof(*spec));
	for (uint32_t g = 0; g < cfg->num_groups; g++) {
		m->has_mamba_align |= spec[g].kind == KVP_GROUP_MAMBA &&
		                      spec[g].mamba_mode == KVP_MAMBA_ALIGN;
		m->has_cross |= spec[g].kind == KVP_GROUP_CROSS_ATTENTION;
	}
	m->lcm = kvp_group_specs_lcm(spec, cfg->num_groups);
	split_attention_groups(m);
	m->hash_bs = hbs;
	m->hlen = hlen;
	m->max_model_len = cfg->max_model_len;
	m->max_requests = maxr;
	*out = m;
	return KVP_OK;
}

static void release_blocks(struct kvp_mgr *m, struct kvp_mreq *r);

void
kvp_mgr_destroy(struct kvp_mgr *m)
{
	if (m == NULL)
		return;
	for (uint32_t i = 0; i <= m->requests.mask; i++) {
		if (m->requests.slots[i] != NULL) {
			release_blocks(m, m->requests.slots[i]);
			kvp_mreq_destroy(m->requests.slots[i]);
		}
	}
	kvp_mreq_table_fini(&m->requests);
	free(m->cache_mask);
	free(m->hit_ids);
	free(m);
}

/* ---- requests ---- */

/* Hashes the request's newly completed fine blocks. */
static int
extend_hashes(struct kvp_mgr *m, struct kvp_mreq *r)
{
	size_t full = r->num_tokens / m->hash_bs, n = 0;
	int rv;

	/* vLLM hashes nothing when prefix caching is off. */
	if (full <= r->num_hashes || !kvp_pool_caching_enabled(m->pool))
		return KVP_OK;
	rv = kvp_mgr_grow((void **)&r->hashes, &r->hash_cap, full, m->hlen);
	if (rv != KVP_OK)
		return rv;
	rv = kvp_hash_request(m->hasher, kvp_mreq_keys(r), r->tokens, r->num_tokens, m->hash_bs,
	                      r->hashes, r->num_hashes,
	                      r->hashes + r->num_hashes * m->hlen, full - r->num_hashes, &n);
	if (rv == KVP_OK)
		r->num_hashes += n;
	return rv;
}

int
kvp_mgr_add_request(struct kvp_mgr *m, uint64_t req_id, const struct kvp_request_desc *d)
{
	struct kvp_mreq *r;
	int rv;

	if (m == NULL || d == NULL || d->num_prompt == 0 || d->prompt == NULL ||
	    d->num_prompt > m->max_model_len || kvp_request_keys_validate(d->keys) != KVP_OK)
		return KVP_EINVAL;
	if (kvp_mreq_table_find(&m->requests, req_id) != NULL)
		return KVP_ESTATE;
	if (m->requests.count >= m->max_requests)
		return KVP_EBUSY;
	if ((rv = kvp_mreq_create(req_id, d->keys, &r)) != KVP_OK)
		return rv;
	r->skip_reading = d->skip_reading_prefix_cache;
	r->has_lora_id = d->has_lora_id;
	r->lora_id = d->lora_id;
	/*
	 * Room for the prompt and a generation's worth of tokens (and their
	 * hashes) up front: growing a long prompt's arrays at its first decode
	 * copied them (4% of the daemon's CPU on the S256 step).
	 */
	size_t want = d->num_prompt + (d->num_prompt < 256 ? 64 : 256);
	if (want > m->max_model_len)
		want = m->max_model_len;
	if ((r->tokens = malloc(want * sizeof(int64_t))) == NULL ||
	    (kvp_pool_caching_enabled(m->pool) && want / m->hash_bs > 0 &&
	     (r->hashes = malloc(want / m->hash_bs * m->hlen)) == NULL)) {
		kvp_mreq_destroy(r);
		return KVP_ENOMEM;
	}
	r->tok_cap = want;
	r->hash_cap = r->hashes ? want / m->hash_bs : 0;
	memcpy(r->tokens, d->prompt, d->num_prompt * sizeof(int64_t));
	r->num_tokens = r->num_prompt = d->num_prompt;
	if ((rv = extend_hashes(m, r)) != KVP_OK) {
		kvp_mreq_destroy(r);
		return rv;
	}
	kvp_mreq_table_insert(&m->requests, r);
	m->stats.active_requests = m->requests.count;
	return KVP_OK;
}

int
kvp_mgr_append_tokens(struct kvp_mgr *m, uint64_t req_id, const int64_t *tokens, size_t n)
{
	struct kvp_mreq *r;
	size_t old;
	int rv;

	if (m == NULL || (tokens == NULL && n > 0))
		return KVP_EINVAL;
	if ((r = kvp_mreq_table_find(&m->requests, req_id)) == NULL)
		return KVP_ENOTFOUND;
	if (n > m->max_model_len - r->num_tokens)
		return KVP_EINVAL;
	if ((rv = kvp_mgr_grow((void **)&r->tokens, &r->tok_cap, r->num_tokens + n,
	                       sizeof(int64_t))) != KVP_OK)
		return rv;
	old = r->num_tokens;
	memcpy(r->tokens + old, tokens, n * sizeof(int64_t));
	r->num_tokens += n;
	if ((rv = extend_hashes(m, r)) != KVP_OK)
		r->num_tokens = old; /* the appended tokens are not kept */
	return rv;
}

/* ---- allocate_slots ---- */

/*
 * Checks group g's hit blocks against the request's hashes: a remote caller
 * may send ids evicted since its lookup. Groups other than full attention
 * carry null blocks where vLLM's hit lists do.
 */
static int
check_hits(const struct kvp_mgr *m, const struct kvp_mreq *r, uint32_t g, const int32_t *ids,
           size_t nh)
{
	uint32_t k = m->spec[g].block_size / m->hash_bs;
	size_t klen, hl;

	if (nh > r->num_hashes / k)
		return KVP_EINVAL;
	for (size_t i = 0; i < nh; i++) {
		const uint8_t *key, *h;
		if (ids[i] < 0 || (uint32_t)ids[i] >= kvp_pool_num_blocks(m->pool))
			return KVP_ERANGE;
		if (ids[i] == KVP_NULL_BLOCK && m->spec[g].kind != KVP_GROUP_FULL)
			continue;
		key = kvp_pool_block_key(m->pool, ids[i], &klen);
		h = kvp_mgr_coarse(m, r, k, i, &hl);
		if (key == NULL || klen != hl + KVP_MAP_KEY_GROUP_LEN || memcmp(key, h, hl) ||
		    kvp_map_key_group(key, klen) != g)
			return KVP_ESTATE;
	}
	return KVP_OK;
}

static bool
cross(const struct kvp_mgr *m, uint32_t g)
{
	return m->spec[g].kind == KVP_GROUP_CROSS_ATTENTION;
}

/* Validates the step and plans every group; changes nothing. */
static int
plan_step(struct kvp_mgr *m, const struct kvp_mreq *r, const struct kvp_alloc_args *a,
          int32_t *const *new_blocks, size_t cap, size_t total, size_t need, size_t main,
          struct kvp_grp_plan *plan, uint64_t *to_allocate)
{
	size_t hit = a->num_new_computed_tokens, ext = a->num_external_computed_tokens;
	int rv;

	bool holds = false, unstarted = false; /* unstarted: blocks held, none cached yet */
	for (uint32_t g = 0; g < m->num_groups && (hit > 0 || ext > 0); g++) {
		holds |= r->groups[g].started || r->groups[g].n > 0;
		unstarted |= !r->groups[g].started && r->groups[g].n > 0;
	}
	if (hit > 0 && (holds || a->computed_blocks == NULL || r->num_computed + hit > r->num_tokens))
		return KVP_EINVAL;
	/* A connector computes tokens the request has; an unstarted table is vLLM's assert. */
	if (ext > 0 && (unstarted || (uint64_t)r->num_computed + hit + ext > r->num_tokens))
		return KVP_EINVAL;
	if (ext > 0 && (m->has_mamba_align || m->has_cross)) /* their external paths are not here */
		return KVP_ENOTSUP;
	*to_allocate = 0;
	for (uint32_t g = 0; g < m->num_groups; g++) {
		uint32_t bs = m->spec[g].block_size;
		if (cross(m, g)) { /* one static allocation for the encoder's tokens */
			if (((size_t)a->num_encoder_tokens + bs - 1) / bs > kvp_pool_num_blocks(m->pool))
				return KVP_ENOSPACE;
			kvp_grp_plan(&m->spec[g], &r->groups[g], m->pool, NULL, 0, 0, 0,
			             a->num_encoder_tokens, a->num_encoder_tokens, &plan[g]);
			if (plan[g].num_returned > cap ||
			    (plan[g].num_returned > 0 && (new_blocks == NULL || new_blocks[g] == NULL)))
				return KVP_EINVAL;
			*to_allocate += plan[g].to_allocate;
			continue;
		}
		size_t nh = hit > 0 ? hit / bs : 0; /* a decode step has no hit: no division */
		const int32_t *hits = nh ? a->computed_blocks[g] : NULL;
		if ((hit > 0 && hit % bs != 0) || (nh > 0 && hits == NULL))
			return KVP_EINVAL;
		if (nh > 0 && (rv = check_hits(m, r, g, hits, nh)) != KVP_OK)
			return rv;
		kvp_grp_plan(&m->spec[g], &r->groups[g], m->pool, hits, nh, total, ext, need, main,
		             &plan[g]);
		size_t out = plan[g].num_returned + plan[g].num_external;
		if (out > cap || (out > 0 && (new_blocks == NULL || new_blocks[g] == NULL)))
			return KVP_EINVAL;
		*to_allocate += plan[g].to_allocate;
	}
	return KVP_OK;
}

/* full_sequence_must_fit: would the request's whole known length fit now? */
static bool
whole_fits(struct kvp_mgr *m, const struct kvp_mreq *r, const struct kvp_alloc_args *a,
           size_t total)
{
	size_t full = r->num_tokens < m->max_model_len ? r->num_tokens : m->max_model_len;
	size_t hit = a->num_new_computed_tokens;
	uint64_t n = 0;

	for (uint32_t g = 0; g < m->num_groups; g++) {
		struct kvp_grp_plan p;
		size_t nh = hit > 0 && !cross(m, g) ? hit / m->spec[g].block_size : 0;
		size_t want = cross(m, g) ? a->num_encoder_tokens : full;
		kvp_grp_plan(&m->spec[g], &r->groups[g], m->pool, nh ? a->computed_blocks[g] : NULL,
		             nh, cross(m, g) ? 0 : total, a->num_external_computed_tokens, want, want,
		             &p);
		n += p.to_allocate;
	}
	return n <= kvp_pool_num_free(m->pool);
}

/* Every buffer the step can need, before anything changes. */
static int
reserve_step(struct kvp_mgr *m, struct kvp_mreq *r, const struct kvp_grp_plan *plan)
{
	size_t mask_need = 0;
	int rv;

	for (uint32_t g = 0; g < m->num_groups; g++) {
		size_t len = plan[g].max_len > r->groups[g].n ? plan[g].max_len : r->groups[g].n;
		if (len > r->groups[g].cap && (rv = kvp_grp_reserve(&r->groups[g], len)) != KVP_OK)
			return rv;
		if (len > mask_need)
			mask_need = len;
	}
	if (m->all_full)
		return KVP_OK; /* full attention caches every block: no mask */
	return kvp_mgr_grow((void **)&m->cache_mask, &m->mask_cap, mask_need, sizeof(bool));
}

/* A cache call's arguments for group g: the request's hashes, tokens and keys. */
static struct kvp_cache_args
request_args(const struct kvp_mgr *m, const struct kvp_mreq *r, uint32_t g)
{
	return (struct kvp_cache_args){
		.block_hashes = r->hashes, .num_block_hashes = r->num_hashes,
		.token_ids = r->tokens, .num_tokens = r->num_tokens,
		.keys = kvp_mreq_keys(r), .has_lora_id = r->has_lora_id, .lora_id = r->lora_id,
		.block_size = m->spec[g].block_size, .group_id = g,
	};
}

/*
 * vLLM 0.33's FullAttentionManager._cache_partial_tail_block: in a
 * full-attention group of blocks coarser than the hash blocks, the prompt's
 * last hash boundary below its final token, when it falls inside a block
 * the request holds and is cached (to_cache), becomes a partial entry of
 * that block (one BlockStored the first time). 9aaf83ef5 pools had none.
 */
static int
cache_partial_tail(struct kvp_mgr *m, struct kvp_mreq *r, uint32_t g, size_t to_cache)
{
	uint32_t bs = m->spec[g].block_size;
	size_t limit = r->num_prompt - 1, nh = limit / m->hash_bs;
	size_t boundary, idx;

	if (m->spec[g].kind != KVP_GROUP_FULL || bs == m->hash_bs ||
	    kvp_pool_semantics(m->pool) != KVP_VLLM_0_33)
		return KVP_OK;
	boundary = (nh < r->num_hashes ? nh : r->num_hashes) * m->hash_bs;
	if (boundary == 0 || boundary > to_cache || boundary % bs == 0 ||
	    (idx = boundary / bs) >= r->groups[g].n)
		return KVP_OK;
	struct kvp_cache_args ca = request_args(m, r, g);
	return kvp_pool_cache_partial_block(m->pool, r->groups[g].ids[idx], (uint32_t)boundary,
	                                    false, &ca, NULL);
}

/* cache_blocks: every group up to the same LCM-aligned token count. */
static int
cache_step(struct kvp_mgr *m, struct kvp_mreq *r, size_t to_cache)
{
	int rv;

	to_cache -= to_cache % m->lcm;
	for (uint32_t g = 0; g < m->num_groups; g++) {
		struct kvp_grp_blocks *gb = &r->groups[g];
		uint32_t bs = m->spec[g].block_size;
		/* Most decode steps complete no block: decided without dividing. */
		if ((size_t)(gb->num_cached + 1) * bs > to_cache) {
			if (bs != m->hash_bs && (rv = cache_partial_tail(m, r, g, to_cache)))
				return rv;
			continue;
		}
		uint32_t full = (uint32_t)(to_cache / bs);
		bool masked = !m->all_full && kvp_grp_cache_mask(&m->spec[g], m->lcm, gb->num_cached,
		                                                 full, m->cache_mask);
		struct kvp_cache_args ca = request_args(m, r, g);
		ca.num_cached_blocks = gb->num_cached;
		ca.num_full_blocks = full;
		ca.block_mask = masked ? m->cache_mask : NULL;
		if ((rv = kvp_pool_cache_full_blocks(m->pool, gb->ids, gb->n, &ca)) != KVP_OK)
			return rv;
		gb->num_cached = full;
		gb->started = true;
		if (bs != m->hash_bs && (rv = cache_partial_tail(m, r, g, to_cache)) != KVP_OK)
			return rv;
	}
	return KVP_OK;
}

int
kvp_mgr_allocate_slots(struct kvp_mgr *m, uint64_t req_id, const struct kvp_alloc_args *a,
                       int32_t *const *new_blocks, size_t cap, size_t *counts)
{
	struct kvp_grp_plan plan[KVP_MGR_MAX_GROUPS];
	struct kvp_mreq *r;
	size_t local, total_computed, main, need;
	uint64_t to_allocate;
	size_t ext = a ? a->num_external_computed_tokens : 0;
	int rv;

	if (m == NULL || a == NULL || counts == NULL || (a->num_new_tokens == 0 && ext == 0))
		return KVP_EINVAL;
	if ((r = kvp_mreq_table_find(&m->requests, req_id)) == NULL)
		return KVP_ENOTFOUND;
	/* Computed tokens: the request's, the hit, and the connector's (external). */
	local = r->num_computed + a->num_new_computed_tokens + ext;
	total_computed = local < m->max_model_len ? local : m->max_model_len;
	main = total_computed + a->num_new_tokens;
	need = main + (size_t)a->num_lookahead_tokens;
	if (need > m->max_model_len)
		need = m->max_model_len;

	if ((rv = plan_step(m, r, a, new_blocks, cap, local, need, main, plan, &to_allocate)) ||
	    (rv = reserve_step(m, r, plan)))
		return rv;
	if (a->full_sequence_must_fit && !whole_fits(m, r, a, local)) {
		m->stats.alloc_failures++;
		return KVP_ENOSPACE;
	}
	/* vLLM frees what left the window first, even if the step is refused. */
	for (uint32_t g = 0; g < m->num_groups && !m->all_full; g++)
		kvp_grp_remove_skipped(&m->spec[g], &r->groups[g], m->pool,
		                       total_computed - (a->num_in_flight_tokens < total_computed ?
		                                         a->num_in_flight_tokens : total_computed));
	if (to_allocate > kvp_pool_num_free(m->pool)) {
		m->stats.alloc_failures++;
		return KVP_ENOSPACE;
	}
	for (uint32_t g = 0; g < m->num_groups; g++) {
		size_t nh = a->num_new_computed_tokens / m->spec[g].block_size;
		if (nh > 0 || ext > 0)
			kvp_grp_adopt_hits(&m->spec[g], &r->groups[g], m->pool,
			                   nh ? a->computed_blocks[g] : NULL, nh, local, ext);
	}
	/* External blocks, then allocate_new_blocks, in group order: chunks of the queue head. */
	for (uint32_t g = 0; g < m->num_groups && ext > 0; g++)
		if ((rv = kvp_grp_add_external(&r->groups[g], m->pool, plan[g].num_external,
		                               new_blocks[g])))
			return rv;
	for (uint32_t g = 0; g < m->num_groups; g++) {
		size_t e = plan[g].num_external;
		size_t gneed = cross(m, g) ? a->num_encoder_tokens : need;
		size_t gmain = cross(m, g) ? a->num_encoder_tokens : main;
		if ((rv = kvp_grp_allocate(&m->spec[g], &r->groups[g], m->pool, gneed, gmain,
		                           plan[g].num_returned ? new_blocks[g] + e : NULL, &counts[g])))
			return rv;
		counts[g] += e;
		if (a->num_external_blocks != NULL)
			a->num_external_blocks[g] = e;
	}
	r->num_computed = main < m->max_model_len ? main : m->max_model_len;
	if (a->delay_cache_blocks || !kvp_pool_caching_enabled(m->pool))
		return KVP_OK;
	return cache_step(m, r, main < r->num_tokens ? main : r->num_tokens);
}

/* Frees each group's blocks in reverse order (deepest evicted first). */
static void
release_blocks(struct kvp_mgr *m, struct kvp_mreq *r)
{
	for (uint32_t g = 0; g < m->num_groups; g++)
		kvp_grp_free(&r->groups[g], m->pool);
	r->num_computed = 0;
}

int
kvp_mgr_preempt(struct kvp_mgr *m, uint64_t req_id)
{
	struct kvp_mreq *r;

	if (m == NULL)
		return KVP_EINVAL;
	if ((r = kvp_mreq_table_find(&m->requests, req_id)) == NULL)
		return KVP_ENOTFOUND;
	release_blocks(m, r);
	r->num_preemptions++;
	return KVP_OK;
}

int
kvp_mgr_free_request(struct kvp_mgr *m, uint64_t req_id)
{
	struct kvp_mreq *r;

	if (m == NULL)
		return KVP_EINVAL;
	if ((r = kvp_mreq_table_find(&m->requests, req_id)) == NULL)
		return KVP_ENOTFOUND;
	release_blocks(m, r);
	kvp_mreq_table_remove(&m->requests, req_id);
	kvp_mreq_destroy(r);
	m->stats.active_requests = m->requests.count;
	return KVP_OK;
}

int
kvp_mgr_request_blocks(const struct kvp_mgr *m, uint64_t req_id, uint32_t g,
                       const int32_t **ids, size_t *n)
{
	const struct kvp_mreq *r;

	if (m == NULL || ids == NULL || n == NULL || g >= m->num_groups)
		return KVP_EINVAL;
	if ((r = kvp_mreq_table_find(&m->requests, req_id)) == NULL)
		return KVP_ENOTFOUND;
	*ids = r->groups[g].ids;
	*n = r->groups[g].n;
	return KVP_OK;
}

int
kvp_mgr_request_info(const struct kvp_mgr *m, uint64_t req_id, size_t *num_tokens,
                     size_t *num_computed, size_t *num_hashes)
{
	const struct kvp_mreq *r;

	if (m == NULL)
		return KVP_EINVAL;
	if ((r = kvp_mreq_table_find(&m->requests, req_id)) == NULL)
		return KVP_ENOTFOUND;
	if (num_tokens)
		*num_tokens = r->num_tokens;
	if (num_computed)
		*num_computed = r->num_computed;
	if (num_hashes)
		*num_hashes = r->num_hashes;
	return KVP_OK;
}

int
kvp_mgr_take_events(struct kvp_mgr *m, struct kvp_event_batch *out)
{
	int rv;

	if (m == NULL || out == NULL)
		return KVP_EINVAL;
	if ((rv = kvp_pool_take_events(m->pool, out)) != KVP_OK)
		return rv;
	kvp_group_specs_annotate(m->spec, m->num_groups, out);
	return KVP_OK;
}

void
kvp_mgr_get_stats(const struct kvp_mgr *m, struct kvp_mgr_stats *out)
{
	*out = m->stats;
}

uint32_t
kvp_mgr_num_groups(const struct kvp_mgr *m)
{
	return m->num_groups;
}

const struct kvp_group_spec *
kvp_mgr_group_spec(const struct kvp_mgr *m, uint32_t g)
{
	return m != NULL && g < m->num_groups ? &m->spec[g] : NULL;
}
