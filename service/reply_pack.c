/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Reply encoding. protobuf-c packs by walking descriptors, twice (size,
 * then bytes): on the S256 step (a Batch of 272 request calls) its packer
 * was a fifth of the daemon's instructions outside hashing. A Batch reply
 * is therefore written by hand for the sub-replies a scheduler step is
 * made of (AllocateSlots, FreeRequest, GetComputedBlocks, and failed calls
 * that carry only a status and detail); any other sub-reply is packed by
 * protobuf-c in its place. The bytes are protobuf-c's own for the same
 * message (tests/test_reply_encoding.c compares them).
 */
#include <string.h>

#include "common/kvp_status.h"
#include "proto/pb_write.h"
#include "service/dispatch.h"

/* Reply fields (kvpool.proto). */
enum {
	F_CALL_ID = 1,
	F_STATUS = 2,
	F_DETAIL = 3,
	F_ALLOCATE_SLOTS = 19,
	F_FREE_REQUEST = 20,
	F_GET_COMPUTED = 21,
	F_BATCH = 22,
};

static size_t
i32s_len(const int32_t *v, size_t n)
{
	size_t len = 0;
	for (size_t i = 0; i < n; i++)
		len += v[i] >= 0 && v[i] < 128 ? 1 : kvp_pb_varint_len(kvp_pb_int32(v[i]));
	return len;
}

static size_t
u32s_len(const uint32_t *v, size_t n)
{
	size_t len = 0;
	for (size_t i = 0; i < n; i++)
		len += kvp_pb_varint_len(v[i]);
	return len;
}

/* A packed repeated field: absent when empty. */
static size_t
packed_len(uint32_t field, size_t payload, size_t n)
{
	return n ? kvp_pb_len_field(field, payload) : 0;
}

static uint8_t *
put_i32s(uint8_t *p, uint32_t field, const int32_t *v, size_t n, size_t payload)
{
	if (n == 0)
		return p;
	p = kvp_pb_put_tag(p, field, KVP_PB_LEN);
	p = kvp_pb_put_varint(p, payload);
	for (size_t i = 0; i < n; i++)
		p = kvp_pb_put_varint(p, kvp_pb_int32(v[i]));
	return p;
}

static uint8_t *
put_u32s(uint8_t *p, uint32_t field, const uint32_t *v, size_t n, size_t payload)
{
	if (n == 0)
		return p;
	p = kvp_pb_put_tag(p, field, KVP_PB_LEN);
	p = kvp_pb_put_varint(p, payload);
	for (size_t i = 0; i < n; i++)
		p = kvp_pb_put_varint(p, v[i]);
	return p;
}

static bool
by_hand(const Kvpool__V1__Reply *r)
{
	return r->result_case == KVPOOL__V1__REPLY__RESULT__NOT_SET ||
	       r->result_case == KVPOOL__V1__REPLY__RESULT_ALLOCATE_SLOTS ||
	       r->result_case == KVPOOL__V1__REPLY__RESULT_FREE_REQUEST ||
	       r->result_case == KVPOOL__V1__REPLY__RESULT_GET_COMPUTED_BLOCKS;
}

/* The result message's body length (hand-written kinds only). */
static size_t
result_len(const Kvpool__V1__Reply *r, size_t *ids_len, size_t *per_len)
{
	*ids_len = *per_len = 0;
	switch (r->result_case) {
	case KVPOOL__V1__REPLY__RESULT_ALLOCATE_SLOTS: {
		const Kvpool__V1__AllocateSlotsReply *a = r->allocate_slots;
		*ids_len = i32s_len(a->new_block_ids, a->n_new_block_ids);
		*per_len = u32s_len(a->new_blocks_per_group, a->n_new_blocks_per_group);
		size_t ext_len = u32s_len(a->external_blocks_per_group, a->n_external_blocks_per_group);
		return kvp_pb_varint_field(1, a->hit_tokens) +
		       packed_len(2, *ids_len, a->n_new_block_ids) +
		       packed_len(3, *per_len, a->n_new_blocks_per_group) +
		       kvp_pb_varint_field(4, a->num_scheduled_tokens) +
		       kvp_pb_varint_field(5, a->num_computed_tokens) +
		       packed_len(6, ext_len, a->n_external_blocks_per_group);
	}
	case KVPOOL__V1__REPLY__RESULT_GET_COMPUTED_BLOCKS: {
		const Kvpool__V1__GetComputedBlocksReply *g = r->get_computed_blocks;
		*ids_len = i32s_len(g->block_ids, g->n_block_ids);
		return kvp_pb_varint_field(1, g->hit_tokens) + packed_len(2, *ids_len, g->n_block_ids);
	}
	default:
		return 0; /* FreeRequestReply has no fields */
	}
}

static uint32_t
result_field(const Kvpool__V1__Reply *r)
{
	return r->result_case == KVPOOL__V1__REPLY__RESULT_ALLOCATE_SLOTS ? F_ALLOCATE_SLOTS
	       : r->result_case == KVPOOL__V1__REPLY__RESULT_FREE_REQUEST ? F_FREE_REQUEST
	                                                                   : F_GET_COMPUTED;
}

/* A Reply's fields before its result: call_id, status, detail. */
static size_t
head_len(const Kvpool__V1__Reply *r)
{
	size_t dl = r->detail ? strlen(r->detail) : 0;
	return kvp_pb_varint_field(F_CALL_ID, r->call_id) +
	       kvp_pb_varint_field(F_STATUS, kvp_pb_int32((int32_t)r->status)) +
	       (dl ? kvp_pb_len_field(F_DETAIL, dl) : 0);
}

static uint8_t *
put_head(uint8_t *p, const Kvpool__V1__Reply *r)
{
	size_t dl = r->detail ? strlen(r->detail) : 0;
	p = kvp_pb_put_varint_field(p, F_CALL_ID, r->call_id);
	p = kvp_pb_put_varint_field(p, F_STATUS, kvp_pb_int32((int32_t)r->status));
	if (dl) {
		p = kvp_pb_put_tag(p, F_DETAIL, KVP_PB_LEN);
		p = kvp_pb_put_varint(p, dl);
		memcpy(p, r->detail, dl);
		p += dl;
	}
	return p;
}

/* One sub-reply's encoded length. */
static size_t
sub_len(const Kvpool__V1__Reply *r)
{
	size_t ids, per;
	if (!by_hand(r))
		return kvpool__v1__reply__get_packed_size(r);
	size_t len = head_len(r);
	if (r->result_case != KVPOOL__V1__REPLY__RESULT__NOT_SET)
		len += kvp_pb_len_field(result_field(r), result_len(r, &ids, &per));
	return len;
}

static uint8_t *
put_sub(uint8_t *p, const Kvpool__V1__Reply *r)
{
	size_t ids, per, len;
	if (!by_hand(r))
		return p + kvpool__v1__reply__pack(r, p);
	p = put_head(p, r);
	if (r->result_case == KVPOOL__V1__REPLY__RESULT__NOT_SET)
		return p;
	len = result_len(r, &ids, &per);
	p = kvp_pb_put_tag(p, result_field(r), KVP_PB_LEN);
	p = kvp_pb_put_varint(p, len);
	if (r->result_case == KVPOOL__V1__REPLY__RESULT_ALLOCATE_SLOTS) {
		const Kvpool__V1__AllocateSlotsReply *a = r->allocate_slots;
		p = kvp_pb_put_varint_field(p, 1, a->hit_tokens);
		p = put_i32s(p, 2, a->new_block_ids, a->n_new_block_ids, ids);
		p = put_u32s(p, 3, a->new_blocks_per_group, a->n_new_blocks_per_group, per);
		p = kvp_pb_put_varint_field(p, 4, a->num_scheduled_tokens);
		p = kvp_pb_put_varint_field(p, 5, a->num_computed_tokens);
		p = put_u32s(p, 6, a->external_blocks_per_group, a->n_external_blocks_per_group,
		             u32s_len(a->external_blocks_per_group, a->n_external_blocks_per_group));
	} else if (r->result_case == KVPOOL__V1__REPLY__RESULT_GET_COMPUTED_BLOCKS) {
		const Kvpool__V1__GetComputedBlocksReply *g = r->get_computed_blocks;
		p = kvp_pb_put_varint_field(p, 1, g->hit_tokens);
		p = put_i32s(p, 2, g->block_ids, g->n_block_ids, ids);
	}
	return p;
}

int
kvpd_pack_reply(const Kvpool__V1__Reply *r, struct kvpd_sink *sink)
{
	if (r->result_case != KVPOOL__V1__REPLY__RESULT_BATCH) {
		size_t n = kvpool__v1__reply__get_packed_size(r);
		uint8_t *buf = sink->alloc(sink->ctx, n);
		if (buf == NULL)
			return KVP_ENOMEM;
		sink->buf = buf;
		sink->len = kvpool__v1__reply__pack(r, buf);
		return KVP_OK;
	}
	/* Reply{head, batch = 22 {replies = 1 (repeated Reply)}}. */
	const Kvpool__V1__BatchReply *b = r->batch;
	size_t inner = 0;
	for (size_t i = 0; i < b->n_replies; i++)
		inner += kvp_pb_len_field(1, sub_len(b->replies[i]));
	size_t total = head_len(r) + kvp_pb_len_field(F_BATCH, inner);
	uint8_t *buf = sink->alloc(sink->ctx, total), *p;
	if (buf == NULL)
		return KVP_ENOMEM;
	p = put_head(buf, r);
	p = kvp_pb_put_tag(p, F_BATCH, KVP_PB_LEN);
	p = kvp_pb_put_varint(p, inner);
	for (size_t i = 0; i < b->n_replies; i++) {
		p = kvp_pb_put_tag(p, 1, KVP_PB_LEN);
		p = kvp_pb_put_varint(p, sub_len(b->replies[i]));
		p = put_sub(p, b->replies[i]);
	}
	sink->buf = buf;
	sink->len = (size_t)(p - buf);
	return KVP_OK;
}
