/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A block's keys beyond the map's own bookkeeping (pool_impl.h): its
 * partial entries (vLLM 0.33's cached_block_hashes_by_block), a keyed
 * store's pending reservations, and the scratch for stored blocks' extra
 * keys. Beneath pool.c, pool_keyed.c and pool_partial.c, which all use it
 * and none of which it uses, so the three no longer call each other in a
 * circle.
 */
#include <stdlib.h>
#include <string.h>

#include "common/kvp_status.h"
#include "engine/pool_impl.h"

uint32_t
kvp_pool__num_extras(const struct kvp_pool *p, int32_t id)
{
	uint32_t k = 0;

	if (p->num_extra == 0)
		return 0;
	for (int32_t s = p->xhead[id]; s >= 0; s = p->xnext[s])
		k++;
	return k;
}

void
kvp_pool__drop_extras(struct kvp_pool *p, int32_t id)
{
	int32_t s, nx;

	if (p->num_extra == 0)
		return;
	for (s = p->xhead[id]; s >= 0; s = nx) {
		int32_t mid = (int32_t)p->n + s;
		size_t len = 0;
		const uint8_t *key = kvp_map_key(&p->map, mid, &len);
		if (p->events_on)
			kvp_event_append_removed(&p->events, key, len - GROUP_LEN, p->medium,
			                         kvp_map_key_group(key, len));
		kvp_map__remove_id(&p->map, mid);
		nx = p->xnext[s];
		p->xowner[s] = -1;
		p->xnext[s] = p->xfree;
		p->xfree = s;
		p->num_extra--;
		p->stats.blocks_evicted++;
	}
	p->xhead[id] = -1;
}

void
kvp_pool__clear_extras(struct kvp_pool *p)
{
	if (p->xowner == NULL)
		return;
	for (uint32_t i = 0; i < p->n; i++) {
		p->xowner[i] = -1;
		p->xnext[i] = i + 1 < p->n ? (int32_t)i + 1 : -1;
		p->xhead[i] = -1;
	}
	p->xfree = 0;
	p->num_extra = 0;
}

void
kvp_pool__drop_all(struct kvp_pool *p, int32_t id)
{
	size_t len = 0;
	const uint8_t *key = kvp_map_key(&p->map, id, &len);

	if (key == NULL)
		return;
	if (p->events_on)
		kvp_event_append_removed(&p->events, key, len - GROUP_LEN, p->medium,
		                         kvp_map_key_group(key, len));
	kvp_map__remove_id(&p->map, id);
	p->num_hashed--;
	p->htok[id] = 0;
	p->stats.blocks_evicted++;
	if (p->on_unkey)
		p->on_unkey(p->on_unkey_ctx, id);
	kvp_pool__drop_extras(p, id);
}

void
kvp_pool__drop_pending(struct kvp_pool *p, int32_t id)
{
	kvp_map_remove_id(&p->pending, id);
	p->num_pending--;
}

int
kvp_pool__extra_room(struct kvp_pool *p, const struct kvp_request_keys *k)
{
	size_t per = kvp_extra_keys_max_len(k);
	if (per <= p->extra_cap)
		return KVP_OK;
	uint8_t *nb = realloc(p->extra_buf, per);
	if (nb == NULL)
		return KVP_ENOMEM;
	p->extra_buf = nb;
	p->extra_cap = per;
	return KVP_OK;
}

void
kvp_pool__token_window(const struct kvp_cache_args *a, size_t *t0, size_t *t1)
{
	size_t w0 = *t0 > a->first_token ? *t0 - a->first_token : 0;
	size_t w1 = *t1 > a->first_token ? *t1 - a->first_token : 0;
	*t0 = w0 < a->num_tokens ? w0 : a->num_tokens;
	*t1 = w1 < a->num_tokens ? w1 : a->num_tokens;
}
