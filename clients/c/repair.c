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
#include "proto/wire.h"

int
kvp_client_snapshot(struct kvp_client *c, struct kvp_snapshot **out)
{
	Kvpool__V1__SnapshotRequest m = KVPOOL__V1__SNAPSHOT_REQUEST__INIT;
	Kvpool__V1__Reply *r = NULL;
	struct kvp_snapshot *snap;

	if (c == NULL || out == NULL)
		return KVP_EINVAL;
	KVP_CLIENT_CALL(c, snapshot, SNAPSHOT, &m, r);
	if (rv != KVP_OK)
		return rv;
	if (r->result_case != KVPOOL__V1__REPLY__RESULT_SNAPSHOT) {
		kvpool__v1__reply__free_unpacked(r, NULL);
		return kvp_client_fail_(c, KVP_EINTERNAL, "snapshot: unexpected reply", NULL);
	}
	const Kvpool__V1__SnapshotReply *sr = r->snapshot;
	size_t bytes = 0;
	for (size_t i = 0; i < sr->n_entries; i++)
		bytes += sr->entries[i]->hash.len;
	snap = calloc(1, sizeof(*snap));
	uint8_t *store = malloc(bytes ? bytes : 1);
	struct kvp_snapshot_entry *e = calloc(sr->n_entries ? sr->n_entries : 1, sizeof(*e));
	if (snap == NULL || store == NULL || e == NULL) {
		free(snap);
		free(store);
		free(e);
		kvpool__v1__reply__free_unpacked(r, NULL);
		return kvp_client_fail_(c, KVP_ENOMEM, "out of memory", NULL);
	}
	size_t off = 0;
	for (size_t i = 0; i < sr->n_entries; i++) {
		const Kvpool__V1__SnapshotEntry *se = sr->entries[i];
		if (se->hash.len > 0)
			memcpy(store + off, se->hash.data, se->hash.len);
		e[i].hash = store + off;
		e[i].hash_len = se->hash.len;
		e[i].group_idx = se->group_idx;
		e[i].num_blocks = se->num_blocks;
		off += se->hash.len;
	}
	snap->epoch = sr->epoch;
	snap->next_seq = sr->next_seq;
	snap->entries = e;
	snap->num_entries = sr->n_entries;
	snap->storage = store;
	kvpool__v1__reply__free_unpacked(r, NULL);
	*out = snap;
	return KVP_OK;
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
