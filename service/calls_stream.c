/* SPDX-License-Identifier: Apache-2.0 */
/* The event stream's repair: Replay and Snapshot. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "service/call.h"
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

static int
key_cmp(const void *x, const void *y)
{
	const struct kvpd_key {
		const uint8_t *k;
		size_t len;
	} *a = x, *b = y;
	if (a->len != b->len)
		return a->len < b->len ? -1 : 1;
	return memcmp(a->k, b->k, a->len);
}

int
kvpd_h_snapshot(struct call *c, const Kvpool__V1__SnapshotRequest *m, Kvpool__V1__Reply *out)
{
	Kvpool__V1__SnapshotReply *r =
		NEW(c, Kvpool__V1__SnapshotReply, kvpool__v1__snapshot_reply__descriptor);
	struct kvp_pool *pool = c->p->pool;
	struct kvpd_key {
		const uint8_t *k;
		size_t len;
	} *keys;
	uint32_t nb = kvp_pool_num_blocks(pool), nk = 0;

	if (r == NULL || (keys = kvpd_scratch(c, (size_t)nb * sizeof(*keys))) == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	for (uint32_t id = 1; id < nb; id++)
		if ((keys[nk].k = kvp_pool_block_key(pool, (int32_t)id, &keys[nk].len)) != NULL)
			nk++;
	/* One entry per distinct (hash, group), with how many blocks hold it. */
	qsort(keys, nk, sizeof(*keys), key_cmp);
	Kvpool__V1__SnapshotEntry *e = kvpd_scratch(c, (nk ? nk : 1) * sizeof(*e));
	Kvpool__V1__SnapshotEntry **ep = kvpd_scratch(c, (nk ? nk : 1) * sizeof(*ep));
	if (e == NULL || ep == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	size_t ne = 0;
	for (uint32_t i = 0; i < nk; i++) {
		if (ne > 0 && key_cmp(&keys[i], &keys[i - 1]) == 0) {
			e[ne - 1].num_blocks++;
			continue;
		}
		const uint8_t *k = keys[i].k;
		size_t hl = keys[i].len - KVP_MAP_KEY_GROUP_LEN;
		kvpool__v1__snapshot_entry__init(&e[ne]);
		e[ne].hash.data = (uint8_t *)k;
		e[ne].hash.len = hl;
		e[ne].group_idx = kvp_map_key_group(k, keys[i].len);
		e[ne].num_blocks = 1;
		ep[ne] = &e[ne];
		ne++;
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

