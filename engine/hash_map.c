/* SPDX-License-Identifier: Apache-2.0 */
#include "engine/hash_map.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "common/big_alloc.h"
#include "common/kvp_status.h"

/* The cold paths (init, removal, clear); the hot ones are inline in hash_map.h. */

uint32_t
kvp_map__hash_any(const struct kvp_map *m, const uint8_t *k, size_t len)
{
	const uint64_t *s = m->seed;
	uint64_t a = s[0] ^ (len * 0x9e3779b97f4a7c15ull), b = s[1];
	size_t n = len;

	while (n >= 16) {
		a += (kvp_map__load64(k) ^ s[2]) * 0x2545f4914f6cdd1dull;
		b += (kvp_map__load64(k + 8) ^ s[3]) * 0xff51afd7ed558ccdull;
		a = (a << 29) | (a >> 35);
		b = (b << 31) | (b >> 33);
		k += 16;
		n -= 16;
	}
	if (n >= 8) {
		a ^= (kvp_map__load64(k) ^ s[4]) * 0xc4ceb9fe1a85ec53ull;
		k += 8;
		n -= 8;
	}
	if (n >= 4) { /* 4..7 bytes: two overlapping 4-byte reads */
		uint32_t x, y;
		memcpy(&x, k, 4);
		memcpy(&y, k + n - 4, 4);
		b ^= (((uint64_t)x << 32 | y) ^ s[5]) * 0x9e3779b97f4a7c15ull;
	} else if (n > 0) {
		uint64_t t = (uint64_t)k[0] << 16 | (uint64_t)k[n / 2] << 8 | k[n - 1];
		b ^= ((t + 1) ^ s[5]) * 0x9e3779b97f4a7c15ull;
	}
	return (uint32_t)kvp_map__fmix64(a ^ (b * 0x2545f4914f6cdd1dull));
}

/*
 * A fresh secret for the map's hash. From the kernel's generator; should it
 * fail (a sandbox without getrandom), from the clock and the map's address,
 * mixed: weaker, but still not a value a peer can know in advance.
 */
static void
seed_map(struct kvp_map *m)
{
	uint8_t *dst = (uint8_t *)m->seed;
	size_t got = 0;

	while (got < sizeof(m->seed)) {
		ssize_t r = getrandom(dst + got, sizeof(m->seed) - got, GRND_NONBLOCK);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	if (got == sizeof(m->seed))
		return;
	struct timespec ts;
	timespec_get(&ts, TIME_UTC);
	uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)(uintptr_t)m;
	for (size_t i = 0; i < sizeof(m->seed) / sizeof(m->seed[0]); i++) {
		x += 0x9e3779b97f4a7c15ull; /* splitmix64 */
		m->seed[i] = kvp_map__fmix64(x);
	}
}

static size_t
bucket_bytes(const struct kvp_map *m)
{
	return ((size_t)m->mask + 1) * sizeof(*m->buckets);
}

int
kvp_map_init(struct kvp_map *m, uint32_t num_ids, uint32_t max_key_len)
{
	uint64_t nb = 16;

	memset(m, 0, sizeof(*m));
	if (num_ids == 0 || num_ids > INT32_MAX - 2 || max_key_len == 0 ||
	    max_key_len > UINT16_MAX)
		return KVP_EINVAL;
	/* At most a quarter full (a half for over 2^30 ids): short probes and shifts. */
	while (nb < 4ull * num_ids && nb < (1ull << 32))
		nb <<= 1;
	if (nb < 2ull * num_ids)
		return KVP_EINVAL;
	m->mask = (uint32_t)(nb - 1);
	m->num_ids = num_ids;
	seed_map(m);
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

/* Backward-shift deletion of bucket i (linear probing, no tombstones). */
void
kvp_map__delete_bucket(struct kvp_map *m, uint32_t i)
{
	uint32_t j = i;

	for (;;) {
		j = (j + 1) & m->mask;
		uint64_t b = m->buckets[j];
		if (b == 0)
			break;
		uint32_t home = kvp_map__bhash(b) & m->mask;
		/* Move b back to i unless its home lies cyclically in (i, j]. */
		int stays = (i <= j) ? (home > i && home <= j) : (home > i || home <= j);
		if (!stays) {
			m->buckets[i] = b;
			i = j;
		}
	}
	m->buckets[i] = 0;
	m->num_keys--;
}

int
kvp_map_pop(struct kvp_map *m, const uint8_t *key, size_t len, int32_t id)
{
	int64_t bi;

	if (id < 0 || (uint32_t)id >= m->num_ids || m->ent[id].len != len ||
	    !kvp_map__key_equal(kvp_map__slot(m, id), key, len))
		return 0;
	if ((bi = kvp_map__bucket_of_id(m, id)) < 0)
		return 0; /* unreachable while the map is consistent */
	kvp_map__unlink_id(m, (uint32_t)bi, id);
	return 1;
}

int
kvp_map_remove_id(struct kvp_map *m, int32_t id)
{
	return kvp_map__remove_id(m, id);
}

void
kvp_map_clear(struct kvp_map *m)
{
	memset(m->buckets, 0, bucket_bytes(m));
	for (uint32_t i = 0; i < m->num_ids; i++)
		m->ent[i].len = 0;
	m->num_keys = 0;
}

int
kvp_map_grow(struct kvp_map *m, uint32_t num_ids)
{
	uint64_t nb = (uint64_t)m->mask + 1;

	if (num_ids <= m->num_ids || num_ids > INT32_MAX - 2)
		return KVP_EINVAL;
	while (nb < 4ull * num_ids && nb < (1ull << 32))
		nb <<= 1;
	if (nb < 2ull * num_ids)
		return KVP_EINVAL;
	uint64_t *nbk = kvp_big_alloc(nb * sizeof(*nbk));
	struct kvp_map_entry *nent = kvp_big_alloc((size_t)num_ids * sizeof(*nent));
	uint8_t *nkeys = kvp_big_alloc((size_t)num_ids * m->max_key_len);
	if (!nbk || !nent || !nkeys) {
		kvp_big_free(nbk, nb * sizeof(*nbk));
		kvp_big_free(nent, (size_t)num_ids * sizeof(*nent));
		kvp_big_free(nkeys, (size_t)num_ids * m->max_key_len);
		return KVP_ENOMEM;
	}
	memcpy(nent, m->ent, (size_t)m->num_ids * sizeof(*nent));
	memcpy(nkeys, m->keys, (size_t)m->num_ids * m->max_key_len);
	/* The chains live in the entries; a bucket only moves to its new home. */
	uint32_t nmask = (uint32_t)(nb - 1);
	for (uint64_t i = 0; i <= m->mask; i++) {
		uint64_t b = m->buckets[i];
		if (b == 0)
			continue;
		uint32_t j = kvp_map__bhash(b) & nmask;
		while (nbk[j] != 0)
			j = (j + 1) & nmask;
		nbk[j] = b;
	}
	kvp_big_free(m->buckets, bucket_bytes(m));
	kvp_big_free(m->ent, (size_t)m->num_ids * sizeof(*m->ent));
	kvp_big_free(m->keys, (size_t)m->num_ids * m->max_key_len);
	m->buckets = nbk;
	m->ent = nent;
	m->keys = nkeys;
	m->mask = nmask;
	m->num_ids = num_ids;
	return KVP_OK;
}
