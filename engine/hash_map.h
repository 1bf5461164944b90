/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hash_map.h: vLLM's BlockHashToBlockMap, the prefix-cache index.
 *
 * Maps a key (block hash bytes || 4-byte big-endian group id; any length
 * 1..max_key_len) to the blocks cached under it, in insertion order. There
 * is no de-duplication: several blocks may share a key; lookup returns the
 * first inserted survivor. A block is under at most one key, so every
 * per-entry array is indexed by block id and sized once at init: the hot
 * path never allocates.
 *
 * Layout: open addressing with linear probing and backward-shift deletion
 * (no tombstones), at most 25% load (50% past 2^30 ids): 8 bytes of bucket
 * per key at least 4 times over. A bucket packs the key's 32-bit hash
 * and the id of the key's first block; the blocks of one key form a
 * doubly linked FIFO (the head's prev points at the tail). Keys are stored
 * once per block, in a slab of max_key_len bytes per block.
 *
 * Internal to the engine; exposed so tests can check it against vLLM
 * (scenarios C3, C4). The hot paths (hash, lookup, insert) are inline, at
 * the end. Not thread-safe. Never prints.
 */
#ifndef KVP_HASH_MAP_H
#define KVP_HASH_MAP_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/kvp_status.h"

/* Per block id, 16 bytes so one cache line serves every field. */
struct kvp_map_entry {
	int32_t prev;        /* previous under the same key (the head's: the tail) */
	int32_t next;        /* next under the same key, -1 at the end */
	uint32_t hash;       /* kvp_map_hash() of the key */
	uint16_t len;        /* key length, 0 = not in the map */
	uint16_t pad;
};

struct kvp_map {
	uint64_t *buckets;   /* (hash32 << 32) | (head id + 1); 0 = empty */
	uint32_t mask;       /* bucket count - 1 */
	uint32_t num_keys;   /* distinct keys (vLLM's len()) */
	uint32_t num_ids;    /* capacity in block ids */
	uint32_t max_key_len;
	struct kvp_map_entry *ent; /* per id */
	uint8_t *keys;       /* per id: max_key_len bytes */
	uint64_t seed[6];    /* the hash's secret, random per map (kvp_map_init) */
};

/*
 * Sizes the map for block ids 0..num_ids-1 and keys of up to max_key_len
 * bytes (1..65535). Returns KVP_EINVAL or KVP_ENOMEM (nothing to fini).
 */
int kvp_map_init(struct kvp_map *m, uint32_t num_ids, uint32_t max_key_len);
/* Frees the map's memory. Safe on a zeroed or already finalised map. */
void kvp_map_fini(struct kvp_map *m);
/*
 * Makes room for ids up to num_ids-1 (more than today's), keeping every key,
 * chain and hash: O(ids + buckets), once. KVP_EINVAL, KVP_ENOMEM (the map
 * unchanged).
 */
int kvp_map_grow(struct kvp_map *m, uint32_t num_ids);


/*
 * Removes block id from key. Returns 1 if it was there, 0 (no change) if the
 * key is absent or id is not under it.
 */
int kvp_map_pop(struct kvp_map *m, const uint8_t *key, size_t len, int32_t id);

/* Removes block id from whatever key it is under. Returns 1, or 0 if unhashed. */
int kvp_map_remove_id(struct kvp_map *m, int32_t id);

/* Returns the key block id is under (and its length), or NULL if none. */
static inline const uint8_t *
kvp_map_key(const struct kvp_map *m, int32_t id, size_t *len)
{
	if (m->ent[id].len == 0)
		return NULL;
	*len = m->ent[id].len;
	return m->keys + (size_t)id * m->max_key_len;
}

/* Returns 1 if block id is in the map. */
static inline int
kvp_map_has_id(const struct kvp_map *m, int32_t id)
{
	return m->ent[id].len != 0;
}

/* Returns the next block id under the same key as id (insertion order), or -1. */
static inline int32_t
kvp_map_next_same_key(const struct kvp_map *m, int32_t id)
{
	return m->ent[id].next;
}


/* Hints that block id's entry, or the bucket a hash starts at, is needed soon. */
static inline void
kvp_map_prefetch_id(const struct kvp_map *m, int32_t id)
{
#if defined(__GNUC__)
	__builtin_prefetch(&m->ent[id]);
#else
	(void)m, (void)id;
#endif
}

static inline void
kvp_map_prefetch_hash(const struct kvp_map *m, uint32_t hash)
{
#if defined(__GNUC__)
	__builtin_prefetch(&m->buckets[hash & m->mask]);
#else
	(void)m, (void)hash;
#endif
}


/* Empties the map (vLLM replaces it with a fresh one). O(buckets + ids). */
void kvp_map_clear(struct kvp_map *m);


/*
 * ---- The hot paths, inline ----
 * The pool inserts, looks up and hashes once or more per block on every
 * call; as calls these cost more than their bodies (callgrind,
 * kvp-bench-engine --count-b), so they live here. kvp_map__* is internal.
 */
#if defined(__GNUC__)
#define KVP_MAP__HOT static inline __attribute__((always_inline))
#else
#define KVP_MAP__HOT static inline
#endif
/* The common key: a 32-byte block hash and a 4-byte group id. */
#define KVP_MAP__KEY36 36u

static inline uint64_t
kvp_map__load64(const uint8_t *p)
{
	uint64_t w;
	memcpy(&w, p, 8);
	return w;
}

static inline uint64_t
kvp_map__fmix64(uint64_t h)
{
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdull;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ull;
	h ^= h >> 33;
	return h;
}

/* kvp_map_hash for every length but 36 (out of line). */
uint32_t kvp_map__hash_any(const struct kvp_map *m, const uint8_t *k, size_t len);

/*
 * The 64x64->128-bit multiply folded to 64 bits (low half ^ high half): one
 * multiply instruction, whose high half every input bit has reached. Every target we build for (x86-64,
 * aarch64) has a 128-bit type.
 */
#if !defined(__SIZEOF_INT128__)
#error "kvpool's map hash needs a compiler with unsigned __int128"
#endif
static inline uint64_t
kvp_map__mum(uint64_t x, uint64_t y)
{
	__extension__ typedef unsigned __int128 u128;
	u128 r = (u128)x * y;
	return (uint64_t)r ^ (uint64_t)(r >> 64);
}

/*
 * kvp_map_hash of a 36-byte key given as its 32 hash bytes and its group id
 * (the key's last 4 bytes, big-endian): the same value, without building the
 * key. For lookups, which would otherwise copy the hash into a key first.
 * Three folded multiplies, as in wyhash: each pair of words is masked with
 * the map's secret seed before it is multiplied, so keys chosen to collide
 * under one seed scatter under another (see kvp_map_hash). A peer would
 * need the seed to pick a word that cancels it.
 */
KVP_MAP__HOT uint32_t
kvp_map__hash_hg(const struct kvp_map *m, const uint8_t *hash, const uint8_t group_be[4])
{
	const uint64_t *s = m->seed;
	uint32_t g;
	memcpy(&g, group_be, 4);
	/* Independent multiplies, so they overlap. */
	uint64_t a = kvp_map__mum(kvp_map__load64(hash) ^ s[0], kvp_map__load64(hash + 8) ^ s[1]);
	uint64_t b = kvp_map__mum(kvp_map__load64(hash + 16) ^ s[2], kvp_map__load64(hash + 24) ^ s[3]);
	return (uint32_t)kvp_map__mum(a ^ s[4], b ^ s[5] ^ g);
}

/*
 * The hash of a key under this map's seed. Keys are mostly SHA-256 output
 * followed by a small group id, but callers choose them (a peer sends block
 * hashes), so the hash is keyed: with a public function a peer could send
 * keys that all probe one run of buckets, and make each insert and lookup
 * walk thousands of them under the pool's lock. Short or patterned keys are
 * mixed in full too. Callers that touch many keys at once hash them first
 * and prefetch (below) so the misses overlap.
 */
KVP_MAP__HOT uint32_t
kvp_map_hash(const struct kvp_map *m, const uint8_t *k, size_t len)
{
	if (len != KVP_MAP__KEY36)
		return kvp_map__hash_any(m, k, len);
	return kvp_map__hash_hg(m, k, k + 32);
}

/* Key equality; keys are short (36 bytes for a plain hash) so a word loop beats a call. */
static inline int
kvp_map__key_equal(const uint8_t *x, const uint8_t *y, size_t len)
{
	if (len == KVP_MAP__KEY36) { /* the common key, branch-free */
		uint32_t a, b;
		memcpy(&a, x + 32, 4);
		memcpy(&b, y + 32, 4);
		return ((kvp_map__load64(x) ^ kvp_map__load64(y)) |
		        (kvp_map__load64(x + 8) ^ kvp_map__load64(y + 8)) |
		        (kvp_map__load64(x + 16) ^ kvp_map__load64(y + 16)) |
		        (kvp_map__load64(x + 24) ^ kvp_map__load64(y + 24)) | (uint64_t)(a ^ b)) == 0;
	}
	while (len >= 8) {
		if (kvp_map__load64(x) != kvp_map__load64(y))
			return 0;
		x += 8;
		y += 8;
		len -= 8;
	}
	while (len > 0) {
		if (*x++ != *y++)
			return 0;
		len--;
	}
	return 1;
}

/* kvp_map__key_equal of a stored 36-byte key and (32 hash bytes, group bytes). */
static inline int
kvp_map__key_equal_hg(const uint8_t *x, const uint8_t *hash, const uint8_t group_be[4])
{
	uint32_t a, b;
	memcpy(&a, x + 32, 4);
	memcpy(&b, group_be, 4);
	return ((kvp_map__load64(x) ^ kvp_map__load64(hash)) |
	        (kvp_map__load64(x + 8) ^ kvp_map__load64(hash + 8)) |
	        (kvp_map__load64(x + 16) ^ kvp_map__load64(hash + 16)) |
	        (kvp_map__load64(x + 24) ^ kvp_map__load64(hash + 24)) | (uint64_t)(a ^ b)) == 0;
}

/* A bucket: (hash32 << 32) | (head id + 1); 0 = empty. */
static inline uint64_t
kvp_map__bucket(uint32_t hash, int32_t head)
{
	return ((uint64_t)hash << 32) | (uint32_t)(head + 1);
}

static inline int32_t
kvp_map__head(uint64_t b)
{
	return (int32_t)(uint32_t)b - 1;
}

static inline uint32_t
kvp_map__bhash(uint64_t b)
{
	return (uint32_t)(b >> 32);
}

static inline const uint8_t *
kvp_map__slot(const struct kvp_map *m, int32_t id)
{
	return m->keys + (size_t)id * m->max_key_len;
}

/* The slot to write a key into before kvp_map__insert_slot. */
static inline uint8_t *
kvp_map__slot_mut(struct kvp_map *m, int32_t id)
{
	return m->keys + (size_t)id * m->max_key_len;
}

/*
 * The probe: the bucket index holding key, or (*found false) the empty
 * bucket where it would go.
 */
KVP_MAP__HOT uint32_t
kvp_map__probe(const struct kvp_map *m, const uint8_t *key, size_t len, uint32_t h, int *found)
{
	for (uint32_t i = h & m->mask;; i = (i + 1) & m->mask) {
		uint64_t b = m->buckets[i];
		if (b == 0) {
			*found = 0;
			return i;
		}
		if (kvp_map__bhash(b) == h) {
			int32_t id = kvp_map__head(b);
			if (m->ent[id].len == len && kvp_map__key_equal(kvp_map__slot(m, id), key, len)) {
				*found = 1;
				return i;
			}
		}
	}
}

/* kvp_map_lookup with the key's hash already computed. */
KVP_MAP__HOT int32_t
kvp_map_lookup_hashed(const struct kvp_map *m, const uint8_t *key, size_t len, uint32_t h)
{
	int found;
	if (len == 0 || len > m->max_key_len)
		return -1;
	uint32_t i = kvp_map__probe(m, key, len, h, &found);
	return found ? kvp_map__head(m->buckets[i]) : -1;
}

/* Returns the first inserted block id still under key, or -1. */
KVP_MAP__HOT int32_t
kvp_map_lookup(const struct kvp_map *m, const uint8_t *key, size_t len)
{
	if (len == 0 || len > m->max_key_len)
		return -1;
	return kvp_map_lookup_hashed(m, key, len, kvp_map_hash(m, key, len));
}

/*
 * kvp_map_lookup of the 36-byte key (hash, group_be) without building it:
 * the first inserted block id still under it, or -1. The map must take
 * 36-byte keys (max_key_len >= 36).
 */
KVP_MAP__HOT int32_t
kvp_map__lookup_hg(const struct kvp_map *m, const uint8_t *hash, const uint8_t group_be[4])
{
	uint32_t h = kvp_map__hash_hg(m, hash, group_be);
#if defined(__GNUC__)
	/* Reload the key's words to compare rather than keep the hash's in
	 * registers: that would make every caller save six of them. */
	__asm__("" ::: "memory");
#endif
	for (uint32_t i = h & m->mask;; i = (i + 1) & m->mask) {
		uint64_t b = m->buckets[i];
		if (b == 0)
			return -1;
		if (kvp_map__bhash(b) == h) {
			int32_t id = kvp_map__head(b);
			if (m->ent[id].len == KVP_MAP__KEY36 &&
			    kvp_map__key_equal_hg(kvp_map__slot(m, id), hash, group_be))
				return id;
		}
	}
}

/*
 * Inserts block id, whose key (len bytes) the caller has already written to
 * the id's slot (kvp_map__slot), with the key's hash h. Internal: the caller
 * has checked that len is 1..max_key_len, id is in range and not in the map.
 */
KVP_MAP__HOT void
kvp_map__insert_slot(struct kvp_map *m, int32_t id, size_t len, uint32_t h)
{
	int found;
	struct kvp_map_entry *e = &m->ent[id];
	/* One probe: it ends at the key's bucket, or at the empty bucket it takes.
	 * id is no bucket's head, so the probe never compares its slot with itself. */
	uint32_t bi = kvp_map__probe(m, kvp_map__slot(m, id), len, h, &found);
	e->len = (uint16_t)len;
	e->hash = h;
	e->next = -1;
	if (found) {
		int32_t head = kvp_map__head(m->buckets[bi]);
		int32_t tail = m->ent[head].prev;
		m->ent[tail].next = id;
		e->prev = tail;
		m->ent[head].prev = id;
	} else {
		m->buckets[bi] = kvp_map__bucket(h, id);
		e->prev = id;
		m->num_keys++;
	}
}

/*
 * kvp_map_insert with the key's hash already computed. KVP_EINVAL if len is
 * 0 or over max_key_len or id is out of range; KVP_ESTATE if id is already
 * in the map (a block has at most one hash: vLLM asserts). Nothing changes
 * on error.
 */
KVP_MAP__HOT int
kvp_map_insert_hashed(struct kvp_map *m, const uint8_t *key, size_t len, uint32_t h, int32_t id)
{
	if (len == 0 || len > m->max_key_len || id < 0 || (uint32_t)id >= m->num_ids)
		return KVP_EINVAL;
	if (m->ent[id].len != 0)
		return KVP_ESTATE;
	uint8_t *dst = m->keys + (size_t)id * m->max_key_len;
	if (len == KVP_MAP__KEY36)
		memcpy(dst, key, KVP_MAP__KEY36); /* moves, not a call */
	else
		memcpy(dst, key, len);
	kvp_map__insert_slot(m, id, len, h);
	return KVP_OK;
}

/* Out of line: the rest of a removal once a key's last block goes. */
void kvp_map__delete_bucket(struct kvp_map *m, uint32_t i);

/* Unlinks id (known to be under the key held by bucket bi). */
KVP_MAP__HOT void
kvp_map__unlink_id(struct kvp_map *m, uint32_t bi, int32_t id)
{
	int32_t head = kvp_map__head(m->buckets[bi]);
	int32_t tail = m->ent[head].prev;
	int32_t nx = m->ent[id].next;

	if (id == head) {
		if (nx < 0) {
			kvp_map__delete_bucket(m, bi);
		} else {
			m->ent[nx].prev = tail;
			m->buckets[bi] = kvp_map__bucket(kvp_map__bhash(m->buckets[bi]), nx);
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
KVP_MAP__HOT int64_t
kvp_map__bucket_of_id(const struct kvp_map *m, int32_t id)
{
	const struct kvp_map_entry *e = &m->ent[id];

	for (uint32_t i = e->hash & m->mask;; i = (i + 1) & m->mask) {
		uint64_t b = m->buckets[i];
		if (b == 0)
			return -1;
		if (kvp_map__bhash(b) != e->hash)
			continue;
		int32_t head = kvp_map__head(b);
		if (head == id || (m->ent[head].len == e->len &&
		                   kvp_map__key_equal(kvp_map__slot(m, head), kvp_map__slot(m, id),
		                                      e->len)))
			return i;
	}
}

/* kvp_map_remove_id, inline for the pool's eviction. */
KVP_MAP__HOT int
kvp_map__remove_id(struct kvp_map *m, int32_t id)
{
	int64_t bi;

	if (m->ent[id].len == 0 || (bi = kvp_map__bucket_of_id(m, id)) < 0)
		return 0;
	kvp_map__unlink_id(m, (uint32_t)bi, id);
	return 1;
}

/* Adds block id under key (see kvp_map_insert_hashed). */
static inline int
kvp_map_insert(struct kvp_map *m, const uint8_t *key, size_t len, int32_t id)
{
	if (len == 0 || len > m->max_key_len)
		return KVP_EINVAL;
	return kvp_map_insert_hashed(m, key, len, kvp_map_hash(m, key, len), id);
}

#endif /* KVP_HASH_MAP_H */
