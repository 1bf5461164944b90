/* SPDX-License-Identifier: Apache-2.0 */
#include "clients/c/kvindex.h"

#include <stdlib.h>
#include <string.h>

#include "common/map_key.h"

struct slot {
	uint8_t *key;    /* hash bytes, then 4 bytes of group; NULL: empty */
	uint32_t len;    /* key length */
	uint32_t count;
	uint64_t h;
};

struct kvp_index {
	struct slot *slots;
	size_t cap, used;     /* used counts live entries and tombstones */
	size_t live;
};

#define TOMBSTONE ((uint8_t *)&tombstone_marker)
static const uint8_t tombstone_marker = 0;

static uint64_t
hash_key(const uint8_t *k, size_t len)
{
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < len; i++)
		h = (h ^ k[i]) * 1099511628211ull;
	return h ^ (h >> 29);
}

int
kvp_index_create(struct kvp_index **out)
{
	struct kvp_index *ix = calloc(1, sizeof(*ix));
	if (out == NULL || ix == NULL) {
		free(ix);
		return out ? KVP_ENOMEM : KVP_EINVAL;
	}
	*out = ix;
	return KVP_OK;
}

static void
clear(struct kvp_index *ix)
{
	for (size_t i = 0; i < ix->cap; i++)
		if (ix->slots[i].key && ix->slots[i].key != TOMBSTONE)
			free(ix->slots[i].key);
	free(ix->slots);
	ix->slots = NULL;
	ix->cap = ix->used = ix->live = 0;
}

void
kvp_index_destroy(struct kvp_index *ix)
{
	if (ix == NULL)
		return;
	clear(ix);
	free(ix);
}

/* The slot holding key, or (insert) the slot to put it in; NULL if absent (lookup). */
static struct slot *
find(const struct kvp_index *ix, const uint8_t *key, size_t len, uint64_t h, bool insert)
{
	struct slot *grave = NULL;
	if (ix->cap == 0)
		return NULL;
	for (size_t i = h & (ix->cap - 1);; i = (i + 1) & (ix->cap - 1)) {
		struct slot *s = &ix->slots[i];
		if (s->key == NULL)
			return insert ? (grave ? grave : s) : NULL;
		if (s->key == TOMBSTONE) {
			if (grave == NULL)
				grave = s;
			continue;
		}
		if (s->h == h && s->len == len && memcmp(s->key, key, len) == 0)
			return s;
	}
}

static int
grow(struct kvp_index *ix)
{
	size_t cap = ix->cap ? ix->cap * 2 : 64;
	struct slot *old = ix->slots, *ns = calloc(cap, sizeof(*ns));
	size_t oldcap = ix->cap;
	if (ns == NULL)
		return KVP_ENOMEM;
	ix->slots = ns;
	ix->cap = cap;
	ix->used = ix->live;
	for (size_t i = 0; i < oldcap; i++) {
		if (old[i].key == NULL || old[i].key == TOMBSTONE)
			continue;
		*find(ix, old[i].key, old[i].len, old[i].h, true) = old[i];
	}
	free(old);
	return KVP_OK;
}

static int
add(struct kvp_index *ix, const uint8_t *hash, size_t hl, uint32_t group, int32_t delta)
{
	uint8_t key[1024 + 4];
	if (hl > 1024)
		return KVP_EINVAL;
	size_t len = kvp_map_key_make(key, hash, hl, group);
	uint64_t h = hash_key(key, len);
	if ((ix->used + 1) * 2 > ix->cap && grow(ix) != KVP_OK)
		return KVP_ENOMEM;
	struct slot *s = find(ix, key, len, h, true);
	if (s->key == NULL || s->key == TOMBSTONE) {
		if (delta < 0)
			return KVP_ESTATE;
		uint8_t *k = malloc(len);
		if (k == NULL)
			return KVP_ENOMEM;
		memcpy(k, key, len);
		if (s->key == NULL)
			ix->used++;
		s->key = k;
		s->len = (uint32_t)len;
		s->count = 0;
		s->h = h;
		ix->live++;
	}
	if (delta < 0 && s->count < (uint32_t)-delta)
		return KVP_ESTATE;
	s->count += (uint32_t)delta;
	if (s->count == 0) {
		free(s->key);
		s->key = TOMBSTONE;
		ix->live--;
	}
	return KVP_OK;
}

int
kvp_index_reset(struct kvp_index *ix, const struct kvp_snapshot_entry *e, size_t n)
{
	if (ix == NULL || (e == NULL && n > 0))
		return KVP_EINVAL;
	clear(ix);
	for (size_t i = 0; i < n; i++) {
		int rv = add(ix, e[i].hash, e[i].hash_len, e[i].group_idx, (int32_t)e[i].num_blocks);
		if (rv != KVP_OK)
			return rv;
	}
	return KVP_OK;
}

int
kvp_index_apply(struct kvp_index *ix, const struct kvp_event_batch *b)
{
	int result = KVP_OK;
	if (ix == NULL || b == NULL)
		return KVP_EINVAL;
	for (size_t i = 0; i < kvp_event_batch_count(b); i++) {
		struct kvp_event ev;
		(void)kvp_event_batch_get(b, i, &ev);
		if (ev.type == KVP_EVENT_ALL_CLEARED) {
			clear(ix);
			continue;
		}
		int32_t delta = ev.type == KVP_EVENT_BLOCK_STORED ? 1 : -1;
		for (uint32_t h = 0; h < ev.num_hashes; h++) {
			int rv = add(ix, ev.hashes + (size_t)h * ev.hash_len, ev.hash_len, ev.group_idx, delta);
			if (rv == KVP_ENOMEM)
				return rv;
			if (rv != KVP_OK)
				result = rv;
		}
	}
	return result;
}

uint32_t
kvp_index_count(const struct kvp_index *ix, const uint8_t *hash, size_t len, uint32_t group)
{
	uint8_t key[1024 + 4];
	if (ix == NULL || hash == NULL || len > 1024)
		return 0;
	size_t klen = kvp_map_key_make(key, hash, len, group);
	const struct slot *s = find(ix, key, klen, hash_key(key, klen), false);
	return s ? s->count : 0;
}

size_t
kvp_index_size(const struct kvp_index *ix)
{
	return ix ? ix->live : 0;
}

size_t
kvp_index_prefix(const struct kvp_index *ix, const uint8_t *hashes, size_t n, size_t len,
                 uint32_t group)
{
	size_t i = 0;
	while (i < n && kvp_index_count(ix, hashes + i * len, len, group) > 0)
		i++;
	return i;
}

bool
kvp_index_equals(const struct kvp_index *ix, const struct kvp_snapshot_entry *e, size_t n)
{
	if (ix == NULL || kvp_index_size(ix) != n)
		return false;
	for (size_t i = 0; i < n; i++)
		if (kvp_index_count(ix, e[i].hash, e[i].hash_len, e[i].group_idx) != e[i].num_blocks)
			return false;
	return true;
}
