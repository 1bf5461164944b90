#include "hash_map.h"

#include <stdlib.h>
#include <string.h>

#include "kvp_status.h"

#define EMPTY 0u

/*
 * Keys are mostly SHA-256 output (already uniform) followed by a small group
 * id, but tests and callers may pass short or patterned keys, so every byte
 * is mixed in.
 */
static uint32_t
key_hash(const uint8_t *k, size_t len)
{
	uint64_t h = 0x9e3779b97f4a7c15ull ^ (uint64_t)len;
	uint64_t w;

	while (len >= 8) {
		memcpy(&w, k, 8);
		h = (h ^ w) * 0xff51afd7ed558ccdull;
		h ^= h >> 32;
		k += 8;
		len -= 8;
	}
	w = 0;
	memcpy(&w, k, len);
	h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
	h ^= h >> 29;
	h *= 0x94d049bb133111ebull;
	h ^= h >> 32;
	return (uint32_t)h;
}

static inline uint64_t
bucket_make(uint32_t hash, int32_t head)
{
	return ((uint64_t)hash << 32) | (uint32_t)(head + 1);
}

static inline int32_t
bucket_head(uint64_t b)
{
	return (int32_t)(uint32_t)b - 1;
}

static inline uint32_t
bucket_hash(uint64_t b)
{
	return (uint32_t)(b >> 32);
}

static inline const uint8_t *
slot(const struct kvp_map *m, int32_t id)
{
	return m->keys + (size_t)id * m->max_key_len;
}

/* Returns the bucket index holding key, or -1. */
static int64_t
find_bucket(const struct kvp_map *m, const uint8_t *key, size_t len, uint32_t h)
{
	uint32_t i = h & m->mask;

	for (;;) {
		uint64_t b = m->buckets[i];
		if (b == EMPTY)
			return -1;
		if (bucket_hash(b) == h) {
			int32_t id = bucket_head(b);
			if (m->klen[id] == len && memcmp(slot(m, id), key, len) == 0)
				return i;
		}
		i = (i + 1) & m->mask;
	}
}

int
kvp_map_init(struct kvp_map *m, uint32_t num_ids, uint32_t max_key_len)
{
	uint64_t nb = 16;

	memset(m, 0, sizeof(*m));
	if (num_ids == 0 || num_ids > INT32_MAX - 2 || max_key_len == 0 ||
	    max_key_len > UINT16_MAX)
		return KVP_EINVAL;
	while (nb < 2ull * num_ids)
		nb <<= 1;
	if (nb > (1ull << 32))
		return KVP_EINVAL;
	/* calloc: zero pages are mapped lazily, so creation stays O(1)-ish. */
	m->buckets = calloc(nb, sizeof(*m->buckets));
	m->kprev = malloc((size_t)num_ids * sizeof(*m->kprev));
	m->knext = malloc((size_t)num_ids * sizeof(*m->knext));
	m->klen = calloc(num_ids, sizeof(*m->klen));
	m->keys = calloc(num_ids, max_key_len);
	if (!m->buckets || !m->kprev || !m->knext || !m->klen || !m->keys) {
		kvp_map_fini(m);
		return KVP_ENOMEM;
	}
	m->mask = (uint32_t)(nb - 1);
	m->num_ids = num_ids;
	m->max_key_len = max_key_len;
	return KVP_OK;
}

void
kvp_map_fini(struct kvp_map *m)
{
	free(m->buckets);
	free(m->kprev);
	free(m->knext);
	free(m->klen);
	free(m->keys);
	memset(m, 0, sizeof(*m));
}

int
kvp_map_insert(struct kvp_map *m, const uint8_t *key, size_t len, int32_t id)
{
	uint32_t h;
	int64_t bi;

	if (len == 0 || len > m->max_key_len || id < 0 || (uint32_t)id >= m->num_ids)
		return KVP_EINVAL;
	if (m->klen[id] != 0)
		return KVP_ESTATE;
	h = key_hash(key, len);
	bi = find_bucket(m, key, len, h);
	memcpy(m->keys + (size_t)id * m->max_key_len, key, len);
	m->klen[id] = (uint16_t)len;
	m->knext[id] = -1;
	if (bi >= 0) {
		int32_t head = bucket_head(m->buckets[bi]);
		int32_t tail = m->kprev[head];
		m->knext[tail] = id;
		m->kprev[id] = tail;
		m->kprev[head] = id;
	} else {
		uint32_t i = h & m->mask;
		while (m->buckets[i] != EMPTY)
			i = (i + 1) & m->mask;
		m->buckets[i] = bucket_make(h, id);
		m->kprev[id] = id;
		m->num_keys++;
	}
	return KVP_OK;
}

int32_t
kvp_map_lookup(const struct kvp_map *m, const uint8_t *key, size_t len)
{
	int64_t bi;

	if (len == 0 || len > m->max_key_len)
		return -1;
	bi = find_bucket(m, key, len, key_hash(key, len));
	return bi < 0 ? -1 : bucket_head(m->buckets[bi]);
}

/* Backward-shift deletion of bucket i (linear probing, no tombstones). */
static void
delete_bucket(struct kvp_map *m, uint32_t i)
{
	uint32_t j = i;

	for (;;) {
		j = (j + 1) & m->mask;
		uint64_t b = m->buckets[j];
		if (b == EMPTY)
			break;
		uint32_t home = bucket_hash(b) & m->mask;
		/* Move b back to i unless its home lies cyclically in (i, j]. */
		int stays = (i <= j) ? (home > i && home <= j) : (home > i || home <= j);
		if (!stays) {
			m->buckets[i] = b;
			i = j;
		}
	}
	m->buckets[i] = EMPTY;
	m->num_keys--;
}

/* Unlinks id (known to be under the key held by bucket bi). */
static void
unlink_id(struct kvp_map *m, uint32_t bi, int32_t id)
{
	int32_t head = bucket_head(m->buckets[bi]);
	int32_t tail = m->kprev[head];
	int32_t nx = m->knext[id];

	if (id == head) {
		if (nx < 0) {
			delete_bucket(m, bi);
		} else {
			m->kprev[nx] = tail;
			m->buckets[bi] = bucket_make(bucket_hash(m->buckets[bi]), nx);
		}
	} else {
		int32_t pv = m->kprev[id];
		m->knext[pv] = nx;
		if (nx >= 0)
			m->kprev[nx] = pv;
		else
			m->kprev[head] = pv; /* id was the tail */
	}
	m->klen[id] = 0;
}

int
kvp_map_pop(struct kvp_map *m, const uint8_t *key, size_t len, int32_t id)
{
	int64_t bi;

	if (id < 0 || (uint32_t)id >= m->num_ids || m->klen[id] != len ||
	    memcmp(slot(m, id), key, len) != 0)
		return 0;
	bi = find_bucket(m, key, len, key_hash(key, len));
	if (bi < 0)
		return 0; /* unreachable while the map is consistent */
	unlink_id(m, (uint32_t)bi, id);
	return 1;
}

int
kvp_map_remove_id(struct kvp_map *m, int32_t id)
{
	size_t len = m->klen[id];
	int64_t bi;

	if (len == 0)
		return 0;
	bi = find_bucket(m, slot(m, id), len, key_hash(slot(m, id), len));
	if (bi < 0)
		return 0;
	unlink_id(m, (uint32_t)bi, id);
	return 1;
}

void
kvp_map_clear(struct kvp_map *m)
{
	memset(m->buckets, 0, ((size_t)m->mask + 1) * sizeof(*m->buckets));
	memset(m->klen, 0, (size_t)m->num_ids * sizeof(*m->klen));
	m->num_keys = 0;
}
