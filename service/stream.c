/* SPDX-License-Identifier: Apache-2.0 */
#include "service/stream.h"

#include <nng/nng.h>
#include <nng/supplemental/util/platform.h>
#include <stdlib.h>
#include <string.h>

#include "common/block_hash.h"
#include "common/kvp_status.h"
#include "kvpool.pb-c.h"

int
kvpd_stream_init(struct kvpd_stream *s, uint32_t ring_cap)
{
	memset(s, 0, sizeof(*s));
	if (ring_cap == 0)
		return KVP_EINVAL;
	if ((s->ring = calloc(ring_cap, sizeof(*s->ring))) == NULL)
		return KVP_ENOMEM;
	s->ring_cap = ring_cap;
	do {
		s->epoch = (uint64_t)nng_random() << 32 | nng_random();
	} while (s->epoch == 0);
	return KVP_OK;
}

void
kvpd_stream_fini(struct kvpd_stream *s)
{
	if (s->ring != NULL)
		for (uint32_t i = 0; i < s->ring_cap; i++)
			free(s->ring[i].bytes);
	free(s->ring);
	memset(s, 0, sizeof(*s));
}

uint64_t
kvpd_stream_oldest(const struct kvpd_stream *s)
{
	return s->next_seq > s->ring_cap ? s->next_seq - s->ring_cap : 0;
}

const struct kvpd_ring_slot *
kvpd_stream_get(const struct kvpd_stream *s, uint64_t seq)
{
	if (seq >= s->next_seq || seq < kvpd_stream_oldest(s))
		return NULL;
	const struct kvpd_ring_slot *slot = &s->ring[seq % s->ring_cap];
	return slot->bytes != NULL && slot->seq == seq ? slot : NULL;
}

/* Everything one batch's encoding points into, freed after packing. */
struct build {
	Kvpool__V1__Event *ev;
	Kvpool__V1__Event **evp;
	Kvpool__V1__EventStored *st;
	Kvpool__V1__EventRemoved *rm;
	Kvpool__V1__EventCleared cleared;
	uint64_t *ids;
	ProtobufCBinaryData *extra;
};

static void
build_free(struct build *b)
{
	free(b->ev);
	free(b->evp);
	free(b->st);
	free(b->rm);
	free(b->ids);
	free(b->extra);
}

int
kvpd_stream_emit(struct kvpd_stream *s, const char *name, const struct kvp_event_batch *eb,
                 uint64_t ts_unix_ns)
{
	size_t n = kvp_event_batch_count(eb), nids = 0, nextra = 0;
	struct build b = {0};
	Kvpool__V1__EventBatch batch = KVPOOL__V1__EVENT_BATCH__INIT;
	uint64_t seq;
	int rv = KVP_OK;

	if (n == 0)
		return KVP_OK;
	seq = s->next_seq++; /* used even if encoding fails: subscribers see the gap */
	s->batches++;
	s->events += n;
	for (size_t i = 0; i < n; i++) {
		struct kvp_event ev;
		(void)kvp_event_batch_get(eb, i, &ev);
		nids += ev.num_hashes + 1;
		nextra += ev.num_hashes;
	}
	b.ev = calloc(n, sizeof(*b.ev));
	b.evp = calloc(n, sizeof(*b.evp));
	b.st = calloc(n, sizeof(*b.st));
	b.rm = calloc(n, sizeof(*b.rm));
	b.ids = calloc(nids ? nids : 1, sizeof(*b.ids));
	b.extra = calloc(nextra ? nextra : 1, sizeof(*b.extra));
	if (!b.ev || !b.evp || !b.st || !b.rm || !b.ids || !b.extra) {
		build_free(&b);
		return KVP_ENOMEM;
	}
	kvpool__v1__event_cleared__init(&b.cleared);
	uint64_t *ids = b.ids;
	ProtobufCBinaryData *extra = b.extra;
	for (size_t i = 0; i < n; i++) {
		struct kvp_event ev;
		Kvpool__V1__Event *e = &b.ev[i];
		(void)kvp_event_batch_get(eb, i, &ev);
		kvpool__v1__event__init(e);
		b.evp[i] = e;
		for (uint32_t h = 0; h < ev.num_hashes; h++)
			ids[h] = kvp_hash_event_id(ev.hashes + (size_t)h * ev.hash_len, ev.hash_len);
		if (ev.type == KVP_EVENT_BLOCK_STORED) {
			Kvpool__V1__EventStored *m = &b.st[i];
			kvpool__v1__event_stored__init(m);
			m->block_hashes.data = (uint8_t *)ev.hashes;
			m->block_hashes.len = (size_t)ev.num_hashes * ev.hash_len;
			m->hash_len = ev.hash_len;
			m->hash_ids = ids;
			m->n_hash_ids = ev.num_hashes;
			if (ev.parent) {
				m->has_parent = 1;
				m->parent_hash.data = (uint8_t *)ev.parent;
				m->parent_hash.len = ev.hash_len;
				m->parent_hash_id = kvp_hash_event_id(ev.parent, ev.hash_len);
			}
			m->token_ids = (int64_t *)ev.token_ids;
			m->n_token_ids = ev.num_tokens;
			m->block_size = ev.block_size;
			m->has_lora_id = ev.has_lora_id;
			m->lora_id = ev.lora_id;
			m->medium = (char *)(ev.medium ? ev.medium : "");
			m->lora_name = (char *)(ev.lora_name ? ev.lora_name : "");
			for (uint32_t h = 0; h < ev.num_hashes; h++) {
				extra[h].data = (uint8_t *)ev.extra_keys + ev.extra_key_offsets[h];
				extra[h].len = ev.extra_key_offsets[h + 1] - ev.extra_key_offsets[h];
			}
			m->extra_keys = extra;
			m->n_extra_keys = ev.num_hashes;
			extra += ev.num_hashes;
			m->group_idx = ev.group_idx;
			m->spec_kind = (char *)(ev.spec_kind ? ev.spec_kind : "");
			m->has_sliding_window = ev.has_sliding_window;
			m->sliding_window = ev.sliding_window;
			e->event_case = KVPOOL__V1__EVENT__EVENT_STORED;
			e->stored = m;
		} else if (ev.type == KVP_EVENT_BLOCK_REMOVED) {
			Kvpool__V1__EventRemoved *m = &b.rm[i];
			kvpool__v1__event_removed__init(m);
			m->block_hashes.data = (uint8_t *)ev.hashes;
			m->block_hashes.len = (size_t)ev.num_hashes * ev.hash_len;
			m->hash_len = ev.hash_len;
			m->hash_ids = ids;
			m->n_hash_ids = ev.num_hashes;
			m->medium = (char *)(ev.medium ? ev.medium : "");
			m->group_idx = ev.group_idx;
			e->event_case = KVPOOL__V1__EVENT__EVENT_REMOVED;
			e->removed = m;
		} else {
			e->event_case = KVPOOL__V1__EVENT__EVENT_CLEARED;
			e->cleared = &b.cleared;
		}
		ids += ev.num_hashes + 1;
	}
	batch.pool = (char *)name;
	batch.epoch = s->epoch;
	batch.seq = seq;
	batch.ts_unix_ns = ts_unix_ns;
	batch.events = b.evp;
	batch.n_events = n;

	size_t len = kvpool__v1__event_batch__get_packed_size(&batch);
	uint8_t *bytes = malloc(len ? len : 1);
	if (bytes == NULL) {
		rv = KVP_ENOMEM;
	} else {
		kvpool__v1__event_batch__pack(&batch, bytes);
		struct kvpd_ring_slot *slot = &s->ring[seq % s->ring_cap];
		free(slot->bytes);
		slot->seq = seq;
		slot->bytes = bytes;
		slot->len = len;
		if (s->publish)
			s->publish(s->publish_ctx, name, bytes, len);
	}
	build_free(&b);
	return rv;
}

void
kvpd_stream_tick(struct kvpd_stream *s, const char *name, uint64_t ts_unix_ns)
{
	Kvpool__V1__EventBatch batch = KVPOOL__V1__EVENT_BATCH__INIT;
	uint8_t buf[256];

	if (s->publish == NULL || strlen(name) > 128)
		return;
	batch.pool = (char *)name;
	batch.epoch = s->epoch;
	batch.seq = s->next_seq;
	batch.ts_unix_ns = ts_unix_ns;
	batch.tick = 1;
	size_t len = kvpool__v1__event_batch__pack(&batch, buf);
	s->publish(s->publish_ctx, name, buf, len);
}
