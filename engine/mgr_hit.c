/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mgr_hit.c: vLLM's find_longest_cache_hit for the request manager: each
 * attention group's search, the hybrid coordinator's fixed point, and
 * get_computed_blocks with its prefix-cache statistics.
 */
#include "engine/mgr_impl.h"

#include <string.h>

struct probe_ctx {
	struct kvp_mgr *m;
	const struct kvp_mreq *r;
	const struct attn_group *ag;
	uint32_t k;
};

/*
 * Looks block i up in every group of the attention group and keeps the ids:
 * every block of a search's final hit [first, len) was probed as a hit by
 * that search, so the caller copies the hit without looking it up again.
 */
static bool
probe(void *ctx, size_t i)
{
	const struct probe_ctx *p = ctx;
	int32_t ids[KVP_MGR_MAX_GROUPS];
	size_t len;

	if (i >= p->r->num_hashes / p->k)
		return false;
	const uint8_t *h = kvp_mgr_coarse(p->m, p->r, p->k, i, &len);
	if (kvp_pool_get_cached_block(p->m->pool, h, len, p->ag->gids, p->ag->n, ids) != KVP_OK)
		return false;
	for (uint32_t j = 0; j < p->ag->n; j++)
		p->m->hit_ids[p->ag->gids[j] * p->m->hit_stride + i] = ids[j];
	return true;
}

static struct kvp_grp_hit
search(struct kvp_mgr *m, const struct kvp_mreq *r, uint32_t a, size_t max_len,
       uint32_t align)
{
	const struct kvp_group_spec *s = &m->spec[m->attn[a].gids[0]];
	struct probe_ctx p = {m, r, &m->attn[a], s->block_size / m->hash_bs};

	return kvp_grp_search(s, max_len, align, probe, &p);
}

/*
 * The coordinator: one group's search (unitary), or vLLM's fixed point over
 * the attention groups (hybrid): each either accepts the candidate length
 * or shrinks it, until none shrinks (one pass for 1 full + 1 other). Writes
 * each group's hit (length and leading nulls) to hit[g] and the longest hit
 * one attention group found alone to *longest; returns the tokens.
 */
static size_t
longest_hit(struct kvp_mgr *m, const struct kvp_mreq *r, size_t max_len,
            struct kvp_grp_hit *hit, size_t *longest)
{
	struct kvp_grp_hit res[KVP_MGR_MAX_GROUPS];
	bool have[KVP_MGR_MAX_GROUPS] = {false};
	size_t hit_len = max_len;

	*longest = 0;
	if (m->num_attn == 1) {
		res[0] = search(m, r, 0, max_len, m->spec[m->attn[0].gids[0]].block_size);
		hit_len = res[0].len * m->spec[m->attn[0].gids[0]].block_size;
		*longest = hit_len;
	} else {
		for (;;) {
			size_t cur = hit_len;
			for (uint32_t a = 0; a < m->num_attn; a++) {
				const struct kvp_group_spec *s = &m->spec[m->attn[a].gids[0]];
				if (s->kind == KVP_GROUP_FULL && have[a]) {
					cur = cur / s->block_size * s->block_size;
					continue;
				}
				res[a] = search(m, r, a, cur, m->lcm);
				have[a] = true;
				cur = res[a].len * s->block_size;
				*longest = cur > *longest ? cur : *longest;
			}
			if (cur >= hit_len)
				break;
			hit_len = cur;
			if (m->simple_hybrid)
				break;
		}
	}
	for (uint32_t a = 0; a < m->num_attn; a++) {
		const struct kvp_group_spec *s = &m->spec[m->attn[a].gids[0]];
		if (s->kind == KVP_GROUP_FULL)
			res[a].len = hit_len / s->block_size; /* truncated to the final length */
		for (uint32_t i = 0; i < m->attn[a].n; i++)
			hit[m->attn[a].gids[i]] = res[a];
	}
	return hit_len;
}

/*
 * The hit of r's hashes capped at max_len tokens, written out as
 * kvp_mgr_get_computed_blocks says; *len and *longest in tokens. KVP_EINVAL
 * (cap too small: nothing written), KVP_ENOMEM.
 */
static int
hit_of(struct kvp_mgr *m, const struct kvp_mreq *r, size_t max_len, int32_t *const *out,
       size_t cap, size_t *len, size_t *longest)
{
	struct kvp_grp_hit hit[KVP_MGR_MAX_GROUPS];
	/* A probed block index is below the request's fine hash count. */
	size_t stride = r->num_hashes + 1;
	int rv = kvp_mgr_grow((void **)&m->hit_ids, &m->hit_cap, stride * m->num_groups,
	                      sizeof(int32_t));
	if (rv != KVP_OK)
		return rv;
	m->hit_stride = stride;
	size_t n = longest_hit(m, r, max_len, hit, longest);
	for (uint32_t g = 0; g < m->num_groups && n > 0; g++)
		if (hit[g].len > cap || (hit[g].len > 0 && (out == NULL || out[g] == NULL)))
			return KVP_EINVAL;
	for (uint32_t g = 0; g < m->num_groups && n > 0; g++) {
		const int32_t *ids = m->hit_ids + g * m->hit_stride;
		for (size_t i = 0; i < hit[g].first && i < hit[g].len; i++)
			out[g][i] = KVP_NULL_BLOCK;
		if (hit[g].len > hit[g].first)
			memcpy(out[g] + hit[g].first, ids + hit[g].first,
			       (hit[g].len - hit[g].first) * sizeof(int32_t));
	}
	*len = n;
	return KVP_OK;
}

int
kvp_mgr_find_hit(struct kvp_mgr *m, const uint8_t *hashes, size_t num_hashes, size_t max_len,
                 int32_t *const *out, size_t cap, uint32_t *hit_tokens, uint32_t *uncached)
{
	/* A request of hashes alone: the search reads nothing else of it. */
	struct kvp_mreq r = {.hashes = (uint8_t *)hashes, .num_hashes = num_hashes};
	size_t len = 0, longest = 0;
	int rv;

	if (m == NULL || hit_tokens == NULL || uncached == NULL || (hashes == NULL && num_hashes))
		return KVP_EINVAL;
	if (max_len > num_hashes * m->hash_bs)
		max_len = num_hashes * m->hash_bs;
	if (kvp_pool_caching_enabled(m->pool) && max_len > 0 &&
	    (rv = hit_of(m, &r, max_len, out, cap, &len, &longest)) != KVP_OK)
		return rv;
	*hit_tokens = (uint32_t)len;
	*uncached = (uint32_t)(longest > len ? longest - len : 0);
	return KVP_OK;
}

int
kvp_mgr_get_computed_blocks(struct kvp_mgr *m, uint64_t req_id, int32_t *const *out,
                            size_t cap, uint32_t *hit_tokens)
{
	struct kvp_mreq *r;
	size_t len = 0, longest;
	bool lookup;
	int rv;

	if (m == NULL || hit_tokens == NULL)
		return KVP_EINVAL;
	if ((r = kvp_mreq_table_find(&m->requests, req_id)) == NULL)
		return KVP_ENOTFOUND;
	lookup = kvp_pool_caching_enabled(m->pool) && !r->skip_reading;
	if (lookup && (rv = hit_of(m, r, r->num_tokens - 1, out, cap, &len, &longest)) != KVP_OK)
		return rv;
	if (lookup) {
		if (r->num_preemptions > 0) {
			m->stats.preempted_requests++;
			m->stats.preempted_queries += r->num_tokens;
			m->stats.preempted_hits += len;
		} else {
			m->stats.requests++;
			m->stats.queries += r->num_tokens;
			m->stats.hits += len;
		}
	}
	*hit_tokens = (uint32_t)len;
	return KVP_OK;
}
