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
 * doubly linked FIFO (the head's kprev points at the tail). Keys are stored
 * once per block, in a slab of max_key_len bytes per block.
 *
 * Internal to the engine; exposed so tests can check it against vLLM
 * (scenarios C3, C4). Not thread-safe. Never prints.
 */
#ifndef KVP_HASH_MAP_H
#define KVP_HASH_MAP_H

#include <stddef.h>
#include <stdint.h>

struct kvp_map {
	uint64_t *buckets;   /* (hash32 << 32) | (head id + 1); 0 = empty */
	uint32_t mask;       /* bucket count - 1 */
	uint32_t num_keys;   /* distinct keys (vLLM's len()) */
	uint32_t num_ids;    /* capacity in block ids */
	uint32_t max_key_len;
	int32_t *kprev;      /* per id: previous under the same key (head: tail) */
	int32_t *knext;      /* per id: next under the same key, -1 at the end */
	uint16_t *klen;      /* per id: key length, 0 = not in the map */
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
	if (m->klen[id] == 0)
		return NULL;
	*len = m->klen[id];
	return m->keys + (size_t)id * m->max_key_len;
}

/* Returns the next block id under the same key as id (insertion order), or -1. */
static inline int32_t
kvp_map_next_same_key(const struct kvp_map *m, int32_t id)
{
	return m->knext[id];
}

/* Empties the map (vLLM replaces it with a fresh one). O(buckets + ids). */
void kvp_map_clear(struct kvp_map *m);

#endif /* KVP_HASH_MAP_H */
