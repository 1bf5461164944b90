/* SPDX-License-Identifier: Apache-2.0 */
#include "proto/event_wire.h"

#include <stdlib.h>
#include <string.h>

#include "common/block_hash.h"
#include "common/kvp_status.h"
#include "kvpool.pb-c.h"
#include "proto/pb_write.h"

/*
 * The encoder writes protobuf's bytes by hand, in two passes over the batch
 * (measure, then write), where protobuf-c's descriptor-driven packer spent
 * four fifths of an events-on step's encoding walking descriptors twice.
 * Every field follows proto3's rules as protobuf-c applies them: a scalar or
 * string absent when zero or empty, packed repeated scalars, each
 * extra_keys element present even when empty, and a oneof's message present
 * even when empty. tests/test_wire.c holds the bytes to protobuf-c's own.
 */

/* One event's measured lengths, kept from the measuring pass for the writing pass. */
struct ev_len {
	size_t msg;  /* the EventStored or EventRemoved (or EventCleared) payload */
	size_t ids;  /* hash_ids' packed payload */
	size_t toks; /* token_ids' packed payload */
};

enum { F_STORED = 1, F_REMOVED = 2, F_CLEARED = 3, F_EVENTS = 5 };

static size_t
str_field(uint32_t field, const char *s)
{
	return s && s[0] ? kvp_pb_len_field(field, strlen(s)) : 0;
}

static uint8_t *
put_str(uint8_t *p, uint32_t field, const char *s)
{
	return s && s[0] ? kvp_pb_put_bytes(p, field, s, strlen(s)) : p;
}

static size_t
hash_ids_len(const struct kvp_event *ev)
{
	size_t len = 0;
	for (uint32_t h = 0; h < ev->num_hashes; h++)
		len += kvp_pb_varint_len(kvp_hash_event_id(ev->hashes + (size_t)h * ev->hash_len,
		                                           ev->hash_len));
	return len;
}

static uint8_t *
put_hash_ids(uint8_t *p, uint32_t field, const struct kvp_event *ev, size_t payload)
{
	if (ev->num_hashes == 0)
		return p;
	p = kvp_pb_put_len_head(p, field, payload);
	for (uint32_t h = 0; h < ev->num_hashes; h++)
		p = kvp_pb_put_varint(p, kvp_hash_event_id(ev->hashes + (size_t)h * ev->hash_len,
		                                           ev->hash_len));
	return p;
}

static size_t
extra_len(const struct kvp_event *ev, uint32_t h)
{
	return ev->extra_key_offsets[h + 1] - ev->extra_key_offsets[h];
}

/* The event's message payload (EventStored's fields 1-18, EventRemoved's 1-5). */
static size_t
measure_event(const struct kvp_event *ev, struct ev_len *z)
{
	size_t hb = (size_t)ev->num_hashes * ev->hash_len, len;

	z->ids = z->toks = 0;
	if (ev->type != KVP_EVENT_BLOCK_STORED && ev->type != KVP_EVENT_BLOCK_REMOVED)
		return z->msg = 0; /* EventCleared has no fields */
	z->ids = hash_ids_len(ev);
	len = (hb ? kvp_pb_len_field(1, hb) : 0) + kvp_pb_varint_field(2, ev->hash_len) +
	      kvp_pb_packed_len(3, z->ids, ev->num_hashes);
	if (ev->type == KVP_EVENT_BLOCK_REMOVED)
		return z->msg = len + str_field(4, ev->medium) + kvp_pb_varint_field(5, ev->group_idx);
	if (ev->parent) {
		len += 2 + (ev->hash_len ? kvp_pb_len_field(5, ev->hash_len) : 0) +
		       kvp_pb_varint_field(6, kvp_hash_event_id(ev->parent, ev->hash_len));
	}
	for (uint32_t t = 0; t < ev->num_tokens; t++)
		z->toks += kvp_pb_varint_len((uint64_t)ev->token_ids[t]);
	len += kvp_pb_packed_len(7, z->toks, ev->num_tokens) +
	       kvp_pb_varint_field(8, ev->block_size) + (ev->has_lora_id ? 2 : 0) +
	       kvp_pb_varint_field(10, (uint64_t)ev->lora_id) + str_field(11, ev->medium) +
	       str_field(12, ev->lora_name);
	for (uint32_t h = 0; h < ev->num_hashes; h++)
		len += kvp_pb_len_field(13, extra_len(ev, h));
	return z->msg = len + kvp_pb_varint_field(14, ev->group_idx) +
	                str_field(15, ev->spec_kind) + (ev->has_sliding_window ? 3 : 0) +
	                kvp_pb_varint_field(17, (uint64_t)ev->sliding_window) +
	                str_field(18, ev->session_id);
}

static uint8_t *
put_event(uint8_t *p, const struct kvp_event *ev, const struct ev_len *z)
{
	size_t hb = (size_t)ev->num_hashes * ev->hash_len;
	uint32_t which = ev->type == KVP_EVENT_BLOCK_STORED    ? F_STORED
	                 : ev->type == KVP_EVENT_BLOCK_REMOVED ? F_REMOVED
	                                                       : F_CLEARED;

	p = kvp_pb_put_len_head(p, which, z->msg);
	if (which == F_CLEARED)
		return p;
	if (hb)
		p = kvp_pb_put_bytes(p, 1, ev->hashes, hb);
	p = kvp_pb_put_varint_field(p, 2, ev->hash_len);
	p = put_hash_ids(p, 3, ev, z->ids);
	if (which == F_REMOVED) {
		p = put_str(p, 4, ev->medium);
		return kvp_pb_put_varint_field(p, 5, ev->group_idx);
	}
	if (ev->parent) {
		p = kvp_pb_put_varint_field(p, 4, 1);
		if (ev->hash_len)
			p = kvp_pb_put_bytes(p, 5, ev->parent, ev->hash_len);
		p = kvp_pb_put_varint_field(p, 6, kvp_hash_event_id(ev->parent, ev->hash_len));
	}
	if (ev->num_tokens) {
		p = kvp_pb_put_len_head(p, 7, z->toks);
		for (uint32_t t = 0; t < ev->num_tokens; t++)
			p = kvp_pb_put_varint(p, (uint64_t)ev->token_ids[t]);
	}
	p = kvp_pb_put_varint_field(p, 8, ev->block_size);
	p = kvp_pb_put_varint_field(p, 9, ev->has_lora_id);
	p = kvp_pb_put_varint_field(p, 10, (uint64_t)ev->lora_id);
	p = put_str(p, 11, ev->medium);
	p = put_str(p, 12, ev->lora_name);
	for (uint32_t h = 0; h < ev->num_hashes; h++)
		p = kvp_pb_put_bytes(p, 13, ev->extra_keys + ev->extra_key_offsets[h], extra_len(ev, h));
	p = kvp_pb_put_varint_field(p, 14, ev->group_idx);
	p = put_str(p, 15, ev->spec_kind);
	p = kvp_pb_put_varint_field(p, 16, ev->has_sliding_window);
	p = kvp_pb_put_varint_field(p, 17, (uint64_t)ev->sliding_window);
	return put_str(p, 18, ev->session_id);
}

int
kvp_wire_events_encode(const char *pool, const struct kvp_wire_batch_hdr *h,
                       const struct kvp_event_batch *eb, uint8_t **out, size_t *len)
{
	struct ev_len one, *z = &one;
	struct kvp_event ev;
	size_t n, total;
	uint8_t *buf, *p;

	if (pool == NULL || h == NULL || out == NULL || len == NULL ||
	    strlen(pool) > KVP_WIRE_EVENTS_MAX_POOL)
		return KVP_EINVAL;
	n = h->tick || eb == NULL ? 0 : kvp_event_batch_count(eb);
	if (n > 1 && (z = malloc(n * sizeof(*z))) == NULL)
		return KVP_ENOMEM;
	total = str_field(1, pool) + kvp_pb_varint_field(2, h->epoch) +
	        kvp_pb_varint_field(3, h->seq) + kvp_pb_varint_field(4, h->ts_unix_ns) +
	        (h->tick ? 2 : 0);
	for (size_t i = 0; i < n; i++) {
		(void)kvp_event_batch_get(eb, i, &ev);
		size_t msg = measure_event(&ev, &z[i]);
		total += kvp_pb_len_field(F_EVENTS, kvp_pb_len_field(F_STORED, msg));
	}
	if ((buf = malloc(total ? total : 1)) == NULL) {
		if (z != &one)
			free(z);
		return KVP_ENOMEM;
	}
	p = put_str(buf, 1, pool);
	p = kvp_pb_put_varint_field(p, 2, h->epoch);
	p = kvp_pb_put_varint_field(p, 3, h->seq);
	p = kvp_pb_put_varint_field(p, 4, h->ts_unix_ns);
	for (size_t i = 0; i < n; i++) {
		(void)kvp_event_batch_get(eb, i, &ev);
		p = kvp_pb_put_len_head(p, F_EVENTS, kvp_pb_len_field(F_STORED, z[i].msg));
		p = put_event(p, &ev, &z[i]);
	}
	p = kvp_pb_put_varint_field(p, 6, h->tick);
	if (z != &one)
		free(z);
	if ((size_t)(p - buf) != total) { /* a measure that disagrees with the bytes: our bug */
		free(buf);
		return KVP_EINTERNAL;
	}
	*out = buf;
	*len = total;
	return KVP_OK;
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
	                                                   m->session_id, medium, extra)) != KVP_OK)
		return KVP_ENOMEM;
	struct kvp_stored_desc d = {
		.hash_len = hl, .parent = m->has_parent ? m->parent_hash.data : NULL,
		.token_ids = m->token_ids, .num_tokens = m->n_token_ids, .block_size = m->block_size,
		.has_lora_id = m->has_lora_id, .lora_id = m->lora_id, .lora_name = lora,
		.session_id = m->session_id, .medium = medium, .group_idx = m->group_idx, .max_hashes = n,
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
