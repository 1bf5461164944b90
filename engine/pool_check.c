/* SPDX-License-Identifier: Apache-2.0 */
/* pool_check.c: the pool's introspection and invariant check (tests, the admin server). */
#include <stdio.h>

#include "common/kvp_status.h"
#include "engine/pool_impl.h"

/* ---- observers ---- */

uint32_t
kvp_pool_num_blocks(const struct kvp_pool *p)
{
	return p->n;
}

uint32_t
kvp_pool_num_free(const struct kvp_pool *p)
{
	return p->queue.num_free;
}

double
kvp_pool_usage(const struct kvp_pool *p)
{
	if (p->n <= 1)
		return 0.0;
	return 1.0 - (double)p->queue.num_free / (double)(p->n - 1);
}

uint32_t
kvp_pool_num_cached_keys(const struct kvp_pool *p)
{
	return p->map.num_keys;
}

uint32_t
kvp_pool_num_cached_blocks(const struct kvp_pool *p)
{
	return p->num_hashed;
}

int32_t
kvp_pool_ref_cnt(const struct kvp_pool *p, int32_t id)
{
	if (id < 0 || (uint32_t)id >= p->n)
		return -1;
	return p->blocks[id].ref_cnt;
}

const uint8_t *
kvp_pool_block_key(const struct kvp_pool *p, int32_t id, size_t *len)
{
	if (id < 0 || (uint32_t)id >= p->n || len == NULL)
		return NULL;
	return kvp_map_key(&p->map, id, len);
}

uint32_t
kvp_pool_hash_block_size(const struct kvp_pool *p)
{
	return p->hash_block_size;
}

uint32_t
kvp_pool_hash_len(const struct kvp_pool *p)
{
	return p->hash_len;
}

uint32_t
kvp_pool_max_hash_len(const struct kvp_pool *p)
{
	return p->max_hash_len;
}

bool
kvp_pool_caching_enabled(const struct kvp_pool *p)
{
	return p->caching;
}

void
kvp_pool_get_stats(const struct kvp_pool *p, struct kvp_pool_stats *out)
{
	*out = p->stats;
}

size_t
kvp_pool_free_queue(const struct kvp_pool *p, int32_t *out, size_t cap)
{
	size_t n = 0;

	for (int32_t id = kvp_queue_first(&p->queue); id >= 0 && n < cap;
	     id = kvp_queue_next(&p->queue, id))
		out[n++] = id;
	return n;
}

int
kvp_pool_free_queue_page(const struct kvp_pool *p, int32_t after, int32_t *out, size_t cap,
                         size_t *n, bool *more)
{
	if (p == NULL || n == NULL || more == NULL || (out == NULL && cap > 0) || after < 0 ||
	    (uint32_t)after >= p->n)
		return KVP_EINVAL;
	if (after > 0 && (p->blocks[after].ref_cnt != 0))
		return KVP_ENOTFOUND;
	int32_t id = after > 0 ? kvp_queue_next(&p->queue, after) : kvp_queue_first(&p->queue);
	size_t k = 0;
	for (; id >= 0 && k < cap; id = kvp_queue_next(&p->queue, id))
		out[k++] = id;
	*n = k;
	*more = id >= 0;
	return KVP_OK;
}

size_t
kvp_pool_metadata_bytes(const struct kvp_pool *p, size_t *map_bytes)
{
	const struct kvp_map *m = &p->map;

	if (map_bytes != NULL)
		*map_bytes = ((size_t)m->mask + 1) * sizeof(*m->buckets) +
		             (size_t)m->num_ids * m->max_key_len;
	return ((size_t)p->n + 2) * sizeof(*p->blocks) + (size_t)p->n * sizeof(*p->scratch) +
	       (size_t)p->n * sizeof(*p->htok) + (p->xowner ? (size_t)p->n * 3 * sizeof(int32_t) : 0) +
	       (size_t)m->num_ids * sizeof(*m->ent);
}

#define FAIL(...)                                                     \
	do {                                                          \
		if (detail != NULL && detail_len > 0)                 \
			snprintf(detail, detail_len, __VA_ARGS__);    \
		return KVP_EINTERNAL;                                 \
	} while (0)

int
kvp_pool_check(const struct kvp_pool *p, char *detail, size_t detail_len)
{
	const struct kvp_block *b = p->blocks;
	uint32_t queued = 0, hashed = 0;
	int32_t prev = p->queue.head;

	/* Walk the queue: links agree both ways, members are free and non-null. */
	for (int32_t id = b[p->queue.head].next; id != p->queue.tail; id = b[id].next) {
		if (id < 0 || (uint32_t)id >= p->n)
			FAIL("queue link %d out of range", id);
		if (id == KVP_NULL_BLOCK)
			FAIL("null block is in the free queue");
		if (b[id].prev != prev)
			FAIL("block %d: prev %d, expected %d", id, b[id].prev, prev);
		if (b[id].ref_cnt != 0)
			FAIL("queued block %d has ref_cnt %d", id, b[id].ref_cnt);
		if (++queued > p->n)
			FAIL("free queue has a cycle");
		prev = id;
	}
	if (b[p->queue.tail].prev != prev)
		FAIL("tail.prev %d, expected %d", b[p->queue.tail].prev, prev);
	if (queued != p->queue.num_free)
		FAIL("queue holds %u blocks, count says %u", queued, p->queue.num_free);
	if (b[KVP_NULL_BLOCK].ref_cnt != 0)
		FAIL("null block ref_cnt %d", b[KVP_NULL_BLOCK].ref_cnt);
	if (kvp_map_has_id(&p->map, KVP_NULL_BLOCK))
		FAIL("null block has a hash");
	for (uint32_t i = 1; i < p->n; i++) {
		int32_t id = (int32_t)i;
		size_t len = 0;
		const uint8_t *key;
		if (b[i].ref_cnt < 0)
			FAIL("block %u ref_cnt %d", i, b[i].ref_cnt);
		if ((b[i].ref_cnt == 0) != (kvp_queue_contains(&p->queue, id) != 0))
			FAIL("block %u: ref_cnt %d but %s the queue", i, b[i].ref_cnt,
			     kvp_queue_contains(&p->queue, id) ? "in" : "not in");
		if ((key = kvp_map_key(&p->map, id, &len)) != NULL) {
			int32_t head;
			hashed++;
			if (len < GROUP_LEN + 1)
				FAIL("block %u key too short", i);
			if (p->map.ent[i].hash != kvp_map_hash(&p->map, key, len))
				FAIL("block %u: stored key hash is stale", i);
			head = kvp_map_lookup(&p->map, key, len);
			if (head < 0)
				FAIL("block %u has a hash that is not in the map", i);
			int found = 0;
			for (int32_t j = head; j >= 0; j = kvp_map_next_same_key(&p->map, j))
				if (j == id)
					found = 1;
			if (!found)
				FAIL("block %u is not under its own key", i);
		}
	}
	/* Extra keys: each slot in use belongs to a hashed block's list and is under its key. */
	uint32_t extras = 0;
	for (uint32_t s = 0; p->xowner != NULL && s < p->n; s++) {
		int32_t own = p->xowner[s], mid = (int32_t)(p->n + s);
		size_t len = 0;
		const uint8_t *key = kvp_map_key(&p->map, mid, &len);
		if (own < 0) {
			if (key != NULL)
				FAIL("free extra slot %u is in the map", s);
			continue;
		}
		extras++;
		if ((uint32_t)own >= p->n || own == KVP_NULL_BLOCK || !kvp_map_has_id(&p->map, own))
			FAIL("extra slot %u belongs to block %d, which has no primary key", s, own);
		if (key == NULL)
			FAIL("extra slot %u of block %d is not in the map", s, own);
		int on_list = 0, under = 0;
		for (int32_t t = p->xhead[own]; t >= 0 && !on_list; t = p->xnext[t])
			on_list = t == (int32_t)s;
		for (int32_t j = kvp_map_lookup(&p->map, key, len); j >= 0;
		     j = kvp_map_next_same_key(&p->map, j))
			under |= j == mid;
		if (!on_list || !under)
			FAIL("extra slot %u of block %d is %s", s, own,
			     on_list ? "not under its key" : "not on its block's list");
	}
	if (extras != p->num_extra)
		FAIL("%u extra keys, count says %u", extras, p->num_extra);
	if (hashed != p->num_hashed)
		FAIL("%u hashed blocks, count says %u", hashed, p->num_hashed);
	/* Each key's chain head is a distinct key: count heads. */
	uint32_t keys = 0;
	for (uint64_t i = 0; i <= p->map.mask; i++)
		if (p->map.buckets[i] != 0)
			keys++;
	if (keys != p->map.num_keys)
		FAIL("map has %u keys, count says %u", keys, p->map.num_keys);
	if (!p->caching && hashed != 0)
		FAIL("caching is off but %u blocks are hashed", hashed);
	/* A reserved block is held, not cached, and found under its pending key. */
	uint32_t pending = 0;
	for (uint32_t i = 0; p->pending_on && i < p->n; i++) {
		size_t len = 0;
		const uint8_t *key = kvp_map_key(&p->pending, (int32_t)i, &len);
		if (key == NULL)
			continue;
		pending++;
		if (p->blocks[i].ref_cnt <= 0 || i == KVP_NULL_BLOCK)
			FAIL("reserved block %u has ref count %d", i, p->blocks[i].ref_cnt);
		if (kvp_map_has_id(&p->map, (int32_t)i))
			FAIL("reserved block %u is also cached", i);
		if (kvp_map_lookup(&p->pending, key, len) != (int32_t)i)
			FAIL("reserved block %u is not under its pending key", i);
	}
	if (pending != p->num_pending)
		FAIL("%u reserved blocks, count says %u", pending, p->num_pending);
	return KVP_OK;
}
