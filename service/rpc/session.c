/* SPDX-License-Identifier: Apache-2.0 */
#include "service/rpc/session.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kvp_status.h"

#define EMPTY_ID (-1)

struct kvpd_session *
kvpd_session_create(uint64_t id, uint32_t lease_ms, const char *client, uint64_t now_ms)
{
	struct kvpd_session *s = calloc(1, sizeof(*s));

	if (s == NULL)
		return NULL;
	s->id = id;
	s->lease_ms = lease_ms;
	s->last_seen_ms = now_ms;
	snprintf(s->client, sizeof(s->client), "%s", client ? client : "");
	return s;
}

void
kvpd_session_destroy(struct kvpd_session *s)
{
	if (s == NULL)
		return;
	free(s->refs);
	free(s->log);
	free(s->seen);
	kvpd_u64map_fini(&s->reqs);
	for (int i = 0; i < KVPD_REPLY_CACHE; i++)
		free(s->cache[i].bytes);
	free(s);
}

static inline uint32_t
home_of(const struct kvpd_session *s, int32_t id)
{
	return ((uint32_t)id * 0x9e3779b1u) & (s->cap - 1);
}

static uint32_t
slot_of(const struct kvpd_session *s, int32_t id)
{
	uint32_t i = home_of(s, id);
	while (s->refs[i].id != EMPTY_ID && s->refs[i].id != id)
		i = (i + 1) & (s->cap - 1);
	return i;
}

uint32_t
kvpd_session_held(const struct kvpd_session *s, int32_t id)
{
	if (s->cap == 0)
		return 0;
	uint32_t i = slot_of(s, id);
	return s->refs[i].id == id ? s->refs[i].count : 0;
}

/* Empties slot i (its count is 0), shifting back the entries whose probe ran through it. */
static void
drop_slot(struct kvpd_session *s, uint32_t i)
{
	uint32_t mask = s->cap - 1;
	for (uint32_t j = (i + 1) & mask; s->refs[j].id != EMPTY_ID; j = (j + 1) & mask) {
		/* j may fill the hole at i when i lies on its probe, from its home to j */
		if (((j - home_of(s, s->refs[j].id)) & mask) >= ((j - i) & mask)) {
			s->refs[i] = s->refs[j];
			i = j;
		}
	}
	s->refs[i].id = EMPTY_ID;
	s->refs[i].count = 0;
	s->used--;
}

/* One more reference on id; its slot exists or the table has room (reserved). */
static void
hold(struct kvpd_session *s, int32_t id)
{
	uint32_t i = slot_of(s, id);
	if (s->refs[i].id != id) {
		s->refs[i].id = id;
		s->refs[i].count = 0;
		s->used++;
	}
	s->refs[i].count++;
	s->held++;
	if (s->pool_held)
		(*s->pool_held)++;
}

/* One reference less on the id at slot i. */
static void
unhold(struct kvpd_session *s, uint32_t i)
{
	if (--s->refs[i].count == 0)
		drop_slot(s, i);
	s->held--;
	if (s->pool_held)
		(*s->pool_held)--;
}

static int
rehash(struct kvpd_session *s, uint32_t cap)
{
	struct kvpd_ref *refs = malloc(cap * sizeof(*refs)), *old = s->refs;
	uint32_t old_cap = s->cap;

	if (refs == NULL)
		return KVP_ENOMEM;
	for (uint32_t i = 0; i < cap; i++)
		refs[i] = (struct kvpd_ref){.id = EMPTY_ID, .count = 0};
	s->refs = refs;
	s->cap = cap;
	for (uint32_t i = 0; i < old_cap; i++)
		if (old[i].id != EMPTY_ID)
			s->refs[slot_of(s, old[i].id)] = old[i];
	free(old);
	return KVP_OK;
}

/*
 * Drops released entries from the log once it is mostly stale. The counts
 * of kept entries per slot live in a zeroed array the session keeps (a
 * fresh calloc of the whole table each time cost more than the calls that
 * filled the log), zeroed again through the kept entries' slots alone.
 */
static void
compact_log(struct kvpd_session *s)
{
	/* Keep, from the newest end, as many entries per id as the id still holds. */
	size_t w = s->log_len;
	if (s->log_len < 64 || s->log_len < 4 * s->held || s->cap == 0)
		return;
	if (s->seen_cap != s->cap) {
		uint32_t *seen = calloc(s->cap, sizeof(*seen));
		if (seen == NULL)
			return; /* compaction is an optimisation */
		free(s->seen);
		s->seen = seen;
		s->seen_cap = s->cap;
	}
	for (size_t r = s->log_len; r-- > 0;) {
		int32_t id = s->log[r];
		uint32_t i = slot_of(s, id);
		if (s->refs[i].id == id && s->seen[i] < s->refs[i].count) {
			s->seen[i]++;
			s->log[--w] = id;
		}
	}
	for (size_t r = w; r < s->log_len; r++)
		s->seen[slot_of(s, s->log[r])] = 0;
	memmove(s->log, s->log + w, (s->log_len - w) * sizeof(*s->log));
	s->log_len -= w;
}

int
kvpd_session_reserve(struct kvpd_session *s, size_t n)
{
	if (n > (1u << 28))
		return KVP_ENOMEM;
	compact_log(s);
	/*
	 * At most half full, so probes stay short; rebuilt at most a quarter
	 * full, so rebuilds stay rare; and rebuilt smaller after a burst (a
	 * table 16 times what it holds), so a session that once held much does
	 * not keep probing a large cold table.
	 */
	size_t need = s->used + n;
	bool grow = need * 2 > s->cap, shrink = s->cap > 64 && need * 16 < s->cap;
	if (grow || shrink) {
		if (need > (1u << 29)) /* cap stays a uint32_t power of two */
			return KVP_ENOMEM;
		uint32_t cap = 64;
		while (need * 4 > cap)
			cap *= 2;
		if (rehash(s, cap) != KVP_OK && grow)
			return KVP_ENOMEM; /* a failed shrink leaves room enough */
	}
	if (s->log_len + n > s->log_cap) {
		size_t cap = s->log_cap ? s->log_cap : 64;
		while (cap < s->log_len + n)
			cap *= 2;
		int32_t *log = realloc(s->log, cap * sizeof(*log));
		if (log == NULL)
			return KVP_ENOMEM;
		s->log = log;
		s->log_cap = cap;
	}
	return KVP_OK;
}

void
kvpd_session_add(struct kvpd_session *s, int32_t id)
{
	hold(s, id);
	s->log[s->log_len++] = id;
}

void
kvpd_session_remove(struct kvpd_session *s, int32_t id)
{
	if (s->cap == 0) /* holds nothing yet */
		return;
	uint32_t i = slot_of(s, id);
	if (s->refs[i].id == id)
		unhold(s, i);
}

/*
 * Gives one reference back to ids[0..n): they were just taken, so the
 * table has room for any that left it (used is no more than before).
 */
static void
give_back(struct kvpd_session *s, const int32_t *ids, size_t n, int32_t skip)
{
	for (size_t k = 0; k < n; k++)
		if (ids[k] != skip)
			hold(s, ids[k]);
}

size_t
kvpd_session_take(struct kvpd_session *s, const int32_t *ids, size_t n, int32_t skip)
{
	for (size_t k = 0; k < n; k++) {
		if (ids[k] == skip)
			continue;
		uint32_t i = s->cap ? slot_of(s, ids[k]) : 0;
		if (s->cap == 0 || s->refs[i].id != ids[k]) {
			give_back(s, ids, k, skip);
			return k;
		}
		unhold(s, i);
	}
	return n;
}

void
kvpd_session_untake(struct kvpd_session *s, const int32_t *ids, size_t n, int32_t skip)
{
	give_back(s, ids, n, skip);
}

size_t
kvpd_session_release_some(struct kvpd_session *s, size_t max,
                          int (*free_one)(void *ctx, int32_t id), void *ctx)
{
	size_t seen = 0;
	/*
	 * The references an id still holds are its newest log entries; walking
	 * newest first and releasing as we go, an entry is held exactly when its
	 * id's count is still above zero.
	 */
	while (s->log_len > 0 && s->held > 0 && seen < max) {
		int32_t id = s->log[--s->log_len];
		seen++;
		if (kvpd_session_held(s, id) > 0 && free_one(ctx, id) == KVP_OK)
			kvpd_session_remove(s, id);
	}
	return seen;
}

const struct kvpd_cached_reply *
kvpd_session_cached(const struct kvpd_session *s, uint64_t call_id)
{
	if (call_id == 0)
		return NULL;
	for (int i = 0; i < KVPD_REPLY_CACHE; i++)
		if (s->cache[i].call_id == call_id)
			return &s->cache[i];
	return NULL;
}

static size_t
forget(struct kvpd_cached_reply *c)
{
	size_t len = c->len;
	free(c->bytes);
	*c = (struct kvpd_cached_reply){0};
	return len;
}

void
kvpd_session_remember(struct kvpd_session *s, uint64_t call_id, uint32_t request_crc,
                      const uint8_t *reply, size_t len, uint64_t stamp)
{
	uint8_t *copy;

	if (call_id == 0 || (copy = malloc(len ? len : 1)) == NULL)
		return;
	memcpy(copy, reply, len);
	/* Evict the oldest entries until the new one fits the byte budget. */
	for (int tries = 0; tries < KVPD_REPLY_CACHE; tries++) {
		s->cache_bytes -= forget(&s->cache[s->cache_next]);
		if (s->cache_bytes + len <= KVPD_REPLY_CACHE_BYTES)
			break;
		s->cache_next = (s->cache_next + 1) % KVPD_REPLY_CACHE;
	}
	struct kvpd_cached_reply *c = &s->cache[s->cache_next];
	c->call_id = call_id;
	c->request_crc = request_crc;
	c->stamp = stamp;
	c->bytes = copy;
	c->len = len;
	s->cache_bytes += len;
	s->cache_next = (s->cache_next + 1) % KVPD_REPLY_CACHE;
}

/* The ring's oldest used entry: from cache_next on, the first that holds a reply. */
static struct kvpd_cached_reply *
oldest(const struct kvpd_session *s)
{
	for (unsigned k = 0; k < KVPD_REPLY_CACHE; k++) {
		const struct kvpd_cached_reply *c = &s->cache[(s->cache_next + k) % KVPD_REPLY_CACHE];
		if (c->call_id != 0)
			return (struct kvpd_cached_reply *)c;
	}
	return NULL;
}

uint64_t
kvpd_session_oldest_stamp(const struct kvpd_session *s)
{
	const struct kvpd_cached_reply *c = oldest(s);
	return c != NULL ? c->stamp : UINT64_MAX;
}

size_t
kvpd_session_forget_replies(struct kvpd_session *s)
{
	size_t n = 0;
	for (int i = 0; i < KVPD_REPLY_CACHE; i++)
		n += forget(&s->cache[i]);
	s->cache_bytes = 0;
	return n;
}

bool
kvpd_session_holds_stamp(const struct kvpd_session *s, uint64_t stamp)
{
	for (unsigned k = 0; k < KVPD_REPLY_CACHE; k++)
		if (s->cache[k].call_id != 0 && s->cache[k].stamp == stamp)
			return true;
	return false;
}

size_t
kvpd_session_forget_oldest(struct kvpd_session *s)
{
	struct kvpd_cached_reply *c = oldest(s);
	size_t n = c != NULL ? forget(c) : 0;
	s->cache_bytes -= n;
	return n;
}

uint64_t
kvpd_session_request(const struct kvpd_session *s, uint64_t client_id)
{
	return kvpd_u64map_get(&s->reqs, client_id);
}

int
kvpd_session_add_request(struct kvpd_session *s, uint64_t client_id, uint64_t mgr_id)
{
	return kvpd_u64map_put(&s->reqs, client_id, mgr_id);
}

void
kvpd_session_remove_request(struct kvpd_session *s, uint64_t client_id)
{
	(void)kvpd_u64map_del(&s->reqs, client_id);
}

static int
newest_first(const void *a, const void *b)
{
	uint64_t x = ((const struct kvpd_u64pair *)a)->val;
	uint64_t y = ((const struct kvpd_u64pair *)b)->val;
	return (x < y) - (x > y);
}

void
kvpd_session_end_requests(struct kvpd_session *s, void (*fn)(void *ctx, uint64_t mgr_id),
                          void *ctx)
{
	struct kvpd_u64pair *v = s->reqs.v;
	size_t k = 0;
	/* Newest first: the table's slots are packed and sorted in place, then cleared. */
	for (size_t i = 0; i < s->reqs.cap; i++)
		if (v[i].val != 0)
			v[k++] = v[i];
	if (k > 0)
		qsort(v, k, sizeof(*v), newest_first);
	for (size_t i = 0; i < k; i++)
		fn(ctx, v[i].val);
	kvpd_u64map_clear(&s->reqs);
}

void
kvpd_session_each_request(const struct kvpd_session *s, void (*fn)(void *ctx, uint64_t mgr_id),
                          void *ctx)
{
	for (size_t i = 0; i < s->reqs.cap; i++)
		if (s->reqs.v[i].val != 0)
			fn(ctx, s->reqs.v[i].val);
}
