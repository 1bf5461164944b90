/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Reply encoding. protobuf-c packs by walking descriptors, twice (size,
 * then bytes): on the S256 step (a Batch of 272 request calls) its packer
 * was a fifth of the daemon's instructions outside hashing, and on the
 * batched block-level cycle (kvp-bench-service --only-core) reply packing
 * was a third. A Batch reply is therefore written by hand for the
 * sub-replies a Batch carries on its hot paths (Allocate, Touch, Free,
 * Cache, Lookup, Evict, AllocateSlots, FreeRequest, GetComputedBlocks,
 * slots runs, and failed calls that carry only a status and detail); any
 * other sub-reply (Stats) is packed by protobuf-c in its place. A oneof
 * member's field number is protobuf-c's result_case value. The bytes are protobuf-c's own for the same
 * message (tests/test_reply_encoding.c compares them).
 */
#include <string.h>

#include "common/kvp_status.h"
#include "proto/pb_write.h"
#include "service/rpc/dispatch.h"

/* Reply fields (kvpool.proto). */
enum {
	F_CALL_ID = 1,
	F_STATUS = 2,
	F_DETAIL = 3,
	F_BATCH = 22,
};

/* The result kinds written by hand; any other kind is protobuf-c's. */
static bool
by_hand(const Kvpool__V1__Reply *r)
{
	switch (r->result_case) {
	case KVPOOL__V1__REPLY__RESULT__NOT_SET:
	case KVPOOL__V1__REPLY__RESULT_ALLOCATE:
	case KVPOOL__V1__REPLY__RESULT_TOUCH:
	case KVPOOL__V1__REPLY__RESULT_FREE:
	case KVPOOL__V1__REPLY__RESULT_CACHE:
	case KVPOOL__V1__REPLY__RESULT_LOOKUP:
	case KVPOOL__V1__REPLY__RESULT_EVICT:
	case KVPOOL__V1__REPLY__RESULT_ALLOCATE_SLOTS:
	case KVPOOL__V1__REPLY__RESULT_FREE_REQUEST:
	case KVPOOL__V1__REPLY__RESULT_GET_COMPUTED_BLOCKS:
	case KVPOOL__V1__REPLY__RESULT_SLOTS_RUN:
		return true;
	default:
		return false;
	}
}

/* The payload lengths of a result's packed arrays, in field order, kept for writing. */
struct parts {
	size_t len[5];
};

/* The result message's body length (hand-written kinds only). */
static size_t
result_len(const Kvpool__V1__Reply *r, struct parts *pt)
{
	size_t *l = pt->len;
	switch (r->result_case) {
	case KVPOOL__V1__REPLY__RESULT_ALLOCATE: {
		const Kvpool__V1__AllocateReply *a = r->allocate;
		l[0] = kvp_pb_i32s_len(a->block_ids, a->n_block_ids);
		return kvp_pb_packed_len(1, l[0], a->n_block_ids);
	}
	case KVPOOL__V1__REPLY__RESULT_CACHE:
		return kvp_pb_varint_field(1, r->cache->num_stored);
	case KVPOOL__V1__REPLY__RESULT_EVICT:
		return kvp_pb_varint_field(1, r->evict->num_evicted);
	case KVPOOL__V1__REPLY__RESULT_LOOKUP: {
		const Kvpool__V1__LookupReply *k = r->lookup;
		l[0] = kvp_pb_i32s_len(k->block_ids, k->n_block_ids);
		l[1] = kvp_pb_u32s_len(k->ref_cnts, k->n_ref_cnts);
		return kvp_pb_varint_field(1, k->num_hit_blocks) +
		       kvp_pb_packed_len(2, l[0], k->n_block_ids) + kvp_pb_varint_field(3, k->hit_tokens) +
		       kvp_pb_packed_len(4, k->block_hashes.len, k->block_hashes.len) +
		       kvp_pb_packed_len(5, l[1], k->n_ref_cnts);
	}
	case KVPOOL__V1__REPLY__RESULT_ALLOCATE_SLOTS: {
		const Kvpool__V1__AllocateSlotsReply *a = r->allocate_slots;
		l[0] = kvp_pb_i32s_len(a->new_block_ids, a->n_new_block_ids);
		l[1] = kvp_pb_u32s_len(a->new_blocks_per_group, a->n_new_blocks_per_group);
		l[2] = kvp_pb_u32s_len(a->external_blocks_per_group, a->n_external_blocks_per_group);
		return kvp_pb_varint_field(1, a->hit_tokens) +
		       kvp_pb_packed_len(2, l[0], a->n_new_block_ids) +
		       kvp_pb_packed_len(3, l[1], a->n_new_blocks_per_group) +
		       kvp_pb_varint_field(4, a->num_scheduled_tokens) +
		       kvp_pb_varint_field(5, a->num_computed_tokens) +
		       kvp_pb_packed_len(6, l[2], a->n_external_blocks_per_group);
	}
	case KVPOOL__V1__REPLY__RESULT_GET_COMPUTED_BLOCKS: {
		const Kvpool__V1__GetComputedBlocksReply *g = r->get_computed_blocks;
		l[0] = kvp_pb_i32s_len(g->block_ids, g->n_block_ids);
		return kvp_pb_varint_field(1, g->hit_tokens) + kvp_pb_packed_len(2, l[0], g->n_block_ids);
	}
	case KVPOOL__V1__REPLY__RESULT_SLOTS_RUN: {
		const Kvpool__V1__SlotsRunReply *u = r->slots_run;
		size_t details = 0;
		/* Status is an int-sized enum: its values are int32 varints. */
		l[0] = kvp_pb_i32s_len((const int32_t *)u->statuses, u->n_statuses);
		l[1] = kvp_pb_u32s_len(u->num_scheduled_tokens, u->n_num_scheduled_tokens);
		l[2] = kvp_pb_u32s_len(u->num_computed_tokens, u->n_num_computed_tokens);
		l[3] = kvp_pb_u32s_len(u->new_blocks_per_group, u->n_new_blocks_per_group);
		l[4] = kvp_pb_i32s_len(u->new_block_ids, u->n_new_block_ids);
		for (size_t i = 0; i < u->n_details; i++) /* repeated strings: every one, empty too */
			details += kvp_pb_len_field(7, strlen(u->details[i]));
		return kvp_pb_packed_len(1, l[0], u->n_statuses) +
		       kvp_pb_packed_len(2, l[1], u->n_num_scheduled_tokens) +
		       kvp_pb_packed_len(3, l[2], u->n_num_computed_tokens) +
		       kvp_pb_varint_field(4, u->num_groups) +
		       kvp_pb_packed_len(5, l[3], u->n_new_blocks_per_group) +
		       kvp_pb_packed_len(6, l[4], u->n_new_block_ids) + details;
	}
	default:
		return 0; /* TouchReply, FreeReply, FreeRequestReply: no fields */
	}
}

/* The result's body, its lengths from result_len. */
static uint8_t *
put_result(uint8_t *p, const Kvpool__V1__Reply *r, const struct parts *pt)
{
	const size_t *l = pt->len;
	switch (r->result_case) {
	case KVPOOL__V1__REPLY__RESULT_ALLOCATE:
		return kvp_pb_put_i32s(p, 1, r->allocate->block_ids, r->allocate->n_block_ids, l[0]);
	case KVPOOL__V1__REPLY__RESULT_CACHE:
		return kvp_pb_put_varint_field(p, 1, r->cache->num_stored);
	case KVPOOL__V1__REPLY__RESULT_EVICT:
		return kvp_pb_put_varint_field(p, 1, r->evict->num_evicted);
	case KVPOOL__V1__REPLY__RESULT_LOOKUP: {
		const Kvpool__V1__LookupReply *k = r->lookup;
		p = kvp_pb_put_varint_field(p, 1, k->num_hit_blocks);
		p = kvp_pb_put_i32s(p, 2, k->block_ids, k->n_block_ids, l[0]);
		p = kvp_pb_put_varint_field(p, 3, k->hit_tokens);
		if (k->block_hashes.len) /* proto3 bytes: absent when empty */
			p = kvp_pb_put_bytes(p, 4, k->block_hashes.data, k->block_hashes.len);
		return kvp_pb_put_u32s(p, 5, k->ref_cnts, k->n_ref_cnts, l[1]);
	}
	case KVPOOL__V1__REPLY__RESULT_ALLOCATE_SLOTS: {
		const Kvpool__V1__AllocateSlotsReply *a = r->allocate_slots;
		p = kvp_pb_put_varint_field(p, 1, a->hit_tokens);
		p = kvp_pb_put_i32s(p, 2, a->new_block_ids, a->n_new_block_ids, l[0]);
		p = kvp_pb_put_u32s(p, 3, a->new_blocks_per_group, a->n_new_blocks_per_group, l[1]);
		p = kvp_pb_put_varint_field(p, 4, a->num_scheduled_tokens);
		p = kvp_pb_put_varint_field(p, 5, a->num_computed_tokens);
		return kvp_pb_put_u32s(p, 6, a->external_blocks_per_group, a->n_external_blocks_per_group,
		                l[2]);
	}
	case KVPOOL__V1__REPLY__RESULT_GET_COMPUTED_BLOCKS: {
		const Kvpool__V1__GetComputedBlocksReply *g = r->get_computed_blocks;
		p = kvp_pb_put_varint_field(p, 1, g->hit_tokens);
		return kvp_pb_put_i32s(p, 2, g->block_ids, g->n_block_ids, l[0]);
	}
	case KVPOOL__V1__REPLY__RESULT_SLOTS_RUN: {
		const Kvpool__V1__SlotsRunReply *u = r->slots_run;
		p = kvp_pb_put_i32s(p, 1, (const int32_t *)u->statuses, u->n_statuses, l[0]);
		p = kvp_pb_put_u32s(p, 2, u->num_scheduled_tokens, u->n_num_scheduled_tokens, l[1]);
		p = kvp_pb_put_u32s(p, 3, u->num_computed_tokens, u->n_num_computed_tokens, l[2]);
		p = kvp_pb_put_varint_field(p, 4, u->num_groups);
		p = kvp_pb_put_u32s(p, 5, u->new_blocks_per_group, u->n_new_blocks_per_group, l[3]);
		p = kvp_pb_put_i32s(p, 6, u->new_block_ids, u->n_new_block_ids, l[4]);
		for (size_t i = 0; i < u->n_details; i++)
			p = kvp_pb_put_bytes(p, 7, u->details[i], strlen(u->details[i]));
		return p;
	}
	default:
		return p;
	}
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
	return dl ? kvp_pb_put_bytes(p, F_DETAIL, r->detail, dl) : p;
}

/* A sub-reply's lengths, measured once and kept for writing it. */
struct sub {
	size_t len;     /* the whole sub-reply */
	size_t rlen;    /* its result message's body (hand-written kinds) */
	struct parts pt; /* the result's packed arrays */
};

/* One sub-reply's encoded length, its parts kept in *m. */
static size_t
sub_len(const Kvpool__V1__Reply *r, struct sub *m)
{
	m->rlen = 0;
	if (!by_hand(r))
		return m->len = kvpool__v1__reply__get_packed_size(r);
	size_t len = head_len(r);
	if (r->result_case != KVPOOL__V1__REPLY__RESULT__NOT_SET) {
		m->rlen = result_len(r, &m->pt);
		len += kvp_pb_len_field((uint32_t)r->result_case, m->rlen);
	}
	return m->len = len;
}

/* A sub-reply's bytes, its lengths from sub_len. */
static uint8_t *
put_sub(uint8_t *p, const Kvpool__V1__Reply *r, const struct sub *m)
{
	if (!by_hand(r))
		return p + kvpool__v1__reply__pack(r, p);
	p = put_head(p, r);
	if (r->result_case == KVPOOL__V1__REPLY__RESULT__NOT_SET)
		return p;
	p = kvp_pb_put_tag(p, (uint32_t)r->result_case, KVP_PB_LEN);
	p = kvp_pb_put_varint(p, m->rlen);
	return put_result(p, r, &m->pt);
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
	/*
	 * Reply{head, batch = 22 {replies = 1 (repeated Reply)}}. Each sub-reply's
	 * lengths are needed twice (in the total, then as its bytes are
	 * written): the first KEPT are kept, the rest measured again.
	 */
	enum { KEPT = 512 };
	struct sub kept[KEPT], m;
	const Kvpool__V1__BatchReply *b = r->batch;
	size_t inner = 0;
	for (size_t i = 0; i < b->n_replies; i++)
		inner += kvp_pb_len_field(1, sub_len(b->replies[i], i < KEPT ? &kept[i] : &m));
	size_t total = head_len(r) + kvp_pb_len_field(F_BATCH, inner);
	uint8_t *buf = sink->alloc(sink->ctx, total), *p;
	if (buf == NULL)
		return KVP_ENOMEM;
	p = put_head(buf, r);
	p = kvp_pb_put_tag(p, F_BATCH, KVP_PB_LEN);
	p = kvp_pb_put_varint(p, inner);
	for (size_t i = 0; i < b->n_replies; i++) {
		const struct sub *sm = &m;
		if (i < KEPT)
			sm = &kept[i];
		else
			sub_len(b->replies[i], &m);
		p = kvp_pb_put_tag(p, 1, KVP_PB_LEN);
		p = kvp_pb_put_varint(p, sm->len);
		p = put_sub(p, b->replies[i], sm);
	}
	sink->buf = buf;
	sink->len = (size_t)(p - buf);
	return KVP_OK;
}
