/* SPDX-License-Identifier: Apache-2.0 */
#include "service/rpc/u64map.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/kvp_status.h"

/* Keys may be sequential (client request ids) or random (session ids): mix them. */
static size_t
home(uint64_t key, size_t mask)
{
	uint64_t x = key * 0x9e3779b97f4a7c15ull;
	return (size_t)((x ^ (x >> 29)) & mask);
}

/* The slot holding key, or the empty slot where it would go. */
static size_t
find(const struct kvpd_u64map *m, uint64_t key)
{
	size_t mask = m->cap - 1, i = home(key, mask);
	while (m->v[i].val != 0 && m->v[i].key != key)
		i = (i + 1) & mask;
	return i;
}

uint64_t
kvpd_u64map_get(const struct kvpd_u64map *m, uint64_t key)
{
	return m->cap == 0 ? 0 : m->v[find(m, key)].val;
}

int
kvpd_u64map_put(struct kvpd_u64map *m, uint64_t key, uint64_t val)
{
	if (val == 0)
		return KVP_EINVAL;
	if (m->cap != 0) {
		size_t i = find(m, key);
		if (m->v[i].val != 0) {
			m->v[i].val = val;
			return KVP_OK;
		}
	}
	if (2 * (m->n + 1) > m->cap) {
		size_t cap = m->cap ? 2 * m->cap : 16;
		struct kvpd_u64map g = {.v = calloc(cap, sizeof(*g.v)), .n = m->n, .cap = cap};
		if (g.v == NULL)
			return KVP_ENOMEM;
		for (size_t k = 0; k < m->cap; k++)
			if (m->v[k].val != 0)
				g.v[find(&g, m->v[k].key)] = m->v[k];
		free(m->v);
		*m = g;
	}
	size_t i = find(m, key);
	m->v[i] = (struct kvpd_u64pair){key, val};
	m->n++;
	return KVP_OK;
}

uint64_t
kvpd_u64map_del(struct kvpd_u64map *m, uint64_t key)
{
	if (m->cap == 0)
		return 0;
	size_t mask = m->cap - 1, i = find(m, key);
	uint64_t val = m->v[i].val;
	if (val == 0)
		return 0;
	/* Backward shift: later entries of the probe run move up into the hole. */
	for (size_t j = (i + 1) & mask; m->v[j].val != 0; j = (j + 1) & mask) {
		size_t h = home(m->v[j].key, mask);
		bool stays = i <= j ? (h > i && h <= j) : (h > i || h <= j);
		if (!stays) {
			m->v[i] = m->v[j];
			i = j;
		}
	}
	m->v[i].val = 0;
	m->n--;
	return val;
}

void
kvpd_u64map_clear(struct kvpd_u64map *m)
{
	if (m->cap)
		memset(m->v, 0, m->cap * sizeof(*m->v));
	m->n = 0;
}

void
kvpd_u64map_fini(struct kvpd_u64map *m)
{
	free(m->v);
	*m = (struct kvpd_u64map){0};
}
