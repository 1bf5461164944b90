/* SPDX-License-Identifier: Apache-2.0 */
/*
 * map_key.h: the layout of a prefix-map key, written once.
 *
 * vLLM keys its cached_block_hash_to_block by BlockHashWithGroupId: the
 * block's hash (32·k bytes, k > 1 for coarse blocks) followed by the KV
 * cache group id as 4 big-endian bytes. The engine's map, the daemon's
 * Snapshot and the clients' index all use this layout, so it lives here.
 *
 * Header-only, thread-safe, no I/O.
 */
#ifndef KVP_MAP_KEY_H
#define KVP_MAP_KEY_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Bytes the group id adds after the hash. */
#define KVP_MAP_KEY_GROUP_LEN 4

/* Writes group as 4 big-endian bytes at dst. */
static inline void
kvp_map_key_put_group(uint8_t *dst, uint32_t group)
{
	dst[0] = (uint8_t)(group >> 24);
	dst[1] = (uint8_t)(group >> 16);
	dst[2] = (uint8_t)(group >> 8);
	dst[3] = (uint8_t)group;
}

/* Builds hash ‖ BE32(group) at key (hash_len + 4 bytes); returns its length. */
static inline size_t
kvp_map_key_make(uint8_t *key, const uint8_t *hash, size_t hash_len, uint32_t group)
{
	memcpy(key, hash, hash_len);
	kvp_map_key_put_group(key + hash_len, group);
	return hash_len + KVP_MAP_KEY_GROUP_LEN;
}

/* The group id of a key of key_len bytes (key_len >= 4). */
static inline uint32_t
kvp_map_key_group(const uint8_t *key, size_t key_len)
{
	const uint8_t *g = key + key_len - KVP_MAP_KEY_GROUP_LEN;
	return (uint32_t)g[0] << 24 | (uint32_t)g[1] << 16 | (uint32_t)g[2] << 8 | g[3];
}

#endif /* KVP_MAP_KEY_H */
