/* SPDX-License-Identifier: Apache-2.0 */
/* The event stream's repair: Replay and Snapshot. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "service/rpc/call.h"
#include "common/kvp_status.h"
#include "common/map_key.h"
#include "engine/manager.h"
#include "engine/pool.h"
#include "proto/wire.h"

int
kvpd_h_replay(struct call *c, const Kvpool__V1__ReplayRequest *m, Kvpool__V1__Reply *out)
{
	Kvpool__V1__ReplayReply *r = NEW(c, Kvpool__V1__ReplayReply, kvpool__v1__replay_reply__descriptor);
	struct kvpd_stream *st = &c->p->stream;

	if (r == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	if (!c->p->events_on)
		return kvpd_fail(c, KVP_ENOTSUP, "pool %s records no events: this daemon has no "
		                 "publisher (events and vllm-events are none)", c->p->cfg.name);
	r->epoch = st->epoch;
	r->next_seq = st->next_seq;
	r->oldest_seq = kvpd_stream_oldest(st);
	r->available = m->epoch == st->epoch && m->from_seq <= st->next_seq;
	for (uint64_t q = m->from_seq; r->available && q < st->next_seq; q++)
		if (kvpd_stream_get(st, q) == NULL)
			r->available = 0; /* the ring no longer holds it: take a Snapshot */
	if (r->available) {
		/* As many as fit in half a message, so the reply always goes out. */
		size_t max = m->max_batches ? m->max_batches : SIZE_MAX, bytes = 0;
		size_t n = (size_t)(st->next_seq - m->from_seq);
		if (n > max)
			n = max;
		ProtobufCBinaryData *b = kvpd_scratch(c, (n ? n : 1) * sizeof(*b));
		if (b == NULL)
			return kvpd_fail(c, KVP_ENOMEM, "out of memory");
		size_t k = 0;
		for (; k < n; k++) {
			const struct kvpd_ring_slot *slot = kvpd_stream_get(st, m->from_seq + k);
			if (k > 0 && bytes + slot->len > c->p->limits.max_reply_bytes / 2)
				break;
			b[k].data = slot->bytes;
			b[k].len = slot->len;
			bytes += slot->len;
		}
		r->batches = b;
		r->n_batches = k;
		c->p->counters.replays_served++;
	} else {
		c->p->counters.replays_refused++;
	}
	out->result_case = KVPOOL__V1__REPLY__RESULT_REPLAY;
	out->replay = r;
	return KVP_OK;
}

/* A map key (hash || BE32 group) and the snapshot's order on them: shorter first. */
struct kvpd_key {
	const uint8_t *k;
	size_t len;
};

static int
key_cmp(const struct kvpd_key *a, const struct kvpd_key *b)
{
	if (a->len != b->len)
		return a->len < b->len ? -1 : 1;
	return memcmp(a->k, b->k, a->len);
}

static int
key_qsort_cmp(const void *x, const void *y)
{
	return key_cmp(x, y);
}

/* A max-heap of the n smallest keys seen (h[0] the largest of them). */
static void
heap_sift_down(struct kvpd_key *h, size_t n, size_t i)
{
	for (;;) {
		size_t l = 2 * i + 1, r = l + 1, m = i;
		if (l < n && key_cmp(&h[l], &h[m]) > 0)
			m = l;
		if (r < n && key_cmp(&h[r], &h[m]) > 0)
			m = r;
		if (m == i)
			return;
		struct kvpd_key t = h[i];
		h[i] = h[m];
		h[m] = t;
		i = m;
	}
}

static void
heap_push(struct kvpd_key *h, size_t *n, struct kvpd_key k)
{
	size_t i = (*n)++;
	h[i] = k;
	while (i > 0 && key_cmp(&h[(i - 1) / 2], &h[i]) < 0) {
		struct kvpd_key t = h[i];
		h[i] = h[(i - 1) / 2];
		h[(i - 1) / 2] = t;
		i = (i - 1) / 2;
	}
}

/*
 * The cap+1 smallest block keys after `after` (every copy: a key cached in
 * several blocks appears that often), unordered, in keys; their count.
 * One pass over the blocks, O(blocks · log cap): no sort of the whole map.
 */
static size_t
smallest_keys(struct kvp_pool *pool, const struct kvpd_key *after, size_t cap,
              struct kvpd_key *keys)
{
	uint32_t nb = kvp_pool_num_blocks(pool);
	size_t n = 0;

	for (uint32_t id = 1; id < nb; id++) {
		struct kvpd_key k;
		/* Every key of the block: its primary, then any partial entries (vLLM 0.33). */
		for (size_t i = 0; (k.k = kvp_pool_block_key_at(pool, (int32_t)id, i, &k.len)); i++) {
			if (after->len > 0 && key_cmp(&k, after) <= 0)
				continue;
			if (n < cap + 1) {
				heap_push(keys, &n, k);
			} else if (key_cmp(&k, &keys[0]) < 0) {
				keys[0] = k;
				heap_sift_down(keys, n, 0);
			}
		}
	}
	return n;
}

/* Blocks caching key x, and whether any key above x exists. */
static uint32_t
count_key(struct kvp_pool *pool, const struct kvpd_key *x, bool *above)
{
	uint32_t nb = kvp_pool_num_blocks(pool), n = 0;

	*above = false;
	for (uint32_t id = 1; id < nb; id++) {
		struct kvpd_key k;
		for (size_t i = 0; (k.k = kvp_pool_block_key_at(pool, (int32_t)id, i, &k.len)); i++) {
			int d = key_cmp(&k, x);
			n += d == 0;
			*above |= d > 0;
		}
	}
	return n;
}

/* The most entries one reply carries: half a message of the pool's longest keys. */
static size_t
page_cap(const struct call *c)
{
	size_t per = kvp_pool_max_hash_len(c->p->pool) + 16; /* hash, group, count, framing */
	size_t cap = c->p->limits.max_reply_bytes / 2 / per;
	return cap < 1 ? 1 : cap > KVPD_SNAPSHOT_PAGE ? KVPD_SNAPSHOT_PAGE : cap;
}

int
kvpd_h_snapshot(struct call *c, const Kvpool__V1__SnapshotRequest *m, Kvpool__V1__Reply *out)
{
	Kvpool__V1__SnapshotReply *r =
		NEW(c, Kvpool__V1__SnapshotReply, kvpool__v1__snapshot_reply__descriptor);
	struct kvp_pool *pool = c->p->pool;
	struct kvpd_key after = {m->after.data, m->after.len}, *keys;
	size_t cap = page_cap(c), n, nk, ne = 0;

	if (m->max_entries > 0 && m->max_entries < cap)
		cap = m->max_entries;
	if (m->after.len > kvp_pool_max_hash_len(pool) + KVP_MAP_KEY_GROUP_LEN || (!m->paged && m->after.len))
		return kvpd_fail(c, KVP_EINVAL, "snapshot: 'after' is not a key of this pool");
	if (r == NULL || (keys = kvpd_scratch(c, (cap + 1) * sizeof(*keys))) == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	n = smallest_keys(pool, &after, cap, keys);
	qsort(keys, n, sizeof(*keys), key_qsort_cmp);
	r->more = n > cap;
	nk = n;
	if (r->more) {
		/* The largest key may have copies the page left out: it opens the next page. */
		while (nk > 0 && key_cmp(&keys[nk - 1], &keys[n - 1]) == 0)
			nk--;
	}
	if (!m->paged && r->more)
		return kvpd_fail(c, KVP_ETOOLARGE, "snapshot: pool %s caches more than %zu keys, one "
		                 "reply's worth: ask for pages (libkvpool does)", c->p->cfg.name, cap);
	Kvpool__V1__SnapshotEntry *e = kvpd_scratch(c, (n ? n : 1) * sizeof(*e));
	Kvpool__V1__SnapshotEntry **ep = kvpd_scratch(c, (n ? n : 1) * sizeof(*ep));
	if (e == NULL || ep == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	uint32_t copies = 0;
	if (nk == 0 && n > 0) {
		/* One key's copies fill the page: count them all; it goes alone. */
		bool above;
		copies = count_key(pool, &keys[0], &above);
		r->more = above;
		nk = 1;
	}
	/* One entry per distinct (hash, group), with how many blocks hold it. */
	for (size_t i = 0; i < nk; i++) {
		if (ne > 0 && key_cmp(&keys[i], &keys[i - 1]) == 0) {
			e[ne - 1].num_blocks++;
			continue;
		}
		kvpool__v1__snapshot_entry__init(&e[ne]);
		e[ne].hash.data = (uint8_t *)keys[i].k;
		e[ne].hash.len = keys[i].len - KVP_MAP_KEY_GROUP_LEN;
		e[ne].group_idx = kvp_map_key_group(keys[i].k, keys[i].len);
		e[ne].num_blocks = copies ? copies : 1;
		ep[ne] = &e[ne];
		ne++;
	}
	if (r->more) {
		r->next_after.data = (uint8_t *)keys[nk - 1].k;
		r->next_after.len = keys[nk - 1].len;
	}
	r->epoch = c->p->stream.epoch;
	r->next_seq = c->p->stream.next_seq;
	r->entries = ep;
	r->n_entries = ne;
	c->p->counters.snapshots++;
	out->result_case = KVPOOL__V1__REPLY__RESULT_SNAPSHOT;
	out->snapshot = r;
	return KVP_OK;
}
