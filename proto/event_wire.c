/* SPDX-License-Identifier: Apache-2.0 */
#include "proto/event_wire.h"

#include <stdlib.h>
#include <string.h>

#include "common/block_hash.h"
#include "common/kvp_status.h"
#include "kvpool.pb-c.h"

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

/* Points the messages in b at the events of eb (n of them). KVP_ENOMEM or KVP_OK. */
static int
build_events(struct build *b, const struct kvp_event_batch *eb, size_t n)
{
	size_t nids = 0, nextra = 0;
	for (size_t i = 0; i < n; i++) {
		struct kvp_event ev;
		(void)kvp_event_batch_get(eb, i, &ev);
		nids += ev.num_hashes + 1;
		nextra += ev.num_hashes;
	}
	b->ev = calloc(n ? n : 1, sizeof(*b->ev));
	b->evp = calloc(n ? n : 1, sizeof(*b->evp));
	b->st = calloc(n ? n : 1, sizeof(*b->st));
	b->rm = calloc(n ? n : 1, sizeof(*b->rm));
	b->ids = calloc(nids ? nids : 1, sizeof(*b->ids));
	b->extra = calloc(nextra ? nextra : 1, sizeof(*b->extra));
	if (!b->ev || !b->evp || !b->st || !b->rm || !b->ids || !b->extra)
		return KVP_ENOMEM;
	kvpool__v1__event_cleared__init(&b->cleared);
	uint64_t *ids = b->ids;
	ProtobufCBinaryData *extra = b->extra;
	for (size_t i = 0; i < n; i++) {
		struct kvp_event ev;
		Kvpool__V1__Event *e = &b->ev[i];
		(void)kvp_event_batch_get(eb, i, &ev);
		kvpool__v1__event__init(e);
		b->evp[i] = e;
		for (uint32_t h = 0; h < ev.num_hashes; h++)
			ids[h] = kvp_hash_event_id(ev.hashes + (size_t)h * ev.hash_len, ev.hash_len);
		if (ev.type == KVP_EVENT_BLOCK_STORED) {
			Kvpool__V1__EventStored *m = &b->st[i];
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
			Kvpool__V1__EventRemoved *m = &b->rm[i];
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
			e->cleared = &b->cleared;
		}
		ids += ev.num_hashes + 1;
	}
	return KVP_OK;
}

int
kvp_wire_events_encode(const char *pool, const struct kvp_wire_batch_hdr *h,
                       const struct kvp_event_batch *eb, uint8_t **out, size_t *len)
{
	Kvpool__V1__EventBatch batch = KVPOOL__V1__EVENT_BATCH__INIT;
	struct build b = {0};
	size_t n;
	int rv;

	if (pool == NULL || h == NULL || out == NULL || len == NULL ||
	    strlen(pool) > KVP_WIRE_EVENTS_MAX_POOL)
		return KVP_EINVAL;
	n = h->tick || eb == NULL ? 0 : kvp_event_batch_count(eb);
	if (n > 0 && (rv = build_events(&b, eb, n)) != KVP_OK) {
		build_free(&b);
		return rv;
	}
	batch.pool = (char *)pool;
	batch.epoch = h->epoch;
	batch.seq = h->seq;
	batch.ts_unix_ns = h->ts_unix_ns;
	batch.tick = h->tick;
	batch.events = b.evp;
	batch.n_events = n;
	*len = kvpool__v1__event_batch__get_packed_size(&batch);
	if ((*out = malloc(*len ? *len : 1)) != NULL)
		kvpool__v1__event_batch__pack(&batch, *out);
	build_free(&b);
	return *out ? KVP_OK : KVP_ENOMEM;
}

const char *
kvp_wire_spec_kind(const char *k)
{
	static const char *const kinds[] = {
		"full_attention", "sliding_window", "mla_attention", "mamba", "sliding_window_mla",
		"chunked_local_attention", "sink_full_attention", "encoder_only_attention",
		"cross_attention",
	};
	if (k == NULL || k[0] == '\0')
		return NULL;
	for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
		if (strcmp(k, kinds[i]) == 0)
			return kinds[i];
	return "unknown";
}

static int
decode_event(const Kvpool__V1__Event *e, struct kvp_event_batch *out)
{
	if (e->event_case == KVPOOL__V1__EVENT__EVENT_CLEARED) {
		if (kvp_event_batch_reserve(out, 1, 0) != KVP_OK)
			return KVP_ENOMEM;
		kvp_event_append_cleared(out);
		return KVP_OK;
	}
	if (e->event_case == KVPOOL__V1__EVENT__EVENT_REMOVED) {
		const Kvpool__V1__EventRemoved *m = e->removed;
		size_t hl = m->hash_len;
		if (hl == 0 || m->block_hashes.len % hl != 0)
			return KVP_EINVAL;
		size_t n = m->block_hashes.len / hl;
		const char *medium = m->medium && m->medium[0] ? m->medium : NULL;
		if (kvp_event_batch_reserve(out, n, n * kvp_event_removed_bytes(hl, medium)) != KVP_OK)
			return KVP_ENOMEM;
		for (size_t i = 0; i < n; i++)
			kvp_event_append_removed(out, m->block_hashes.data + i * hl, hl, medium, m->group_idx);
		return KVP_OK;
	}
	if (e->event_case != KVPOOL__V1__EVENT__EVENT_STORED)
		return KVP_EINVAL;
	const Kvpool__V1__EventStored *m = e->stored;
	size_t hl = m->hash_len, n, extra = 0;
	if (hl == 0 || m->block_hashes.len % hl != 0 ||
	    (m->has_parent && m->parent_hash.len != hl))
		return KVP_EINVAL;
	n = m->block_hashes.len / hl;
	if (m->n_extra_keys != n && m->n_extra_keys != 0)
		return KVP_EINVAL;
	for (size_t i = 0; i < m->n_extra_keys; i++)
		extra += m->extra_keys[i].len ? m->extra_keys[i].len : 1;
	if (m->n_extra_keys == 0)
		extra = n;
	const char *medium = m->medium && m->medium[0] ? m->medium : NULL;
	const char *lora = m->lora_name && m->lora_name[0] ? m->lora_name : NULL;
	if (kvp_event_batch_reserve(out, 1,
	                            kvp_event_stored_bytes(n, hl, m->has_parent, m->n_token_ids, lora,
	                                                   medium, extra)) != KVP_OK)
		return KVP_ENOMEM;
	struct kvp_stored_desc d = {
		.hash_len = hl, .parent = m->has_parent ? m->parent_hash.data : NULL,
		.token_ids = m->token_ids, .num_tokens = m->n_token_ids, .block_size = m->block_size,
		.has_lora_id = m->has_lora_id, .lora_id = m->lora_id, .lora_name = lora,
		.medium = medium, .group_idx = m->group_idx, .max_hashes = n,
	};
	kvp_event_stored_begin(out, &d);
	for (size_t i = 0; i < n; i++) {
		static const uint8_t none = 0xf6;
		const uint8_t *x = &none;
		size_t xl = 1;
		if (m->n_extra_keys && m->extra_keys[i].len) {
			x = m->extra_keys[i].data;
			xl = m->extra_keys[i].len;
		}
		kvp_event_stored_add(out, m->block_hashes.data + i * hl, x, xl);
	}
	kvp_event_stored_end(out);
	(void)kvp_event_batch_set_spec(out, kvp_event_batch_count(out) - 1, kvp_wire_spec_kind(m->spec_kind),
	                               m->has_sliding_window, m->sliding_window);
	return KVP_OK;
}

int
kvp_wire_events_decode(const uint8_t *bytes, size_t len, struct kvp_wire_batch_hdr *h,
                       struct kvp_event_batch *out)
{
	Kvpool__V1__EventBatch *b;
	int rv = KVP_OK;

	if (bytes == NULL || h == NULL || out == NULL)
		return KVP_EINVAL;
	if ((b = kvpool__v1__event_batch__unpack(NULL, len, bytes)) == NULL)
		return KVP_EINVAL;
	kvp_event_batch_clear(out);
	if (b->sealed.len > 0)
		rv = KVP_EUNAUTH; /* a pool with a token: open it with kvp_seal_open first */
	for (size_t i = 0; i < b->n_events && rv == KVP_OK; i++)
		rv = decode_event(b->events[i], out);
	h->epoch = b->epoch;
	h->seq = b->seq;
	h->ts_unix_ns = b->ts_unix_ns;
	h->tick = b->tick;
	kvpool__v1__event_batch__free_unpacked(b, NULL);
	return rv;
}
