/* SPDX-License-Identifier: Apache-2.0 */
/* request_pack.c: Batch requests written by hand; see the header. */
#include "clients/c/request_pack.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "proto/pb_write.h"

/* Request and BatchRequest fields (kvpool.proto). */
enum { F_CALL_ID = 1, F_POOL = 2, F_SESSION = 3, F_TOKEN = 4, F_BATCH = 22 };
enum { F_CALLS = 1, F_CONTINUE = 2 };

/* ---- fields (pb_write.h has the packed arrays) ---- */

static size_t
i64s_len(const int64_t *v, size_t n)
{
	return kvp_pb_u64s_len((const uint64_t *)(const void *)v, n); /* int64: two's complement */
}

static size_t
bytes_field(uint32_t field, const ProtobufCBinaryData *b)
{
	return b->len ? kvp_pb_len_field(field, b->len) : 0;
}

/* A proto3 bool: absent when false, 1 when true. */
static size_t
bool_field(uint32_t field, protobuf_c_boolean v)
{
	return kvp_pb_varint_field(field, v != 0);
}

/* True if every id fits a fixed32: in [0, 2^32). */
static bool
fits_u32(const int64_t *v, size_t n)
{
	uint64_t high = 0;
	for (size_t i = 0; i < n; i++)
		high |= (uint64_t)v[i] >> 32; /* a negative id has its high bits set */
	return high == 0;
}

/* n ids as a packed fixed32 field (little-endian), narrowed; absent when empty. */
static uint8_t *
put_u32_ids(uint8_t *p, uint32_t field, const int64_t *v, size_t n)
{
	if (n == 0)
		return p;
	p = kvp_pb_put_len_head(p, field, 4 * n);
	for (size_t i = 0; i < n; i++) {
		uint32_t x = (uint32_t)v[i];
		uint8_t b[4] = {(uint8_t)x, (uint8_t)(x >> 8), (uint8_t)(x >> 16), (uint8_t)(x >> 24)};
		memcpy(p + 4 * i, b, 4);
	}
	return p + 4 * n;
}

static uint8_t *
put_i64s(uint8_t *p, uint32_t field, const int64_t *v, size_t n, size_t payload)
{
	return kvp_pb_put_u64s(p, field, (const uint64_t *)(const void *)v, n, payload);
}

/* A proto3 bytes field: absent when empty. */
static uint8_t *
put_bytes(uint8_t *p, uint32_t field, const ProtobufCBinaryData *b)
{
	return b->len ? kvp_pb_put_bytes(p, field, b->data, b->len) : p;
}

static uint8_t *
put_bool(uint8_t *p, uint32_t field, protobuf_c_boolean v)
{
	return kvp_pb_put_varint_field(p, field, v != 0);
}

/*
 * A request's RequestKeys (LoRA, multimodal, salt), a small message packed
 * by protobuf-c in its place: present whenever set, as protobuf-c has it.
 * *len keeps its body's length for put_keys.
 */
static size_t
keys_field(uint32_t field, const Kvpool__V1__RequestKeys *k, size_t *len)
{
	*len = k ? kvpool__v1__request_keys__get_packed_size(k) : 0;
	return k ? kvp_pb_len_field(field, *len) : 0;
}

static uint8_t *
put_keys(uint8_t *p, uint32_t field, const Kvpool__V1__RequestKeys *k, size_t len)
{
	if (k == NULL)
		return p;
	p = kvp_pb_put_len_head(p, field, len);
	return p + kvpool__v1__request_keys__pack(k, p);
}

/* ---- one BatchCall ---- */

/*
 * The request message of call c, when it is written by hand; else NULL.
 * (A message's base is its first member: the pointer converts as is, and
 * NULL stays NULL.)
 */
static const ProtobufCMessage *
by_hand(const Kvpool__V1__BatchCall *c)
{
	const void *m;
	if (c->base.n_unknown_fields != 0)
		return NULL;
	switch (c->call_case) {
	case KVPOOL__V1__BATCH_CALL__CALL_ALLOCATE:
		m = c->allocate;
		break;
	case KVPOOL__V1__BATCH_CALL__CALL_TOUCH:
		m = c->touch;
		break;
	case KVPOOL__V1__BATCH_CALL__CALL_FREE:
		m = c->free;
		break;
	case KVPOOL__V1__BATCH_CALL__CALL_CACHE:
		m = c->cache;
		break;
	case KVPOOL__V1__BATCH_CALL__CALL_LOOKUP:
		m = c->lookup;
		break;
	case KVPOOL__V1__BATCH_CALL__CALL_ALLOCATE_SLOTS:
		/* (a prompt already in 32-bit ids is protobuf-c's to write) */
		m = c->allocate_slots && c->allocate_slots->n_prompt_token_ids_u32 == 0
		        ? c->allocate_slots
		        : NULL;
		break;
	case KVPOOL__V1__BATCH_CALL__CALL_FREE_REQUEST:
		m = c->free_request;
		break;
	case KVPOOL__V1__BATCH_CALL__CALL_GET_COMPUTED_BLOCKS:
		m = c->get_computed_blocks;
		break;
	case KVPOOL__V1__BATCH_CALL__CALL_SLOTS_RUN:
		m = c->slots_run;
		break;
	default:
		return NULL;
	}
	/* A member set to NULL is absent (protobuf-c's rule): protobuf-c writes that call. */
	const ProtobufCMessage *msg = m;
	return msg != NULL && msg->n_unknown_fields == 0 ? msg : NULL;
}

/* AllocateSlotsRequest's prompt as 32-bit ids (kvpc_plan.prompt_u32). */
enum { F_PROMPT_U32 = 13 };

/*
 * The request message's body length, its arrays' payloads kept in a. For
 * AllocateSlots, a[2] says whether its prompt goes as 32-bit ids (then
 * a[0] is that field's payload); for Cache, Lookup and AllocateSlots, a[3]
 * is their RequestKeys' body.
 */
static size_t
inner_len(const Kvpool__V1__BatchCall *c, size_t *a, int prompt_u32)
{
	switch (c->call_case) {
	case KVPOOL__V1__BATCH_CALL__CALL_ALLOCATE:
		return kvp_pb_varint_field(1, c->allocate->num_blocks);
	case KVPOOL__V1__BATCH_CALL__CALL_TOUCH:
		a[0] = kvp_pb_i32s_len(c->touch->block_ids, c->touch->n_block_ids);
		return kvp_pb_packed_len(1, a[0], c->touch->n_block_ids);
	case KVPOOL__V1__BATCH_CALL__CALL_FREE:
		a[0] = kvp_pb_i32s_len(c->free->block_ids, c->free->n_block_ids);
		return kvp_pb_packed_len(1, a[0], c->free->n_block_ids);
	case KVPOOL__V1__BATCH_CALL__CALL_CACHE: {
		const Kvpool__V1__CacheRequest *m = c->cache;
		a[0] = kvp_pb_i32s_len(m->block_ids, m->n_block_ids);
		a[1] = i64s_len(m->token_ids, m->n_token_ids);
		return kvp_pb_packed_len(1, a[0], m->n_block_ids) + kvp_pb_varint_field(2, m->num_cached_blocks) +
		       kvp_pb_varint_field(3, m->num_full_blocks) + kvp_pb_varint_field(4, m->group_id) +
		       kvp_pb_varint_field(5, m->block_size) + bytes_field(6, &m->block_hashes) +
		       kvp_pb_packed_len(7, a[1], m->n_token_ids) + keys_field(8, m->keys, &a[3]) +
		       bytes_field(9, &m->block_mask) + bytes_field(10, &m->parent_hash);
	}
	case KVPOOL__V1__BATCH_CALL__CALL_LOOKUP: {
		const Kvpool__V1__LookupRequest *m = c->lookup;
		a[0] = i64s_len(m->token_ids, m->n_token_ids);
		a[1] = kvp_pb_u32s_len(m->group_ids, m->n_group_ids);
		return bytes_field(1, &m->block_hashes) + kvp_pb_packed_len(2, a[0], m->n_token_ids) +
		       keys_field(3, m->keys, &a[3]) + kvp_pb_packed_len(4, a[1], m->n_group_ids) +
		       kvp_pb_varint_field(5, m->block_size);
	}
	case KVPOOL__V1__BATCH_CALL__CALL_ALLOCATE_SLOTS: {
		const Kvpool__V1__AllocateSlotsRequest *m = c->allocate_slots;
		size_t np = m->n_prompt_token_ids;
		a[2] = prompt_u32 && np > 0 && fits_u32(m->prompt_token_ids, np);
		a[0] = a[2] ? 4 * np : i64s_len(m->prompt_token_ids, np);
		a[1] = i64s_len(m->new_token_ids, m->n_new_token_ids);
		return kvp_pb_varint_field(1, m->request_id) +
		       kvp_pb_packed_len(a[2] ? F_PROMPT_U32 : 2, a[0], np) +
		       keys_field(3, m->keys, &a[3]) + kvp_pb_packed_len(4, a[1], m->n_new_token_ids) +
		       kvp_pb_varint_field(5, m->num_new_tokens) +
		       kvp_pb_varint_field(6, m->num_lookahead_tokens) +
		       bool_field(7, m->use_prefix_cache) + bool_field(8, m->delay_cache_blocks) +
		       kvp_pb_varint_field(9, m->token_budget) +
		       bool_field(10, m->full_sequence_must_fit) +
		       kvp_pb_varint_field(11, m->num_external_computed_tokens) +
		       bool_field(12, m->no_new_tokens) +
		       kvp_pb_varint_field(14, m->num_in_flight_tokens) +
		       kvp_pb_varint_field(15, m->num_encoder_tokens);
	}
	case KVPOOL__V1__BATCH_CALL__CALL_FREE_REQUEST:
		return kvp_pb_varint_field(1, c->free_request->request_id) +
		       bool_field(2, c->free_request->preempt);
	case KVPOOL__V1__BATCH_CALL__CALL_GET_COMPUTED_BLOCKS:
		return kvp_pb_varint_field(1, c->get_computed_blocks->request_id);
	case KVPOOL__V1__BATCH_CALL__CALL_SLOTS_RUN: {
		const Kvpool__V1__SlotsRunRequest *m = c->slots_run;
		a[0] = kvp_pb_u64s_len(m->request_ids, m->n_request_ids);
		a[1] = kvp_pb_u32s_len(m->num_new_tokens, m->n_num_new_tokens);
		a[2] = kvp_pb_u32s_len(m->num_token_ids, m->n_num_token_ids);
		a[3] = i64s_len(m->token_ids, m->n_token_ids);
		return kvp_pb_packed_len(1, a[0], m->n_request_ids) +
		       kvp_pb_packed_len(2, a[1], m->n_num_new_tokens) +
		       kvp_pb_packed_len(3, a[2], m->n_num_token_ids) +
		       kvp_pb_packed_len(4, a[3], m->n_token_ids) +
		       kvp_pb_varint_field(5, m->num_lookahead_tokens) +
		       bool_field(6, m->delay_cache_blocks);
	}
	default:
		return 0; /* not reached: by_hand() chose the kinds */
	}
}

static uint8_t *
put_inner(uint8_t *p, const Kvpool__V1__BatchCall *c, const size_t *a)
{
	switch (c->call_case) {
	case KVPOOL__V1__BATCH_CALL__CALL_ALLOCATE:
		return kvp_pb_put_varint_field(p, 1, c->allocate->num_blocks);
	case KVPOOL__V1__BATCH_CALL__CALL_TOUCH:
		return kvp_pb_put_i32s(p, 1, c->touch->block_ids, c->touch->n_block_ids, a[0]);
	case KVPOOL__V1__BATCH_CALL__CALL_FREE:
		return kvp_pb_put_i32s(p, 1, c->free->block_ids, c->free->n_block_ids, a[0]);
	case KVPOOL__V1__BATCH_CALL__CALL_CACHE: {
		const Kvpool__V1__CacheRequest *m = c->cache;
		p = kvp_pb_put_i32s(p, 1, m->block_ids, m->n_block_ids, a[0]);
		p = kvp_pb_put_varint_field(p, 2, m->num_cached_blocks);
		p = kvp_pb_put_varint_field(p, 3, m->num_full_blocks);
		p = kvp_pb_put_varint_field(p, 4, m->group_id);
		p = kvp_pb_put_varint_field(p, 5, m->block_size);
		p = put_bytes(p, 6, &m->block_hashes);
		p = put_i64s(p, 7, m->token_ids, m->n_token_ids, a[1]);
		p = put_keys(p, 8, m->keys, a[3]);
		p = put_bytes(p, 9, &m->block_mask);
		return put_bytes(p, 10, &m->parent_hash);
	}
	case KVPOOL__V1__BATCH_CALL__CALL_LOOKUP: {
		const Kvpool__V1__LookupRequest *m = c->lookup;
		p = put_bytes(p, 1, &m->block_hashes);
		p = put_i64s(p, 2, m->token_ids, m->n_token_ids, a[0]);
		p = put_keys(p, 3, m->keys, a[3]);
		p = kvp_pb_put_u32s(p, 4, m->group_ids, m->n_group_ids, a[1]);
		return kvp_pb_put_varint_field(p, 5, m->block_size);
	}
	case KVPOOL__V1__BATCH_CALL__CALL_ALLOCATE_SLOTS: {
		const Kvpool__V1__AllocateSlotsRequest *m = c->allocate_slots;
		p = kvp_pb_put_varint_field(p, 1, m->request_id);
		if (!a[2])
			p = put_i64s(p, 2, m->prompt_token_ids, m->n_prompt_token_ids, a[0]);
		p = put_keys(p, 3, m->keys, a[3]);
		p = put_i64s(p, 4, m->new_token_ids, m->n_new_token_ids, a[1]);
		p = kvp_pb_put_varint_field(p, 5, m->num_new_tokens);
		p = kvp_pb_put_varint_field(p, 6, m->num_lookahead_tokens);
		p = put_bool(p, 7, m->use_prefix_cache);
		p = put_bool(p, 8, m->delay_cache_blocks);
		p = kvp_pb_put_varint_field(p, 9, m->token_budget);
		p = put_bool(p, 10, m->full_sequence_must_fit);
		p = kvp_pb_put_varint_field(p, 11, m->num_external_computed_tokens);
		p = put_bool(p, 12, m->no_new_tokens);
		p = kvp_pb_put_varint_field(p, 14, m->num_in_flight_tokens);
		p = kvp_pb_put_varint_field(p, 15, m->num_encoder_tokens);
		return a[2] ? put_u32_ids(p, F_PROMPT_U32, m->prompt_token_ids, m->n_prompt_token_ids)
		            : p;
	}
	case KVPOOL__V1__BATCH_CALL__CALL_FREE_REQUEST:
		p = kvp_pb_put_varint_field(p, 1, c->free_request->request_id);
		return put_bool(p, 2, c->free_request->preempt);
	case KVPOOL__V1__BATCH_CALL__CALL_GET_COMPUTED_BLOCKS:
		return kvp_pb_put_varint_field(p, 1, c->get_computed_blocks->request_id);
	case KVPOOL__V1__BATCH_CALL__CALL_SLOTS_RUN: {
		const Kvpool__V1__SlotsRunRequest *m = c->slots_run;
		p = kvp_pb_put_u64s(p, 1, m->request_ids, m->n_request_ids, a[0]);
		p = kvp_pb_put_u32s(p, 2, m->num_new_tokens, m->n_num_new_tokens, a[1]);
		p = kvp_pb_put_u32s(p, 3, m->num_token_ids, m->n_num_token_ids, a[2]);
		p = put_i64s(p, 4, m->token_ids, m->n_token_ids, a[3]);
		p = kvp_pb_put_varint_field(p, 5, m->num_lookahead_tokens);
		return put_bool(p, 6, m->delay_cache_blocks);
	}
	default:
		return p;
	}
}

/* ---- the request ---- */

static bool
batch_by_hand(const Kvpool__V1__Request *rq)
{
	return rq->call_case == KVPOOL__V1__REQUEST__CALL_BATCH && rq->batch != NULL &&
	       rq->base.n_unknown_fields == 0 && rq->batch->base.n_unknown_fields == 0;
}

static size_t
head_len(const Kvpool__V1__Request *rq)
{
	size_t pool = rq->pool ? strlen(rq->pool) : 0;
	return kvp_pb_varint_field(F_CALL_ID, rq->call_id) +
	       (pool ? kvp_pb_len_field(F_POOL, pool) : 0) +
	       kvp_pb_varint_field(F_SESSION, rq->session_id) + bytes_field(F_TOKEN, &rq->token);
}

size_t
kvpc_request_size(const Kvpool__V1__Request *rq, struct kvpc_plan *plan)
{
	plan->by_hand = 0;
	if (!batch_by_hand(rq))
		return kvpool__v1__request__get_packed_size(rq);
	const Kvpool__V1__BatchRequest *b = rq->batch;
	if (b->n_calls > plan->cap) {
		size_t cap = plan->cap ? plan->cap : 64;
		while (cap < b->n_calls)
			cap *= 2;
		struct kvpc_call_plan *calls = realloc(plan->calls, cap * sizeof(*calls));
		if (calls == NULL) /* protobuf-c needs no room of ours */
			return kvpool__v1__request__get_packed_size(rq);
		plan->calls = calls;
		plan->cap = cap;
	}
	size_t body = 0;
	for (size_t i = 0; i < b->n_calls; i++) {
		const Kvpool__V1__BatchCall *c = b->calls[i];
		struct kvpc_call_plan *cp = &plan->calls[i];
		if (by_hand(c) != NULL) {
			cp->inner = inner_len(c, cp->arr, plan->prompt_u32);
			cp->len = kvp_pb_len_field((uint32_t)c->call_case, cp->inner);
		} else {
			cp->len = kvpool__v1__batch_call__get_packed_size(c);
		}
		body += kvp_pb_len_field(F_CALLS, cp->len);
	}
	plan->batch = body + bool_field(F_CONTINUE, b->continue_on_error);
	plan->by_hand = 1;
	return head_len(rq) + kvp_pb_len_field(F_BATCH, plan->batch);
}

size_t
kvpc_request_pack(const Kvpool__V1__Request *rq, const struct kvpc_plan *plan, uint8_t *buf)
{
	if (!plan->by_hand || !batch_by_hand(rq))
		return kvpool__v1__request__pack(rq, buf);
	const Kvpool__V1__BatchRequest *b = rq->batch;
	uint8_t *p = kvp_pb_put_varint_field(buf, F_CALL_ID, rq->call_id);
	size_t pool = rq->pool ? strlen(rq->pool) : 0;
	if (pool) {
		p = kvp_pb_put_len_head(p, F_POOL, pool);
		memcpy(p, rq->pool, pool);
		p += pool;
	}
	p = kvp_pb_put_varint_field(p, F_SESSION, rq->session_id);
	p = put_bytes(p, F_TOKEN, &rq->token);
	p = kvp_pb_put_len_head(p, F_BATCH, plan->batch);
	for (size_t i = 0; i < b->n_calls; i++) {
		const Kvpool__V1__BatchCall *c = b->calls[i];
		const struct kvpc_call_plan *cp = &plan->calls[i];
		p = kvp_pb_put_len_head(p, F_CALLS, cp->len);
		if (by_hand(c) != NULL) {
			p = kvp_pb_put_len_head(p, (uint32_t)c->call_case, cp->inner);
			p = put_inner(p, c, cp->arr);
		} else {
			p += kvpool__v1__batch_call__pack(c, p);
		}
	}
	p = put_bool(p, F_CONTINUE, b->continue_on_error);
	return (size_t)(p - buf);
}

void
kvpc_plan_fini(struct kvpc_plan *plan)
{
	free(plan->calls);
	plan->calls = NULL;
	plan->cap = 0;
}

uint32_t *
kvpc_prompt_u32(const int64_t *v, size_t n)
{
	uint32_t *w;
	if (v == NULL || n == 0 || !fits_u32(v, n) || (w = malloc(n * sizeof(*w))) == NULL)
		return NULL;
	for (size_t i = 0; i < n; i++)
		w[i] = (uint32_t)v[i];
	return w;
}
