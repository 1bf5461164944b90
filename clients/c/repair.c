/* SPDX-License-Identifier: Apache-2.0 */
/*
 * repair.c: the event stream's repair calls of libkvpool, Snapshot and
 * Replay (a subscriber that saw a gap, or a new one, catches up with them).
 */
#include "clients/c/kvpool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clients/c/client_impl.h"
#include "common/map_key.h"
#include "proto/event_wire.h"
#include "proto/wire.h"

/*
 * Paging. The daemon answers a snapshot in pages of keys in map-key order
 * (hash || BE32 group, shorter first), each exact at its own next_seq. The
 * pages are joined by replaying the batches from the first page's next_seq
 * and applying an event to a key only from its page's next_seq on: the
 * result is exact at the replay's end. A reset (AllBlocksCleared) or an
 * epoch change while paging starts over.
 */
struct snap_page {
	uint64_t seq;
	size_t last;       /* offset in store of the page's last key; unused for the final page */
	size_t last_len;
	bool final;
};
struct snap_delta {
	size_t off;        /* hash bytes in store */
	size_t hash_len;
	uint32_t group;
	int32_t d;         /* +1 stored, -1 removed */
	const uint8_t *hash; /* set once store stops moving */
};
struct snap_build {
	uint64_t epoch;
	uint8_t *store;
	size_t len, cap;
	struct kvp_snapshot_entry *e; /* hash pointers set at the end */
	size_t *eoff, ne, ecap, ocap;
	struct snap_page *pages;
	size_t np, pcap;
	struct snap_delta *dl;
	size_t nd, dcap;
	bool restart;      /* a reset or a new epoch: page again */
	int err;
	struct kvp_event_batch ev;
};

#define SNAPSHOT_TRIES 4
/* The longest map key: a coarse hash of 32 fine ones, and the group. */
#define SNAPSHOT_MAX_KEY (32 * KVP_HASH_LEN + KVP_MAP_KEY_GROUP_LEN)

static bool
grow_(void **p, size_t *cap, size_t need, size_t size)
{
	if (need <= *cap)
		return true;
	size_t c = *cap ? *cap : 64;
	while (c < need)
		c *= 2;
	void *q = realloc(*p, c * size);
	if (q == NULL)
		return false;
	*p = q;
	*cap = c;
	return true;
}

/* Appends n bytes to the store; their offset, or SIZE_MAX out of memory. */
static size_t
store_add(struct snap_build *b, const uint8_t *bytes, size_t n)
{
	size_t cap = b->cap;
	if (!grow_((void **)&b->store, &cap, b->len + n + 1, 1))
		return SIZE_MAX;
	b->cap = cap;
	if (n)
		memcpy(b->store + b->len, bytes, n);
	b->len += n;
	return b->len - n;
}

/* Orders (hash, group) as the daemon orders map keys. */
static int
key_cmp(const uint8_t *h, size_t hl, uint32_t g, const uint8_t *h2, size_t hl2, uint32_t g2)
{
	if (hl != hl2)
		return hl < hl2 ? -1 : 1;
	int d = memcmp(h, h2, hl);
	return d ? d : g < g2 ? -1 : g > g2;
}

/* The page holding (hash, group): the first whose last key is not below it. */
static const struct snap_page *
page_of(const struct snap_build *b, const uint8_t *h, size_t hl, uint32_t g)
{
	size_t lo = 0, hi = b->np - 1; /* the final page holds everything above */
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		const struct snap_page *p = &b->pages[mid];
		const uint8_t *k = b->store + p->last;
		size_t kh = p->last_len - KVP_MAP_KEY_GROUP_LEN;
		if (key_cmp(h, hl, g, k, kh, kvp_map_key_group(k, p->last_len)) <= 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return &b->pages[lo];
}

/* Takes every page into b. KVP_OK, b->restart (the epoch moved), or an error. */
static int
snap_pages(struct kvp_client *c, uint32_t max_entries, struct snap_build *b)
{
	uint8_t after[SNAPSHOT_MAX_KEY];
	size_t after_len = 0;

	for (bool more = true; more;) {
		Kvpool__V1__SnapshotRequest m = KVPOOL__V1__SNAPSHOT_REQUEST__INIT;
		Kvpool__V1__Reply *r = NULL;
		m.paged = 1;
		m.max_entries = max_entries;
		m.after.data = after;
		m.after.len = after_len;
		KVP_CLIENT_CALL(c, snapshot, SNAPSHOT, &m, r);
		if (rv != KVP_OK)
			return rv;
		const Kvpool__V1__SnapshotReply *sr = r->snapshot;
		if (r->result_case != KVPOOL__V1__REPLY__RESULT_SNAPSHOT ||
		    (sr->more && (sr->next_after.len <= KVP_MAP_KEY_GROUP_LEN ||
		                  sr->next_after.len > sizeof(after)))) {
			kvpool__v1__reply__free_unpacked(r, NULL);
			return kvp_client_fail_(c, KVP_EINTERNAL, "snapshot: unexpected reply", NULL);
		}
		if (b->np == 0)
			b->epoch = sr->epoch;
		if (sr->epoch != b->epoch) {
			kvpool__v1__reply__free_unpacked(r, NULL);
			b->restart = true;
			return KVP_OK;
		}
		bool ok = grow_((void **)&b->e, &b->ecap, b->ne + sr->n_entries, sizeof(*b->e)) &&
		          grow_((void **)&b->eoff, &b->ocap, b->ne + sr->n_entries, sizeof(*b->eoff)) &&
		          grow_((void **)&b->pages, &b->pcap, b->np + 1, sizeof(*b->pages));
		for (size_t i = 0; ok && i < sr->n_entries; i++) {
			const Kvpool__V1__SnapshotEntry *se = sr->entries[i];
			size_t off = store_add(b, se->hash.data, se->hash.len);
			ok = off != SIZE_MAX;
			b->eoff[b->ne] = off;
			b->e[b->ne++] = (struct kvp_snapshot_entry){
				.hash_len = se->hash.len, .group_idx = se->group_idx,
				.num_blocks = se->num_blocks};
		}
		struct snap_page *pg = ok ? &b->pages[b->np++] : NULL;
		if (pg) {
			*pg = (struct snap_page){.seq = sr->next_seq, .final = !sr->more};
			pg->last = store_add(b, sr->next_after.data, sr->next_after.len);
			pg->last_len = sr->next_after.len;
			ok = pg->last != SIZE_MAX;
		}
		more = sr->more;
		if (ok && more) {
			memcpy(after, sr->next_after.data, sr->next_after.len);
			after_len = sr->next_after.len;
		}
		kvpool__v1__reply__free_unpacked(r, NULL);
		if (!ok)
			return kvp_client_fail_(c, KVP_ENOMEM, "out of memory", NULL);
	}
	return KVP_OK;
}

/* Replay callback: the events each key's page has not seen, as deltas. */
static void
snap_replayed(void *ctx, const uint8_t *bytes, size_t len)
{
	struct snap_build *b = ctx;
	struct kvp_wire_batch_hdr h;

	if (b->err || b->restart)
		return;
	if ((b->err = kvp_wire_events_decode(bytes, len, &h, &b->ev)) != KVP_OK)
		return;
	if (h.tick)
		return;
	if (h.epoch != b->epoch) {
		b->restart = true;
		return;
	}
	for (size_t i = 0; i < kvp_event_batch_count(&b->ev); i++) {
		struct kvp_event ev;
		(void)kvp_event_batch_get(&b->ev, i, &ev);
		if (ev.type == KVP_EVENT_ALL_CLEARED) {
			b->restart = true;
			return;
		}
		uint32_t g = ev.has_group_idx ? ev.group_idx : 0;
		for (uint32_t j = 0; j < ev.num_hashes; j++) {
			const uint8_t *hash = ev.hashes + (size_t)j * ev.hash_len;
			/* b->store may move below: find the page before adding. */
			if (h.seq < page_of(b, hash, ev.hash_len, g)->seq)
				continue; /* the page already counts it */
			size_t off = store_add(b, hash, ev.hash_len);
			if (off == SIZE_MAX || !grow_((void **)&b->dl, &b->dcap, b->nd + 1, sizeof(*b->dl))) {
				b->err = KVP_ENOMEM;
				return;
			}
			b->dl[b->nd++] = (struct snap_delta){
				.off = off, .hash_len = ev.hash_len, .group = g,
				.d = ev.type == KVP_EVENT_BLOCK_STORED ? 1 : -1};
		}
	}
}

static int
delta_cmp(const void *x, const void *y)
{
	const struct snap_delta *a = x, *b = y;
	int d = key_cmp(a->hash, a->hash_len, a->group, b->hash, b->hash_len, b->group);
	/* Stable for equal keys: the order they happened in. */
	return d ? d : a->off < b->off ? -1 : a->off > b->off;
}

/* Entries (sorted) plus deltas (sorted) into out; KVP_EINTERNAL if a count goes below 0. */
static int
snap_merge(struct snap_build *b, struct kvp_snapshot_entry *out, size_t *n)
{
	size_t i = 0, j = 0, k = 0;

	while (i < b->ne || j < b->nd) {
		const struct kvp_snapshot_entry *e = i < b->ne ? &b->e[i] : NULL;
		const struct snap_delta *d = j < b->nd ? &b->dl[j] : NULL;
		int c = !e ? 1 : !d ? -1 : key_cmp(e->hash, e->hash_len, e->group_idx, d->hash,
		                                   d->hash_len, d->group);
		struct kvp_snapshot_entry x = c <= 0 ? *e
		                                     : (struct kvp_snapshot_entry){
		                                               .hash = d->hash, .hash_len = d->hash_len,
		                                               .group_idx = d->group};
		int64_t count = c <= 0 ? (int64_t)e->num_blocks : 0;
		i += c <= 0;
		for (; j < b->nd && key_cmp(x.hash, x.hash_len, x.group_idx, b->dl[j].hash,
		                            b->dl[j].hash_len, b->dl[j].group) == 0; j++)
			count += b->dl[j].d;
		if (count < 0 || count > UINT32_MAX)
			return KVP_EINTERNAL;
		if (count > 0) {
			x.num_blocks = (uint32_t)count;
			out[k++] = x;
		}
	}
	*n = k;
	return KVP_OK;
}

static void
snap_build_free(struct snap_build *b)
{
	free(b->store);
	free(b->e);
	free(b->eoff);
	free(b->pages);
	free(b->dl);
	kvp_event_batch_fini(&b->ev);
	memset(b, 0, sizeof(*b));
}

/* One attempt: pages, then the replay that joins them. */
static int
snap_try(struct kvp_client *c, uint32_t max_entries, struct snap_build *b, struct kvp_snapshot *s)
{
	uint64_t next = 0;
	bool available = true;
	int rv;

	if ((rv = snap_pages(c, max_entries, b)) != KVP_OK || b->restart)
		return rv;
	next = b->pages[b->np - 1].seq;
	if (b->pages[0].seq != next) {
		rv = kvp_client_replay(c, b->epoch, b->pages[0].seq, &available, &next, snap_replayed, b);
		if (rv != KVP_OK)
			return rv;
		if (b->err)
			return kvp_client_fail_(c, b->err, "snapshot: a replayed batch did not decode", NULL);
		if (!available || b->restart) {
			b->restart = true;
			return KVP_OK;
		}
	}
	for (size_t i = 0; i < b->ne; i++)
		b->e[i].hash = b->store + b->eoff[i];
	for (size_t i = 0; i < b->nd; i++)
		b->dl[i].hash = b->store + b->dl[i].off;
	if (b->nd > 0)
		qsort(b->dl, b->nd, sizeof(*b->dl), delta_cmp);
	size_t n = b->ne + b->nd;
	struct kvp_snapshot_entry *e = calloc(n ? n : 1, sizeof(*e));
	if (e == NULL)
		return kvp_client_fail_(c, KVP_ENOMEM, "out of memory", NULL);
	if ((rv = snap_merge(b, e, &n)) != KVP_OK) {
		free(e);
		return kvp_client_fail_(c, rv, "snapshot: a replayed event removed a key its page "
		                        "did not have", NULL);
	}
	*s = (struct kvp_snapshot){.epoch = b->epoch, .next_seq = next, .entries = e,
	                           .num_entries = n, .storage = b->store};
	b->store = NULL; /* the snapshot owns it now */
	return KVP_OK;
}

int
kvp_client_snapshot_paged(struct kvp_client *c, uint32_t max_entries, struct kvp_snapshot **out)
{
	struct kvp_snapshot *snap;
	int rv = KVP_OK;

	if (c == NULL || out == NULL)
		return KVP_EINVAL;
	if ((snap = calloc(1, sizeof(*snap))) == NULL)
		return kvp_client_fail_(c, KVP_ENOMEM, "out of memory", NULL);
	for (int t = 0; t < SNAPSHOT_TRIES; t++) {
		struct snap_build b = {0};
		kvp_event_batch_init(&b.ev);
		rv = snap_try(c, max_entries, &b, snap);
		bool again = rv == KVP_OK && b.restart;
		snap_build_free(&b);
		if (rv != KVP_OK)
			break;
		if (!again) {
			*out = snap;
			return KVP_OK;
		}
	}
	free(snap);
	if (rv == KVP_OK)
		rv = kvp_client_fail_(c, KVP_EBUSY, "snapshot: the pool was reset or restarted while "
		                      "it was being paged, every time: try again", NULL);
	return rv;
}

int
kvp_client_snapshot(struct kvp_client *c, struct kvp_snapshot **out)
{
	return kvp_client_snapshot_paged(c, 0, out);
}

void
kvp_snapshot_free(struct kvp_snapshot *s)
{
	if (s == NULL)
		return;
	free(s->entries);
	free(s->storage);
	free(s);
}

int
kvp_client_replay(struct kvp_client *c, uint64_t epoch, uint64_t from_seq, bool *available,
                  uint64_t *next_seq, void (*each)(void *ctx, const uint8_t *batch, size_t len),
                  void *ctx)
{
	if (c == NULL || available == NULL || next_seq == NULL || each == NULL)
		return KVP_EINVAL;
	/* A reply holds what fits in one message: ask again until caught up. */
	for (;;) {
		Kvpool__V1__ReplayRequest m = KVPOOL__V1__REPLAY_REQUEST__INIT;
		Kvpool__V1__Reply *r = NULL;
		m.epoch = epoch;
		m.from_seq = from_seq;
		KVP_CLIENT_CALL(c, replay, REPLAY, &m, r);
		if (rv != KVP_OK)
			return rv;
		if (r->result_case != KVPOOL__V1__REPLY__RESULT_REPLAY) {
			kvpool__v1__reply__free_unpacked(r, NULL);
			return kvp_client_fail_(c, KVP_EINTERNAL, "replay: unexpected reply", NULL);
		}
		const Kvpool__V1__ReplayReply *rr = r->replay;
		*available = rr->available;
		*next_seq = rr->next_seq;
		for (size_t i = 0; rr->available && i < rr->n_batches; i++)
			each(ctx, rr->batches[i].data, rr->batches[i].len);
		from_seq += rr->available ? rr->n_batches : 0;
		bool more = rr->available && rr->n_batches > 0 && from_seq < rr->next_seq;
		kvpool__v1__reply__free_unpacked(r, NULL);
		if (!more)
			return KVP_OK;
	}
}
