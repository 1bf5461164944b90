/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Two-phase stores by key (pool.h, "Keyed stores"): a block reserved for a
 * key is allocated like any other (popped from the free queue's head,
 * evicting its old hash) and held by its reserver, but its key sits in a
 * second map, the pending one, so lookups, snapshots and events do not see
 * it until commit moves the key into the prefix-cache map.
 */
#include <stdlib.h>
#include <string.h>

#include "common/kvp_status.h"
#include "engine/pool_impl.h"

/* The pending map is made on first use: pools that never reserve pay nothing. */
static int
pending_init(struct kvp_pool *p)
{
	if (p->pending_on)
		return KVP_OK;
	int rv = kvp_map_init(&p->pending, p->n, p->max_hash_len + GROUP_LEN);
	if (rv == KVP_OK)
		p->pending_on = true;
	return rv;
}

static bool
key_ok(const struct kvp_pool *p, size_t key_len)
{
	return key_len > GROUP_LEN && key_len - GROUP_LEN <= p->max_hash_len;
}

int32_t
kvp_pool_pending_block(const struct kvp_pool *p, const uint8_t *key, size_t key_len)
{
	if (p == NULL || key == NULL || !p->pending_on || !key_ok(p, key_len))
		return -1;
	return kvp_map_lookup(&p->pending, key, key_len);
}

uint32_t
kvp_pool_num_pending(const struct kvp_pool *p)
{
	return p ? p->num_pending : 0;
}

bool
kvp_pool_is_pending(const struct kvp_pool *p, int32_t id)
{
	return p != NULL && p->pending_on && id > 0 && (uint32_t)id < p->n &&
	       kvp_map_has_id(&p->pending, id);
}

/* Index of an earlier key equal to key i in a small open-addressing set of call positions. */
static bool
seen_before(const uint8_t *keys, size_t key_len, size_t i, int32_t *set, size_t mask)
{
	const uint8_t *k = keys + i * key_len;
	uint64_t h = 1469598103934665603ull;
	for (size_t j = 0; j < key_len; j++)
		h = (h ^ k[j]) * 1099511628211ull;
	for (size_t s = (size_t)h & mask;; s = (s + 1) & mask) {
		if (set[s] < 0) {
			set[s] = (int32_t)i;
			return false;
		}
		if (memcmp(keys + (size_t)set[s] * key_len, k, key_len) == 0)
			return true;
	}
}

/* An empty set for seen_before over n keys (mask in *mask), or NULL. */
static int32_t *
key_set(size_t n, size_t *mask)
{
	size_t cap = 16;
	while (cap < 2 * n)
		cap *= 2;
	int32_t *set = malloc(cap * sizeof(*set));
	if (set != NULL)
		memset(set, 0xff, cap * sizeof(*set));
	*mask = cap - 1;
	return set;
}

/* A fresh mark for duplicate checks (as next_stamp() in pool.c): clears all marks on wrap. */
static uint32_t
fresh_mark(struct kvp_pool *p)
{
	if (++p->stamp == 0) {
		for (uint32_t i = 0; i < p->n; i++)
			p->blocks[i].mark = 0;
		p->stamp = 1;
	}
	return p->stamp;
}

int
kvp_pool_reserve(struct kvp_pool *p, const uint8_t *keys, size_t key_len, size_t n,
                 int32_t *ids, uint8_t *evicted, size_t *num_evicted)
{
	size_t need = 0, mask = 0, ne = 0;
	int32_t *set;
	int rv;

	if (p == NULL || (n > 0 && (keys == NULL || ids == NULL)) || !key_ok(p, key_len) ||
	    n > p->n)
		return KVP_EINVAL;
	if (!p->caching)
		return KVP_ENOTSUP;
	if ((rv = pending_init(p)) != KVP_OK)
		return rv;
	if ((set = key_set(n, &mask)) == NULL)
		return KVP_ENOMEM;
	/* Which keys need a block: neither cached, nor pending, nor named earlier in the call. */
	for (size_t i = 0; i < n; i++) {
		const uint8_t *k = keys + i * key_len;
		if (kvp_map_lookup(&p->map, k, key_len) >= 0 ||
		    kvp_map_lookup(&p->pending, k, key_len) >= 0 ||
		    seen_before(keys, key_len, i, set, mask)) {
			ids[i] = -1;
			continue;
		}
		ids[i] = 0; /* to be given one */
		need++;
	}
	free(set);
	if (need > p->queue.num_free) {
		p->stats.alloc_failures++;
		for (size_t i = 0; i < n; i++)
			ids[i] = -1;
		return KVP_ENOSPACE;
	}
	/* The blocks get_new_blocks will pop are the queue's first `need`: note their keys. */
	if (evicted != NULL) {
		int32_t cur = p->blocks[p->queue.head].next;
		for (size_t i = 0; i < need; i++, cur = p->blocks[cur].next) {
			size_t len;
			const uint8_t *k = kvp_map_key(&p->map, cur, &len);
			if (k != NULL && len == key_len)
				memcpy(evicted + ne++ * key_len, k, key_len);
		}
	}
	if ((rv = kvp_pool_get_new_blocks(p, (uint32_t)need, p->scratch)) != KVP_OK) {
		for (size_t i = 0; i < n; i++)
			ids[i] = -1;
		return rv;
	}
	for (size_t i = 0, j = 0; i < n; i++) {
		if (ids[i] < 0)
			continue;
		ids[i] = p->scratch[j++];
		/* cannot fail: the key fits, the id is in range and was just popped, so unmapped */
		kvp_map_insert(&p->pending, keys + i * key_len, key_len, ids[i]);
	}
	p->num_pending += (uint32_t)need;
	if (num_evicted != NULL)
		*num_evicted = ne;
	return KVP_OK;
}

/* Every id a distinct pending block: KVP_OK, or the call's status. */
static int
check_pending(struct kvp_pool *p, const int32_t *ids, size_t n)
{
	uint32_t mark;
	if (p == NULL || (ids == NULL && n > 0))
		return KVP_EINVAL;
	for (size_t i = 0; i < n; i++)
		if (ids[i] <= 0 || (uint32_t)ids[i] >= p->n)
			return KVP_ERANGE;
	mark = fresh_mark(p);
	for (size_t i = 0; i < n; i++) {
		if (p->blocks[ids[i]].mark == mark)
			return KVP_EINVAL;
		p->blocks[ids[i]].mark = mark;
		if (!kvp_pool_is_pending(p, ids[i]))
			return KVP_ESTATE;
	}
	return KVP_OK;
}

/* A pending block's key length and group (the block is known to be pending). */
static size_t
pkey_len(const struct kvp_pool *p, int32_t id)
{
	return p->pending.ent[id].len;
}

static uint32_t
pkey_group(const struct kvp_pool *p, int32_t id)
{
	return kvp_map_key_group(p->pending.keys + (size_t)id * p->pending.max_key_len,
	                         pkey_len(p, id));
}

/* The end of the run of ids from i whose keys share i's group and length. */
static size_t
run_end(const struct kvp_pool *p, const int32_t *ids, size_t n, size_t i)
{
	size_t j = i + 1;
	while (j < n && pkey_len(p, ids[j]) == pkey_len(p, ids[i]) &&
	       pkey_group(p, ids[j]) == pkey_group(p, ids[i]))
		j++;
	return j;
}

int
kvp_pool_commit(struct kvp_pool *p, const int32_t *ids, size_t n, const uint32_t *block_sizes,
                size_t num_groups)
{
	int rv;

	if ((rv = check_pending(p, ids, n)) != KVP_OK)
		return rv;
	/* One BlockStored per run of keys of one group and length, in the order given. */
	if (p->events_on && n > 0) {
		size_t runs = 0, bytes = 0;
		for (size_t i = 0, j; i < n; i = j) {
			j = run_end(p, ids, n, i);
			runs++;
			bytes += kvp_event_stored_bytes(j - i, pkey_len(p, ids[i]) - GROUP_LEN, false, 0,
			                                NULL, NULL, p->medium, j - i);
		}
		if ((rv = kvp_event_batch_reserve(&p->events, runs, bytes)) != KVP_OK)
			return rv;
		static const uint8_t none_cbor = 0xf6; /* no extra keys, as vLLM's placeholders */
		for (size_t i = 0, j; i < n; i = j) {
			j = run_end(p, ids, n, i);
			uint32_t g = pkey_group(p, ids[i]);
			struct kvp_stored_desc d = {
				.hash_len = pkey_len(p, ids[i]) - GROUP_LEN,
				.block_size = g < num_groups && block_sizes ? block_sizes[g] : 0,
				.medium = p->medium,
				.group_idx = g,
				.max_hashes = j - i,
			};
			kvp_event_stored_begin(&p->events, &d);
			for (size_t m = i; m < j; m++)
				kvp_event_stored_add(&p->events, p->pending.keys +
				                     (size_t)ids[m] * p->pending.max_key_len, &none_cbor, 1);
			kvp_event_stored_end(&p->events);
		}
	}
	for (size_t i = 0; i < n; i++) {
		size_t len = pkey_len(p, ids[i]);
		uint8_t key[MAX_KEY];
		memcpy(key, p->pending.keys + (size_t)ids[i] * p->pending.max_key_len, len);
		kvp_map_remove_id(&p->pending, ids[i]);
		kvp_map_insert(&p->map, key, len, ids[i]);
		p->htok[ids[i]] = 0; /* an offload key: no token count */
	}
	p->num_pending -= (uint32_t)n;
	p->num_hashed += (uint32_t)n;
	p->stats.blocks_stored += n;
	/* The reserver's reference goes: cached and free, the LRU's newest. */
	return kvp_pool_free_blocks(p, ids, n);
}

int
kvp_pool_abort(struct kvp_pool *p, const int32_t *ids, size_t n)
{
	int rv;
	if ((rv = check_pending(p, ids, n)) != KVP_OK)
		return rv;
	for (size_t i = 0; i < n; i++)
		kvp_map_remove_id(&p->pending, ids[i]);
	p->num_pending -= (uint32_t)n;
	return kvp_pool_free_blocks(p, ids, n);
}

void
kvp_pool_set_unkey_hook(struct kvp_pool *p, void (*fn)(void *ctx, int32_t id), void *ctx)
{
	if (p == NULL)
		return;
	p->on_unkey = fn;
	p->on_unkey_ctx = fn ? ctx : NULL;
}

/* Every block free and keyless, every key new, none twice: KVP_OK or the status. */
static int
check_adoptable(struct kvp_pool *p, const uint8_t *keys, size_t key_len, const int32_t *ids,
                size_t n)
{
	uint32_t mark = fresh_mark(p);
	for (size_t i = 0; i < n; i++) {
		int32_t id = ids[i];
		if (id <= 0 || (uint32_t)id >= p->n)
			return KVP_ERANGE;
		if (p->blocks[id].mark == mark)
			return KVP_EINVAL;
		p->blocks[id].mark = mark;
		if (p->blocks[id].ref_cnt != 0 || kvp_map_has_id(&p->map, id) ||
		    kvp_map_has_id(&p->pending, id))
			return KVP_ESTATE;
		const uint8_t *k = keys + i * key_len;
		if (kvp_map_lookup(&p->map, k, key_len) >= 0 ||
		    kvp_map_lookup(&p->pending, k, key_len) >= 0)
			return KVP_ESTATE;
	}
	return KVP_OK;
}

int
kvp_pool_adopt(struct kvp_pool *p, const uint8_t *keys, size_t key_len, const int32_t *ids,
               size_t n, const uint32_t *block_sizes, size_t num_groups)
{
	int32_t *set;
	size_t mask;
	int rv;

	if (p == NULL || (n > 0 && (keys == NULL || ids == NULL)) || !key_ok(p, key_len) ||
	    n >= p->n)
		return KVP_EINVAL;
	if (!p->caching)
		return KVP_ENOTSUP;
	if (n == 0)
		return KVP_OK;
	if ((rv = pending_init(p)) != KVP_OK || (rv = check_adoptable(p, keys, key_len, ids, n)))
		return rv;
	if ((set = key_set(n, &mask)) == NULL)
		return KVP_ENOMEM;
	for (size_t i = 0; i < n && rv == KVP_OK; i++)
		if (seen_before(keys, key_len, i, set, mask))
			rv = KVP_EINVAL;
	free(set);
	if (rv != KVP_OK)
		return rv;
	/* Held as reserve holds them, then committed: commit's events and LRU order. */
	if ((rv = kvp_pool_touch(p, ids, n)) != KVP_OK)
		return rv;
	for (size_t i = 0; i < n; i++)
		kvp_map_insert(&p->pending, keys + i * key_len, key_len, ids[i]);
	p->num_pending += (uint32_t)n;
	if ((rv = kvp_pool_commit(p, ids, n, block_sizes, num_groups)) != KVP_OK)
		(void)kvp_pool_abort(p, ids, n); /* events out of memory: as before, uncached */
	return rv;
}

int
kvp_pool_announce(struct kvp_pool *p, bool stored, const uint8_t *keys, size_t key_len, size_t n,
                  const char *medium, const uint32_t *block_sizes, size_t num_groups)
{
	if (p == NULL || (keys == NULL && n > 0) || medium == NULL || medium[0] == '\0' ||
	    strlen(medium) >= sizeof(p->medium) || key_len <= GROUP_LEN || key_len > MAX_KEY)
		return KVP_EINVAL;
	if (!p->events_on || n == 0)
		return KVP_OK;
	const size_t hl = key_len - GROUP_LEN;
	size_t runs = 0, bytes = 0;
	for (size_t i = 0, j; i < n; i = j) {
		uint32_t g = kvp_map_key_group(keys + i * key_len, key_len);
		for (j = i + 1; stored && j < n && kvp_map_key_group(keys + j * key_len, key_len) == g;)
			j++;
		runs++;
		bytes += stored ? kvp_event_stored_bytes(j - i, hl, false, 0, NULL, NULL, medium, j - i)
		                : kvp_event_removed_bytes(hl, medium);
	}
	int rv = kvp_event_batch_reserve(&p->events, runs, bytes);
	if (rv != KVP_OK)
		return rv;
	static const uint8_t none_cbor = 0xf6; /* no extra keys, as commit's */
	for (size_t i = 0, j; i < n; i = j) {
		const uint8_t *k = keys + i * key_len;
		uint32_t g = kvp_map_key_group(k, key_len);
		if (!stored) {
			kvp_event_append_removed(&p->events, k, hl, medium, g);
			j = i + 1;
			continue;
		}
		for (j = i + 1; j < n && kvp_map_key_group(keys + j * key_len, key_len) == g;)
			j++;
		struct kvp_stored_desc d = {
			.hash_len = hl,
			.block_size = g < num_groups && block_sizes ? block_sizes[g] : 0,
			.medium = medium,
			.group_idx = g,
			.max_hashes = j - i,
		};
		kvp_event_stored_begin(&p->events, &d);
		for (size_t m = i; m < j; m++)
			kvp_event_stored_add(&p->events, keys + m * key_len, &none_cbor, 1);
		kvp_event_stored_end(&p->events);
	}
	return KVP_OK;
}
