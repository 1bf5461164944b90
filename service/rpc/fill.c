/* SPDX-License-Identifier: Apache-2.0 */
/* The cluster-fill table (fill.h). */
#include "service/rpc/fill.h"

#include <stdlib.h>
#include <string.h>

#include "common/kvp_status.h"

enum { FREE = 0, WANTED = 1, TAKEN = 2, ABSENT = 3 };
enum { PROBES = 64 }; /* entries one insert looks at for room */

int
kvpd_fill_init(struct kvpd_fill *f, size_t key_len, uint32_t cap, uint32_t wait_ms,
               uint32_t miss_ms)
{
	if (f == NULL)
		return KVP_EINVAL;
	memset(f, 0, sizeof(*f));
	if (key_len < 8 || key_len > 128 || cap == 0 || cap > 1u << 20)
		return KVP_EINVAL;
	f->e = calloc(cap, sizeof(*f->e));
	f->keys = malloc((size_t)cap * key_len);
	f->q = calloc(cap, sizeof(*f->q));
	if (f->e == NULL || f->keys == NULL || f->q == NULL) {
		kvpd_fill_fini(f);
		return KVP_ENOMEM;
	}
	f->key_len = key_len;
	f->cap = cap;
	f->wait_ms = wait_ms;
	f->miss_ms = miss_ms;
	return KVP_OK;
}

void
kvpd_fill_fini(struct kvpd_fill *f)
{
	if (f == NULL)
		return;
	free(f->e);
	free(f->keys);
	free(f->q);
	kvpd_u64map_fini(&f->index);
	memset(f, 0, sizeof(*f));
}

bool
kvpd_fill_on(const struct kvpd_fill *f, uint64_t now_ms)
{
	return f != NULL && f->key_len != 0 && f->agent_seen_ms != 0 &&
	       now_ms - f->agent_seen_ms <= KVPD_FILL_AGENT_MS;
}

/* Never 0 (an empty entry): keys are hashes, so their bytes mix well. */
static uint64_t
fingerprint(const struct kvpd_fill *f, const uint8_t *key)
{
	uint64_t a, b;
	memcpy(&a, key, 8);
	memcpy(&b, key + f->key_len - 8, 8);
	a ^= b * 0x9e3779b97f4a7c15ull;
	return a ? a : 1;
}

/* When entry x may be reused: a pending key's miss horizon too. */
static uint64_t
free_after(const struct kvpd_fill *f, const struct kvpd_fill_entry *x)
{
	return x->state == ABSENT ? x->until_ms : x->until_ms + f->miss_ms;
}

static void
drop(struct kvpd_fill *f, uint32_t i)
{
	kvpd_u64map_del(&f->index, f->e[i].fp);
	f->e[i].fp = 0;
	f->e[i].state = FREE;
	f->e[i].gen++;
}

/* An entry for key, FREE, or UINT32_MAX when none of the next PROBES is. */
static uint32_t
room(struct kvpd_fill *f, uint64_t fp, const uint8_t *key, uint64_t now_ms)
{
	for (uint32_t k = 0; k < PROBES && k < f->cap; k++) {
		uint32_t i = f->hand;
		f->hand = (f->hand + 1) % f->cap;
		if (f->e[i].state != FREE && now_ms < free_after(f, &f->e[i]))
			continue;
		if (f->e[i].state != FREE)
			drop(f, i);
		if (kvpd_u64map_put(&f->index, fp, (uint64_t)i + 1) != KVP_OK)
			return UINT32_MAX;
		f->e[i].fp = fp;
		memcpy(f->keys + (size_t)i * f->key_len, key, f->key_len);
		return i;
	}
	return UINT32_MAX;
}

/* Key's entry, or UINT32_MAX; *clash: another key holds its fingerprint. */
static uint32_t
find(const struct kvpd_fill *f, uint64_t fp, const uint8_t *key, bool *clash)
{
	uint64_t v = kvpd_u64map_get(&f->index, fp);
	*clash = false;
	if (v == 0)
		return UINT32_MAX;
	if (memcmp(f->keys + (v - 1) * f->key_len, key, f->key_len) != 0) {
		*clash = true;
		return UINT32_MAX;
	}
	return (uint32_t)(v - 1);
}

static void
want(struct kvpd_fill *f, uint32_t i, uint64_t now_ms)
{
	f->e[i].state = WANTED;
	f->e[i].gen++; /* a want queued before is stale */
	f->e[i].until_ms = now_ms + f->wait_ms;
	if (f->q_len == f->cap) { /* only stale items can fill it: drop the oldest */
		f->q_head = (f->q_head + 1) % f->cap;
		f->q_len--;
	}
	f->q[(f->q_head + f->q_len++) % f->cap] = (struct kvpd_fill_want){ i, f->e[i].gen };
}

void
kvpd_fill_forget(struct kvpd_fill *f, const uint8_t *key)
{
	bool clash;
	uint32_t i;
	if (f == NULL || f->key_len == 0 || key == NULL)
		return;
	if ((i = find(f, fingerprint(f, key), key, &clash)) != UINT32_MAX)
		drop(f, i);
}

enum kvpd_fill_answer
kvpd_fill_ask(struct kvpd_fill *f, const uint8_t *key, uint64_t now_ms)
{
	bool clash;
	uint64_t fp;
	uint32_t i;

	if (!kvpd_fill_on(f, now_ms) || key == NULL)
		return KVPD_FILL_MISS;
	fp = fingerprint(f, key);
	if ((i = find(f, fp, key, &clash)) != UINT32_MAX) {
		struct kvpd_fill_entry *x = &f->e[i];
		if (x->state == ABSENT && now_ms < x->until_ms)
			return KVPD_FILL_MISS;
		if (x->state != ABSENT && now_ms < x->until_ms) {
			f->pending++;
			return KVPD_FILL_PENDING;
		}
		if (now_ms < free_after(f, x))
			return KVPD_FILL_MISS; /* its wait passed unanswered */
		want(f, i, now_ms);  /* known absent long enough ago: ask again */
		f->pending++;
		return KVPD_FILL_PENDING;
	}
	if (clash || (i = room(f, fp, key, now_ms)) == UINT32_MAX) {
		f->dropped++;
		return KVPD_FILL_MISS;
	}
	want(f, i, now_ms);
	f->pending++;
	return KVPD_FILL_PENDING;
}

size_t
kvpd_fill_agent(struct kvpd_fill *f, const uint8_t *absent, size_t n_absent, uint8_t *out,
                size_t max, uint32_t *waiting, uint64_t now_ms)
{
	size_t n = 0;
	bool clash;

	if (waiting != NULL)
		*waiting = 0;
	if (f == NULL || f->key_len == 0)
		return 0;
	f->agent_seen_ms = now_ms ? now_ms : 1;
	for (size_t k = 0; absent != NULL && k < n_absent; k++) {
		const uint8_t *key = absent + k * f->key_len;
		uint64_t fp = fingerprint(f, key);
		uint32_t i = find(f, fp, key, &clash);
		if (i == UINT32_MAX && !clash)
			i = room(f, fp, key, now_ms);
		if (i == UINT32_MAX)
			continue;
		f->e[i].state = ABSENT;
		f->e[i].until_ms = now_ms + f->miss_ms;
	}
	while (f->q_len > 0 && n < max && out != NULL) {
		struct kvpd_fill_want w = f->q[f->q_head];
		f->q_head = (f->q_head + 1) % f->cap;
		f->q_len--;
		if (f->e[w.entry].gen != w.gen || f->e[w.entry].state != WANTED ||
		    now_ms >= f->e[w.entry].until_ms)
			continue; /* reused, answered, or past its wait */
		f->e[w.entry].state = TAKEN;
		memcpy(out + n++ * f->key_len, f->keys + (size_t)w.entry * f->key_len, f->key_len);
	}
	if (waiting != NULL)
		*waiting = f->q_len;
	return n;
}
