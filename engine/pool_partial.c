/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pool_partial.c: vLLM 0.33's partial prefix-cache entries
 * (BlockPool.cache_partial_block, move_block_hashes): a block reachable
 * from more than one key. A block's first key is its primary (the map id
 * is the block's own); the others are extra slots, map ids n..2n-1, each
 * owned by one block, so one key's chain keeps vLLM's insertion order
 * whichever kind its entries are. The slots and the map's room for them
 * are made on the first partial entry: a pool that never makes one pays
 * nothing.
 */
#include <stdlib.h>
#include <string.h>

#include "common/kvp_status.h"
#include "engine/pool_impl.h"

static int
partial_init(struct kvp_pool *p)
{
	int rv;

	if (p->xowner != NULL)
		return KVP_OK;
	if ((uint64_t)p->n * 2 > INT32_MAX - 2)
		return KVP_ENOSPACE;
	int32_t *own = malloc((size_t)p->n * sizeof(*own));
	int32_t *nx = malloc((size_t)p->n * sizeof(*nx));
	int32_t *hd = malloc((size_t)p->n * sizeof(*hd));
	rv = own && nx && hd ? kvp_map_grow(&p->map, p->n * 2) : KVP_ENOMEM;
	if (rv != KVP_OK) {
		free(own), free(nx), free(hd);
		return rv;
	}
	for (uint32_t i = 0; i < p->n; i++) {
		own[i] = -1;
		nx[i] = i + 1 < p->n ? (int32_t)i + 1 : -1;
		hd[i] = -1;
	}
	p->xowner = own;
	p->xnext = nx;
	p->xhead = hd;
	p->xfree = 0;
	return KVP_OK;
}

/* Whether block id is under key (as its primary or through an extra slot). */
static bool
block_under(const struct kvp_pool *p, const uint8_t *key, size_t len, int32_t id)
{
	for (int32_t j = kvp_map_lookup(&p->map, key, len); j >= 0;
	     j = kvp_map_next_same_key(&p->map, j))
		if (kvp_pool__owner(p, j) == id)
			return true;
	return false;
}

/* Adds key to block id: its primary if it has none, else an extra slot (one is free). */
static void
add_key(struct kvp_pool *p, int32_t id, const uint8_t *key, size_t len, uint32_t ntok)
{
	int rv;

	if (!kvp_map_has_id(&p->map, id)) {
		rv = kvp_map_insert(&p->map, key, len, id);
		p->num_hashed++;
		p->htok[id] = ntok | HTOK_PARTIAL;
	} else {
		int32_t s = p->xfree, *link = &p->xhead[id];
		p->xfree = p->xnext[s];
		p->xowner[s] = id;
		p->xnext[s] = -1;
		while (*link >= 0)
			link = &p->xnext[*link];
		*link = s;
		rv = kvp_map_insert(&p->map, key, len, (int32_t)p->n + s);
		p->num_extra++;
	}
	(void)rv; /* cannot fail: the length fits and the id is unmapped */
}

int
kvp_pool_cache_partial_block(struct kvp_pool *p, int32_t id, uint32_t num_tokens, bool replace,
                             const struct kvp_cache_args *a, bool *stored)
{
	uint8_t key[MAX_KEY];
	int rv;

	if (p == NULL || a == NULL)
		return KVP_EINVAL;
	if (id < 0 || (uint32_t)id >= p->n)
		return KVP_ERANGE;
	if (id == KVP_NULL_BLOCK) {
		if (stored != NULL)
			*stored = false;
		return KVP_OK;
	}
	if (!p->caching || p->coarse_concat)
		return KVP_ENOTSUP;
	uint32_t hbs = p->hash_block_size, hl = p->hash_len;
	if (a->block_size == 0 || a->block_size % hbs != 0 || num_tokens == 0 ||
	    num_tokens >= HTOK_PARTIAL ||
	    num_tokens % hbs != 0 || a->block_hashes == NULL ||
	    num_tokens / hbs > a->num_block_hashes || (a->token_ids == NULL && a->num_tokens > 0) ||
	    kvp_request_keys_validate(a->keys) != KVP_OK)
		return KVP_EINVAL;
	if (p->blocks[id].ref_cnt == 0 || (p->num_pending != 0 && kvp_map_has_id(&p->pending, id)))
		return KVP_ESTATE;
	size_t nhb = num_tokens / hbs, klen = hl + GROUP_LEN;
	const uint8_t *h = a->block_hashes + (nhb - 1) * hl;
	memcpy(key, h, hl);
	kvp_map_key_put_group(key + hl, a->group_id);

	bool primary = kvp_map_has_id(&p->map, id);
	bool already = block_under(p, key, klen, id), drop = false;
	if (replace) {
		drop = primary;
		already = false;
	} else if (!already && primary && (p->htok[id] & ~HTOK_PARTIAL) != 0 &&
	           (p->htok[id] & ~HTOK_PARTIAL) < num_tokens) {
		drop = true;
	}
	bool extra = primary && !drop && !already;
	uint32_t nrem = drop ? 1 + kvp_pool__num_extras(p, id) : 0;

	/* Everything that can fail, before any change. */
	if (extra) {
		if ((rv = partial_init(p)) != KVP_OK)
			return rv;
		if (p->xfree < 0)
			return KVP_ENOSPACE; /* n extra keys already: documented */
	}
	size_t t0 = (nhb - 1) * hbs, t1 = num_tokens; /* all_token_ids[t0:t1], clamped */
	if (p->events_on) {
		size_t w0 = t0, w1 = t1;
		if ((rv = kvp_pool__extra_room(p, a->keys)) != KVP_OK)
			return rv;
		kvp_pool__token_window(a, &w0, &w1);
		size_t bytes = nrem * kvp_event_removed_bytes(p->max_hash_len, p->medium);
		if (!already)
			bytes += kvp_pool__stored_bytes(p, a, 1, hl, nhb > 1, w1 - w0);
		if ((rv = kvp_event_batch_reserve(&p->events, nrem + !already, bytes)) != KVP_OK)
			return rv;
		t0 = w0, t1 = w1;
	}

	if (drop)
		kvp_pool__drop_all(p, id);
	if (!already)
		add_key(p, id, key, klen, num_tokens);
	if (p->events_on && !already) {
		int64_t mm_idx = 0, start = (int64_t)(nhb - 1) * hbs;
		size_t elen = 0;
		struct kvp_stored_desc d = kvp_pool__stored_desc(p, a, hl, hbs, t0, t1, 1);
		d.parent = nhb > 1 ? h - hl : NULL;
		kvp_event_stored_begin(&p->events, &d);
		rv = kvp_extra_keys_encode(a->keys, KVP_KEYS_PLAIN, start, (int64_t)num_tokens,
		                           &mm_idx, p->extra_buf, p->extra_cap, &elen);
		(void)rv; /* the buffer holds kvp_extra_keys_max_len */
		kvp_event_stored_add(&p->events, h, p->extra_buf, elen);
		kvp_event_stored_end(&p->events);
	}
	if (!already)
		p->stats.blocks_stored++;
	if (stored != NULL)
		*stored = !already;
	return KVP_OK;
}

int
kvp_pool_move_block_hashes(struct kvp_pool *p, int32_t src, int32_t dst)
{
	uint8_t key[MAX_KEY];
	size_t len = 0;
	const uint8_t *k;

	if (p == NULL)
		return KVP_EINVAL;
	if (src < 0 || (uint32_t)src >= p->n || dst < 0 || (uint32_t)dst >= p->n)
		return KVP_ERANGE;
	if ((k = kvp_map_key(&p->map, src, &len)) == NULL)
		return KVP_OK; /* nothing to move */
	if (dst == KVP_NULL_BLOCK || dst == src)
		return KVP_EINVAL;
	if (kvp_map_has_id(&p->map, dst) || p->blocks[dst].ref_cnt == 0 ||
	    (p->num_pending != 0 && kvp_map_has_id(&p->pending, dst)))
		return KVP_ESTATE;
	/* The primary first, then each extra slot, re-inserted at its key's tail as vLLM's pop + insert. */
	memcpy(key, k, len);
	kvp_map__remove_id(&p->map, src);
	(void)kvp_map_insert(&p->map, key, len, dst);
	if (p->on_unkey)
		p->on_unkey(p->on_unkey_ctx, src);
	p->htok[dst] = p->htok[src];
	p->htok[src] = 0;
	if (p->num_extra != 0) {
		for (int32_t s = p->xhead[src]; s >= 0; s = p->xnext[s]) {
			int32_t mid = (int32_t)p->n + s;
			k = kvp_map_key(&p->map, mid, &len);
			memcpy(key, k, len);
			kvp_map__remove_id(&p->map, mid);
			(void)kvp_map_insert(&p->map, key, len, mid);
			p->xowner[s] = dst;
		}
		p->xhead[dst] = p->xhead[src];
		p->xhead[src] = -1;
	}
	return KVP_OK;
}

uint32_t
kvp_pool_block_hash_tokens(const struct kvp_pool *p, int32_t id)
{
	if (p == NULL || id < 0 || (uint32_t)id >= p->n || !kvp_map_has_id(&p->map, id))
		return 0;
	return p->htok[id] & ~HTOK_PARTIAL;
}

const uint8_t *
kvp_pool_block_key_at(const struct kvp_pool *p, int32_t id, size_t i, size_t *len)
{
	if (p == NULL || len == NULL || id < 0 || (uint32_t)id >= p->n)
		return NULL;
	if (i == 0)
		return kvp_map_key(&p->map, id, len);
	if (p->num_extra == 0)
		return NULL;
	int32_t s = p->xhead[id];
	while (s >= 0 && --i > 0)
		s = p->xnext[s];
	return s < 0 ? NULL : kvp_map_key(&p->map, (int32_t)p->n + s, len);
}

uint32_t
kvp_pool_num_partial_keys(const struct kvp_pool *p)
{
	return p == NULL ? 0 : p->num_extra;
}
