/* SPDX-License-Identifier: Apache-2.0 */
/*
 * u64map.h: a map from 64-bit keys to nonzero 64-bit values: open
 * addressing with linear probing, at most half full, backward-shift
 * deletion (no tombstones), so a lookup costs O(1) whatever the map has
 * seen. The daemon finds a session by its id and a session's request by the
 * client's id with it, on every call, under the pool's lock.
 *
 * A value of 0 marks an empty slot, so callers store index + 1 and the like.
 * Iterate with `for (i < m->cap) if (m->v[i].val != 0)`. Not thread-safe;
 * never prints. A zeroed struct is an empty map.
 */
#ifndef KVPD_U64MAP_H
#define KVPD_U64MAP_H

#include <stddef.h>
#include <stdint.h>

struct kvpd_u64map {
	struct kvpd_u64pair {
		uint64_t key, val; /* val 0: empty */
	} *v;
	size_t n, cap; /* cap: 0 or a power of two */
};

/* The value under key, or 0 if none. */
uint64_t kvpd_u64map_get(const struct kvpd_u64map *m, uint64_t key);

/*
 * Sets key's value (adds it or replaces its value). KVP_EINVAL if val is 0,
 * KVP_ENOMEM if the map must grow and cannot (nothing changes on error).
 */
int kvpd_u64map_put(struct kvpd_u64map *m, uint64_t key, uint64_t val);

/* Removes key; returns its value, or 0 (no change) if it was absent. */
uint64_t kvpd_u64map_del(struct kvpd_u64map *m, uint64_t key);

/* Empties the map, keeping its memory. */
void kvpd_u64map_clear(struct kvpd_u64map *m);

/* Frees the map's memory; it is then empty. */
void kvpd_u64map_fini(struct kvpd_u64map *m);

#endif
