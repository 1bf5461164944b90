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
 * (no tombstones), at most 50% load. A bucket packs the key's 32-bit hash
 * and the id of the key's first block; the blocks of one key form a
 * doubly linked FIFO (the head's prev points at the tail). Keys are stored
 * once per block, in a slab of max_key_len bytes per block.
 *
 * Internal to the engine; exposed so tests can check it against vLLM
 * (scenarios C3, C4). Not thread-safe. Never prints.
 */
#ifndef KVP_HASH_MAP_H
#define KVP_HASH_MAP_H

#include <stddef.h>
#include <stdint.h>

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
};

/*
 * Sizes the map for block ids 0..num_ids-1 and keys of up to max_key_len
 * bytes (1..65535). Returns KVP_EINVAL or KVP_ENOMEM (nothing to fini).
 */
int kvp_map_init(struct kvp_map *m, uint32_t num_ids, uint32_t max_key_len);
/* Frees the map's memory. Safe on a zeroed or already finalised map. */
void kvp_map_fini(struct kvp_map *m);

/*
 * Adds block id under key. KVP_EINVAL if len is 0 or over max_key_len or id
 * is out of range; KVP_ESTATE if id is already in the map (a block has at
 * most one hash: vLLM asserts). Nothing changes on error.
 */
int kvp_map_insert(struct kvp_map *m, const uint8_t *key, size_t len, int32_t id);

/* Returns the first inserted block id still under key, or -1. */
int32_t kvp_map_lookup(const struct kvp_map *m, const uint8_t *key, size_t len);

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

/*
 * The hash of a key. Callers that touch many keys at once hash them first
 * and prefetch (below) so the cache misses overlap instead of queueing.
 */
uint32_t kvp_map_hash(const uint8_t *key, size_t len);

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

/* kvp_map_insert / kvp_map_lookup with the key's hash already computed. */
int kvp_map_insert_hashed(struct kvp_map *m, const uint8_t *key, size_t len, uint32_t hash,
                          int32_t id);
int32_t kvp_map_lookup_hashed(const struct kvp_map *m, const uint8_t *key, size_t len,
                              uint32_t hash);

/* Empties the map (vLLM replaces it with a fresh one). O(buckets + ids). */
void kvp_map_clear(struct kvp_map *m);

#endif /* KVP_HASH_MAP_H */
