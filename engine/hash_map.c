/* SPDX-License-Identifier: Apache-2.0 */
#include "engine/hash_map.h"

#include <string.h>

#include "common/big_alloc.h"
#include "common/kvp_status.h"

#define EMPTY 0u
/*
 * The probe and unlink helpers run once or more per block on every call of
 * the pool's hot paths; GCC's -O2 heuristics leave them as calls, which
 * costs more than their bodies (callgrind, kvp-bench-engine --count-b).
 */
#if defined(__GNUC__)
#define HOT static inline __attribute__((always_inline))
#else
#define HOT static inline
#endif
/* The common key: a 32-byte block hash and a 4-byte group id. */
#define KEY36 36u

static inline uint64_t
load64(const uint8_t *p)
{
	uint64_t w;
	memcpy(&w, p, 8);
	return w;
}

static inline uint64_t
fmix64(uint64_t h)
{
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdull;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ull;
	h ^= h >> 33;
	return h;
}

/*
 * Keys are mostly SHA-256 output (already uniform) followed by a small group
 * id, but tests and callers may pass short or patterned keys, so every byte
 * is mixed in. Words are multiplied in independent lanes, so the multiplies
 * overlap instead of forming one long dependency chain.
 */
HOT uint32_t
map_hash(const uint8_t *k, size_t len)
{
	uint64_t a = 0x9e3779b97f4a7c15ull ^ len, b = 0xbf58476d1ce4e5b9ull;
	size_t n = len;

	if (len == KEY36) {
		/* The common key, a 32-byte hash and a group id, in straight-line code. */
		uint32_t g;
		memcpy(&g, k + 32, 4);
		a ^= (load64(k) ^ 0x94d049bb133111ebull) * 0x2545f4914f6cdd1dull;
		b ^= (load64(k + 8) ^ 0x9e3779b97f4a7c15ull) * 0xff51afd7ed558ccdull;
		a += (load64(k + 16) ^ 0xc4ceb9fe1a85ec53ull) * 0x9e3779b97f4a7c15ull;
		b += (load64(k + 24) ^ 0xbf58476d1ce4e5b9ull) * 0x94d049bb133111ebull;
		b ^= ((uint64_t)g + 1) * 0xc4ceb9fe1a85ec53ull;
		return (uint32_t)fmix64(a ^ ((b << 31) | (b >> 33)));
	}

	while (n >= 16) {
		a += (load64(k) ^ 0x94d049bb133111ebull) * 0x2545f4914f6cdd1dull;
		b += (load64(k + 8) ^ 0x9e3779b97f4a7c15ull) * 0xff51afd7ed558ccdull;
		a = (a << 29) | (a >> 35);
		b = (b << 31) | (b >> 33);
		k += 16;
		n -= 16;
	}
	if (n >= 8) {
		a ^= load64(k) * 0xc4ceb9fe1a85ec53ull;
		k += 8;
		n -= 8;
	}
	if (n >= 4) { /* 4..7 bytes: two overlapping 4-byte reads */
		uint32_t x, y;
		memcpy(&x, k, 4);
		memcpy(&y, k + n - 4, 4);
		b ^= ((uint64_t)x << 32 | y) * 0x9e3779b97f4a7c15ull;
	} else if (n > 0) {
		uint64_t t = (uint64_t)k[0] << 16 | (uint64_t)k[n / 2] << 8 | k[n - 1];
		b ^= (t + 1) * 0x9e3779b97f4a7c15ull;
	}
	return (uint32_t)fmix64(a ^ (b * 0x2545f4914f6cdd1dull));
}

uint32_t
kvp_map_hash(const uint8_t *k, size_t len)
{
	return map_hash(k, len);
}

/* Key equality; keys are short (36 bytes for a plain hash) so a word loop beats a call. */
static inline int
key_equal(const uint8_t *x, const uint8_t *y, size_t len)
{
	if (len == KEY36) { /* the common key, branch-free */
		uint32_t a, b;
		memcpy(&a, x + 32, 4);
		memcpy(&b, y + 32, 4);
		return ((load64(x) ^ load64(y)) | (load64(x + 8) ^ load64(y + 8)) |
		        (load64(x + 16) ^ load64(y + 16)) | (load64(x + 24) ^ load64(y + 24)) |
		        (uint64_t)(a ^ b)) == 0;
	}
	while (len >= 8) {
		if (load64(x) != load64(y))
			return 0;
		x += 8;
		y += 8;
		len -= 8;
	}
	if (len >= 4) {
		uint32_t a, b;
		memcpy(&a, x, 4);
		memcpy(&b, y, 4);
		if (a != b)
			return 0;
		x += 4;
		y += 4;
		len -= 4;
	}
	while (len > 0) {
		if (*x++ != *y++)
			return 0;
		len--;
	}
	return 1;
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

static size_t
bucket_bytes(const struct kvp_map *m)
{
	return ((size_t)m->mask + 1) * sizeof(*m->buckets);
}

/* Returns the bucket index holding key, or -1. */
HOT int64_t
find_bucket(const struct kvp_map *m, const uint8_t *key, size_t len, uint32_t h)
{
	for (uint32_t i = h & m->mask;; i = (i + 1) & m->mask) {
		uint64_t b = m->buckets[i];
		if (b == EMPTY)
			return -1;
		if (bucket_hash(b) == h) {
			int32_t id = bucket_head(b);
			if (m->ent[id].len == len && key_equal(slot(m, id), key, len))
				return i;
		}
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
	m->mask = (uint32_t)(nb - 1);
	m->num_ids = num_ids;
	m->max_key_len = max_key_len;
	/* Zeroed lazily by the kernel, so creation stays cheap. */
	m->buckets = kvp_big_alloc(bucket_bytes(m));
	m->ent = kvp_big_alloc((size_t)num_ids * sizeof(*m->ent));
	m->keys = kvp_big_alloc((size_t)num_ids * max_key_len);
	if (!m->buckets || !m->ent || !m->keys) {
		kvp_map_fini(m);
		return KVP_ENOMEM;
	}
	return KVP_OK;
}

void
kvp_map_fini(struct kvp_map *m)
{
	kvp_big_free(m->buckets, bucket_bytes(m));
	kvp_big_free(m->ent, (size_t)m->num_ids * sizeof(*m->ent));
	kvp_big_free(m->keys, (size_t)m->num_ids * m->max_key_len);
	memset(m, 0, sizeof(*m));
}

int
kvp_map_insert_hashed(struct kvp_map *m, const uint8_t *key, size_t len, uint32_t h,
                      int32_t id)
{
	uint32_t bi;
	struct kvp_map_entry *e;

	if (len == 0 || len > m->max_key_len || id < 0 || (uint32_t)id >= m->num_ids)
		return KVP_EINVAL;
	e = &m->ent[id];
	if (e->len != 0)
		return KVP_ESTATE;
	/* One probe: it ends at the key's bucket, or at the empty bucket it takes. */
	for (bi = h & m->mask;; bi = (bi + 1) & m->mask) {
		uint64_t b = m->buckets[bi];
		if (b == EMPTY)
			break;
		if (bucket_hash(b) == h) {
			int32_t head = bucket_head(b);
			if (m->ent[head].len == len && key_equal(slot(m, head), key, len))
				break;
		}
	}
	if (len == KEY36)
		memcpy(m->keys + (size_t)id * m->max_key_len, key, KEY36); /* moves, not a call */
	else
		memcpy(m->keys + (size_t)id * m->max_key_len, key, len);
	e->len = (uint16_t)len;
	e->hash = h;
	e->next = -1;
	if (m->buckets[bi] != EMPTY) {
		int32_t head = bucket_head(m->buckets[bi]);
		int32_t tail = m->ent[head].prev;
		m->ent[tail].next = id;
		e->prev = tail;
		m->ent[head].prev = id;
	} else {
		m->buckets[bi] = bucket_make(h, id);
		e->prev = id;
		m->num_keys++;
	}
	return KVP_OK;
}

int
kvp_map_insert(struct kvp_map *m, const uint8_t *key, size_t len, int32_t id)
{
	if (len == 0 || len > m->max_key_len)
		return KVP_EINVAL;
	return kvp_map_insert_hashed(m, key, len, map_hash(key, len), id);
}

int32_t
kvp_map_lookup_hashed(const struct kvp_map *m, const uint8_t *key, size_t len, uint32_t h)
{
	int64_t bi;

	if (len == 0 || len > m->max_key_len)
		return -1;
	bi = find_bucket(m, key, len, h);
	return bi < 0 ? -1 : bucket_head(m->buckets[bi]);
}

int32_t
kvp_map_lookup(const struct kvp_map *m, const uint8_t *key, size_t len)
{
	int64_t bi;

	if (len == 0 || len > m->max_key_len)
		return -1;
	bi = find_bucket(m, key, len, map_hash(key, len));
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
HOT void
unlink_id(struct kvp_map *m, uint32_t bi, int32_t id)
{
	int32_t head = bucket_head(m->buckets[bi]);
	int32_t tail = m->ent[head].prev;
	int32_t nx = m->ent[id].next;

	if (id == head) {
		if (nx < 0) {
			delete_bucket(m, bi);
		} else {
			m->ent[nx].prev = tail;
			m->buckets[bi] = bucket_make(bucket_hash(m->buckets[bi]), nx);
		}
	} else {
		int32_t pv = m->ent[id].prev;
		m->ent[pv].next = nx;
		if (nx >= 0)
			m->ent[nx].prev = pv;
		else
			m->ent[head].prev = pv; /* id was the tail */
	}
	m->ent[id].len = 0;
}

/*
 * The bucket of the key id is under. Most keys have one block, so a bucket
 * whose head is id itself is found without reading any key bytes.
 */
HOT int64_t
bucket_of_id(const struct kvp_map *m, int32_t id)
{
	const struct kvp_map_entry *e = &m->ent[id];

	for (uint32_t i = e->hash & m->mask;; i = (i + 1) & m->mask) {
		uint64_t b = m->buckets[i];
		if (b == EMPTY)
			return -1;
		if (bucket_hash(b) != e->hash)
			continue;
		int32_t head = bucket_head(b);
		if (head == id ||
		    (m->ent[head].len == e->len && key_equal(slot(m, head), slot(m, id), e->len)))
			return i;
	}
}

int
kvp_map_pop(struct kvp_map *m, const uint8_t *key, size_t len, int32_t id)
{
	int64_t bi;

	if (id < 0 || (uint32_t)id >= m->num_ids || m->ent[id].len != len ||
	    !key_equal(slot(m, id), key, len))
		return 0;
	if ((bi = bucket_of_id(m, id)) < 0)
		return 0; /* unreachable while the map is consistent */
	unlink_id(m, (uint32_t)bi, id);
	return 1;
}

int
kvp_map_remove_id(struct kvp_map *m, int32_t id)
{
	int64_t bi;

	if (m->ent[id].len == 0 || (bi = bucket_of_id(m, id)) < 0)
		return 0;
	unlink_id(m, (uint32_t)bi, id);
	return 1;
}

void
kvp_map_clear(struct kvp_map *m)
{
	memset(m->buckets, 0, bucket_bytes(m));
	for (uint32_t i = 0; i < m->num_ids; i++)
		m->ent[i].len = 0;
	m->num_keys = 0;
}
