/* SPDX-License-Identifier: Apache-2.0 */
#include "common/events.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "common/kvp_status.h"

#define NONE SIZE_MAX

struct kvp_event_rec {
	uint8_t type;
	bool has_lora_id, has_group, has_window;
	uint32_t num_hashes, hash_len, num_tokens, block_size, group_idx;
	int64_t lora_id, window;
	size_t hashes, parent, tokens, lora_name, session_id, medium, extra, extra_offsets;
	const char *spec_kind;
};

void
kvp_event_batch_init(struct kvp_event_batch *b)
{
	memset(b, 0, sizeof(*b));
}

void
kvp_event_batch_fini(struct kvp_event_batch *b)
{
	if (b == NULL)
		return;
	free(b->recs);
	free(b->data);
	memset(b, 0, sizeof(*b));
}

void
kvp_event_batch_clear(struct kvp_event_batch *b)
{
	b->count = 0;
	b->len = 0;
}

size_t
kvp_event_batch_count(const struct kvp_event_batch *b)
{
	return b->count;
}

void
kvp_event_batch_swap(struct kvp_event_batch *a, struct kvp_event_batch *b)
{
	struct kvp_event_batch t = *a;
	*a = *b;
	*b = t;
}

static inline size_t
align8(size_t n)
{
	return (n + 7) & ~(size_t)7;
}

int
kvp_event_batch_reserve(struct kvp_event_batch *b, size_t events, size_t bytes)
{
	if (b->count + events > b->rec_cap) {
		size_t cap = b->rec_cap ? b->rec_cap : 16;
		while (cap < b->count + events)
			cap *= 2;
		void *p = realloc(b->recs, cap * sizeof(*b->recs));
		if (p == NULL)
			return KVP_ENOMEM;
		b->recs = p;
		b->rec_cap = cap;
	}
	if (b->len + bytes > b->data_cap) {
		size_t cap = b->data_cap ? b->data_cap : 1024;
		while (cap < b->len + bytes)
			cap *= 2;
		void *p = realloc(b->data, cap);
		if (p == NULL)
			return KVP_ENOMEM;
		b->data = p;
		b->data_cap = cap;
	}
	return KVP_OK;
}

/* "" as None, for the fields vLLM writes as str | None. */
static const char *
opt_str(const char *s)
{
	return s && s[0] ? s : NULL;
}

static size_t
str_bytes(const char *s)
{
	return s ? align8(strlen(s) + 1) : 0;
}

size_t
kvp_event_removed_bytes(size_t hash_len, const char *medium)
{
	return align8(hash_len) + str_bytes(medium);
}

size_t
kvp_event_stored_bytes(size_t num_hashes, size_t hash_len, bool parent,
                       size_t num_tokens, const char *lora_name,
                       const char *session_id, const char *medium, size_t extra_bytes)
{
	return align8(num_tokens * sizeof(int64_t)) + (parent ? align8(hash_len) : 0) +
	       str_bytes(lora_name) + str_bytes(opt_str(session_id)) + str_bytes(medium) +
	       align8(num_hashes * hash_len) +
	       align8((num_hashes + 1) * sizeof(uint32_t)) + align8(extra_bytes);
}

/* Copies n bytes into the arena at an 8-aligned offset; returns the offset. */
static size_t
put(struct kvp_event_batch *b, const void *p, size_t n)
{
	size_t off = b->len;
	assert(off + align8(n) <= b->data_cap);
	if (n != 0 && p != NULL)
		memcpy(b->data + off, p, n);
	b->len = off + align8(n);
	return off;
}

static size_t
put_str(struct kvp_event_batch *b, const char *s)
{
	return s ? put(b, s, strlen(s) + 1) : NONE;
}

static struct kvp_event_rec *
new_rec(struct kvp_event_batch *b, enum kvp_event_type type)
{
	assert(b->count < b->rec_cap);
	struct kvp_event_rec *r = &b->recs[b->count++];
	memset(r, 0, sizeof(*r));
	r->type = (uint8_t)type;
	r->hashes = r->parent = r->tokens = r->lora_name = r->session_id = r->medium = NONE;
	r->extra = r->extra_offsets = NONE;
	return r;
}

void
kvp_event_append_removed(struct kvp_event_batch *b, const uint8_t *hash,
                         size_t hash_len, const char *medium, uint32_t group)
{
	struct kvp_event_rec *r = new_rec(b, KVP_EVENT_BLOCK_REMOVED);
	r->num_hashes = 1;
	r->hash_len = (uint32_t)hash_len;
	r->hashes = put(b, hash, hash_len);
	r->medium = put_str(b, medium);
	r->has_group = true;
	r->group_idx = group;
}

void
kvp_event_append_cleared(struct kvp_event_batch *b)
{
	(void)new_rec(b, KVP_EVENT_ALL_CLEARED);
}

void
kvp_event_stored_begin(struct kvp_event_batch *b, const struct kvp_stored_desc *d)
{
	struct kvp_event_rec *r = new_rec(b, KVP_EVENT_BLOCK_STORED);
	uint32_t zero = 0;

	r->hash_len = (uint32_t)d->hash_len;
	r->num_tokens = (uint32_t)d->num_tokens;
	r->tokens = put(b, d->token_ids, d->num_tokens * sizeof(int64_t));
	r->parent = d->parent ? put(b, d->parent, d->hash_len) : NONE;
	r->block_size = d->block_size;
	r->has_lora_id = d->has_lora_id;
	r->lora_id = d->lora_id;
	r->lora_name = put_str(b, d->lora_name);
	r->session_id = put_str(b, opt_str(d->session_id));
	r->medium = put_str(b, d->medium);
	r->has_group = true;
	r->group_idx = d->group_idx;
	/* Fixed regions for up to max_hashes; extra keys grow at the arena's end. */
	r->hashes = put(b, NULL, d->max_hashes * d->hash_len);
	r->extra_offsets = put(b, NULL, (d->max_hashes + 1) * sizeof(uint32_t));
	memcpy(b->data + r->extra_offsets, &zero, sizeof(zero));
	r->extra = b->len;
}

void
kvp_event_stored_add(struct kvp_event_batch *b, const uint8_t *hash,
                     const uint8_t *extra_cbor, size_t extra_len)
{
	struct kvp_event_rec *r = &b->recs[b->count - 1];
	uint32_t *offs = (uint32_t *)(void *)(b->data + r->extra_offsets);
	uint32_t end;

	assert(r->type == KVP_EVENT_BLOCK_STORED);
	memcpy(b->data + r->hashes + (size_t)r->num_hashes * r->hash_len, hash, r->hash_len);
	assert(b->len + extra_len <= b->data_cap);
	memcpy(b->data + b->len, extra_cbor, extra_len);
	b->len += extra_len;
	end = (uint32_t)(b->len - r->extra);
	r->num_hashes++;
	offs[r->num_hashes] = end;
}

void
kvp_event_stored_end(struct kvp_event_batch *b)
{
	b->len = align8(b->len);
}

int
kvp_event_batch_get(const struct kvp_event_batch *b, size_t i, struct kvp_event *ev)
{
	const struct kvp_event_rec *r;

	if (i >= b->count)
		return KVP_EINVAL;
	r = &b->recs[i];
	memset(ev, 0, sizeof(*ev));
#define PTR(off) ((off) == NONE ? NULL : (const void *)(b->data + (off)))
	ev->type = (enum kvp_event_type)r->type;
	ev->num_hashes = r->num_hashes;
	ev->hash_len = r->hash_len;
	ev->hashes = PTR(r->hashes);
	ev->parent = PTR(r->parent);
	ev->token_ids = PTR(r->tokens);
	ev->num_tokens = r->num_tokens;
	ev->block_size = r->block_size;
	ev->has_lora_id = r->has_lora_id;
	ev->lora_id = r->lora_id;
	ev->lora_name = PTR(r->lora_name);
	ev->medium = PTR(r->medium);
	ev->session_id = PTR(r->session_id);
	ev->extra_keys = PTR(r->extra);
	ev->extra_key_offsets = PTR(r->extra_offsets);
	ev->has_group_idx = r->has_group;
	ev->group_idx = r->group_idx;
	ev->spec_kind = r->spec_kind;
	ev->has_sliding_window = r->has_window;
	ev->sliding_window = r->window;
#undef PTR
	return KVP_OK;
}

int
kvp_event_batch_set_spec(struct kvp_event_batch *b, size_t i, const char *kind,
                         bool has_window, int64_t window)
{
	if (i >= b->count || b->recs[i].type != KVP_EVENT_BLOCK_STORED)
		return KVP_EINVAL;
	b->recs[i].spec_kind = kind;
	b->recs[i].has_window = has_window;
	b->recs[i].window = window;
	return KVP_OK;
}
