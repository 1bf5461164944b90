/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Data-plane calls: block contents in the pool's executor.
 *
 * Rules (kvpool.proto says the same): writes go only to blocks this session
 * holds; WriteBlocks and a copy's destinations also refuse cached blocks,
 * whose content other requests share (copy first, then write the copy);
 * reads and a copy's sources take any block that is held or cached. The
 * executor then checks lengths, repeats and ranges before it writes.
 */
#include <stdio.h>
#include <string.h>

#include "proto/pb_write.h"
#include "service/call.h"
#include "gpu/executor.h"
#include "common/kvp_status.h"
#include "engine/pool.h"

/* Room for the reply's envelope and per-block checksums besides the payload. */
#define REPLY_OVERHEAD 4096u

static int
no_exec(struct call *c)
{
	if (c->p->exec == NULL)
		return kvpd_fail(c, KVP_ENOTSUP, "pool %s has no executor (executor=none)",
		                 c->p->cfg.name);
	return KVP_OK;
}

static bool
cached(struct call *c, int32_t id)
{
	size_t len = 0;
	return kvp_pool_block_key(c->p->pool, id, &len) != NULL && len > 0;
}

/* Every block held by this session; with exclusive, none of them cached. */
static int
writable(struct call *c, const int32_t *ids, size_t n, bool exclusive)
{
	for (size_t i = 0; i < n; i++) {
		if (kvpd_session_held(c->sess, ids[i]) == 0)
			return kvpd_fail(c, KVP_ENOTOWNER, "this session holds no reference on block %d",
			                 ids[i]);
		if (exclusive && cached(c, ids[i]))
			return kvpd_fail(c, KVP_ESTATE,
			                 "block %d is cached: its content is shared (copy it, then write)",
			                 ids[i]);
	}
	return KVP_OK;
}

/* Every block held by some session or cached: its content means something. */
static int
readable(struct call *c, const int32_t *ids, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (kvp_pool_ref_cnt(c->p->pool, ids[i]) <= 0 && !cached(c, ids[i]))
			return kvpd_fail(c, KVP_ESTATE, "block %d is free and not cached: nothing to read",
			                 ids[i]);
	return KVP_OK;
}

static int
exec_fail(struct call *c, int rv, const char *what)
{
	return kvpd_fail(c, rv, "%s: %s", what,
	                 kvp_exec_last_error(c->p->exec)[0] ? kvp_exec_last_error(c->p->exec)
	                                                    : kvp_strerror(rv));
}

int
kvpd_h_write_blocks(struct call *c, const Kvpool__V1__WriteBlocksRequest *m,
                    Kvpool__V1__Reply *out)
{
	Kvpool__V1__WriteBlocksReply *r;
	uint64_t bb;
	int rv;

	if ((rv = no_exec(c)) || (rv = kvpd_check_ids(c, m->block_ids, m->n_block_ids)) ||
	    (rv = writable(c, m->block_ids, m->n_block_ids, true)))
		return rv;
	bb = kvp_exec_block_bytes(c->p->exec);
	if (m->payload.len != m->n_block_ids * bb)
		return kvpd_fail(c, KVP_EINVAL, "payload of %zu bytes for %zu blocks of %llu bytes",
		                 m->payload.len, m->n_block_ids, (unsigned long long)bb);
	if (m->n_crc32c != 0 && m->n_crc32c != m->n_block_ids)
		return kvpd_fail(c, KVP_EINVAL, "%zu checksums for %zu blocks", m->n_crc32c,
		                 m->n_block_ids);
	for (size_t i = 0; i < m->n_crc32c; i++) {
		uint32_t crc = kvp_crc32c(0, m->payload.data + i * bb, bb);
		if (crc != m->crc32c[i])
			return kvpd_fail(c, KVP_EINVAL,
			                 "checksum of block %d (index %zu): sent %08x, payload has %08x",
			                 m->block_ids[i], i, m->crc32c[i], crc);
	}
	if ((r = NEW(c, Kvpool__V1__WriteBlocksReply, kvpool__v1__write_blocks_reply__descriptor)) ==
	    NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	rv = kvp_exec_write_blocks(c->p->exec, m->block_ids, m->n_block_ids, m->payload.data,
	                           m->payload.len);
	if (rv != KVP_OK)
		return exec_fail(c, rv, "write");
	c->p->counters.bytes_written += m->payload.len;
	r->num_written = (uint32_t)m->n_block_ids;
	out->result_case = KVPOOL__V1__REPLY__RESULT_WRITE_BLOCKS;
	out->write_blocks = r;
	return KVP_OK;
}

/*
 * Writes the whole successful ReadBlocks reply into the call's sink, the
 * executor reading the blocks straight into their place in the outgoing
 * message: Reply{call_id = 1, read_blocks = 28 {payload = 1, crc32c = 2
 * (packed fixed32)}}, the bytes protobuf-c would produce (test_reply_encoding
 * compares them).
 */
static int
read_in_place(struct call *c, const int32_t *ids, size_t n, uint64_t bb)
{
	uint64_t plen = n * bb, clen = 4 * (uint64_t)n;
	uint64_t inner = 1 + kvp_pb_varint_len(plen) + plen + 1 + kvp_pb_varint_len(clen) + clen;
	uint64_t total = (c->call_id ? 1 + kvp_pb_varint_len(c->call_id) : 0) + 2 + kvp_pb_varint_len(inner) + inner;
	uint8_t *buf = c->sink->alloc(c->sink->ctx, total), *p, *payload;
	int rv;

	if (buf == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	p = buf;
	if (c->call_id) {
		*p++ = 0x08; /* field 1, varint */
		p = kvp_pb_put_varint(p, c->call_id);
	}
	*p++ = 0xe2; /* field 28, length-delimited: (28 << 3 | 2) as a varint */
	*p++ = 0x01;
	p = kvp_pb_put_varint(p, inner);
	*p++ = 0x0a; /* payload: field 1, length-delimited */
	p = kvp_pb_put_varint(p, plen);
	payload = p;
	p += plen;
	*p++ = 0x12; /* crc32c: field 2, packed */
	p = kvp_pb_put_varint(p, clen);
	if ((rv = kvp_exec_read_blocks(c->p->exec, ids, n, payload, plen)) != KVP_OK)
		return exec_fail(c, rv, "read");
	for (size_t i = 0; i < n; i++) {
		uint32_t crc = kvp_crc32c(0, payload + i * bb, bb);
		*p++ = (uint8_t)crc;
		*p++ = (uint8_t)(crc >> 8);
		*p++ = (uint8_t)(crc >> 16);
		*p++ = (uint8_t)(crc >> 24);
	}
	c->sink->buf = buf;
	c->sink->len = (size_t)(p - buf);
	c->replied = true;
	c->p->counters.bytes_read += plen;
	return KVP_OK;
}

int
kvpd_h_read_blocks(struct call *c, const Kvpool__V1__ReadBlocksRequest *m, Kvpool__V1__Reply *out)
{
	Kvpool__V1__ReadBlocksReply *r;
	uint64_t bb;
	int rv;

	if ((rv = no_exec(c)) || (rv = kvpd_check_ids(c, m->block_ids, m->n_block_ids)) ||
	    (rv = readable(c, m->block_ids, m->n_block_ids)))
		return rv;
	bb = kvp_exec_block_bytes(c->p->exec);
	if (m->n_block_ids * (bb + 5) + REPLY_OVERHEAD > c->p->limits.max_reply_bytes)
		return kvpd_fail(c, KVP_ETOOLARGE,
		                 "%zu blocks of %llu bytes exceed max-msg-bytes %zu: read at most %llu "
		                 "per call",
		                 m->n_block_ids, (unsigned long long)bb, c->p->limits.max_reply_bytes,
		                 (unsigned long long)((c->p->limits.max_reply_bytes - REPLY_OVERHEAD) /
		                                      (bb + 5)));
	if (m->n_block_ids > 0) /* ReadBlocks is never inside a Batch: the reply is the call's own */
		return read_in_place(c, m->block_ids, m->n_block_ids, bb);
	if ((r = NEW(c, Kvpool__V1__ReadBlocksReply, kvpool__v1__read_blocks_reply__descriptor)) == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	out->result_case = KVPOOL__V1__REPLY__RESULT_READ_BLOCKS;
	out->read_blocks = r;
	return KVP_OK;
}

int
kvpd_h_copy_blocks(struct call *c, const Kvpool__V1__CopyBlocksRequest *m, Kvpool__V1__Reply *out)
{
	Kvpool__V1__CopyBlocksReply *r;
	int rv;

	if ((rv = no_exec(c)))
		return rv;
	if (m->n_src_block_ids != m->n_dst_block_ids)
		return kvpd_fail(c, KVP_EINVAL, "%zu sources for %zu destinations", m->n_src_block_ids,
		                 m->n_dst_block_ids);
	if ((rv = kvpd_check_ids(c, m->src_block_ids, m->n_src_block_ids)) ||
	    (rv = kvpd_check_ids(c, m->dst_block_ids, m->n_dst_block_ids)) ||
	    (rv = readable(c, m->src_block_ids, m->n_src_block_ids)) ||
	    (rv = writable(c, m->dst_block_ids, m->n_dst_block_ids, true)))
		return rv;
	if ((r = NEW(c, Kvpool__V1__CopyBlocksReply, kvpool__v1__copy_blocks_reply__descriptor)) ==
	    NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	rv = kvp_exec_copy_blocks(c->p->exec, m->src_block_ids, m->dst_block_ids, m->n_dst_block_ids);
	if (rv != KVP_OK)
		return exec_fail(c, rv, "copy");
	out->result_case = KVPOOL__V1__REPLY__RESULT_COPY_BLOCKS;
	out->copy_blocks = r;
	return KVP_OK;
}

int
kvpd_h_write_tokens(struct call *c, const Kvpool__V1__WriteTokensRequest *m,
                    Kvpool__V1__Reply *out)
{
	Kvpool__V1__WriteTokensReply *r;
	uint32_t bs = c->p->cfg.block_size;
	uint64_t max_slot = (uint64_t)kvp_pool_num_blocks(c->p->pool) * bs;
	int rv;

	if ((rv = no_exec(c)))
		return rv;
	if (m->n_slot_mapping > c->p->limits.max_ids)
		return kvpd_fail(c, KVP_EINVAL, "%zu tokens in one call; the limit is %u",
		                 m->n_slot_mapping, c->p->limits.max_ids);
	if (m->key.len != m->value.len)
		return kvpd_fail(c, KVP_EINVAL, "K has %zu bytes, V %zu", m->key.len, m->value.len);
	/* The slot's block must be held by this session (cached or not: vLLM rewrites the
	 * recomputed last token of a full prefix hit into its cached block). */
	for (size_t i = 0; i < m->n_slot_mapping; i++) {
		int64_t s = m->slot_mapping[i];
		if (s < 0)
			continue;
		if ((uint64_t)s >= max_slot)
			return kvpd_fail(c, KVP_ERANGE, "slot %lld is outside the pool (0..%llu)",
			                 (long long)s, (unsigned long long)(max_slot - 1));
		int32_t b = (int32_t)(s / bs);
		if ((rv = writable(c, &b, 1, false)))
			return rv;
	}
	if ((r = NEW(c, Kvpool__V1__WriteTokensReply, kvpool__v1__write_tokens_reply__descriptor)) ==
	    NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	rv = kvp_exec_write_tokens(c->p->exec, m->all_layers, m->layer, m->slot_mapping,
	                           m->n_slot_mapping, m->key.data, m->value.data, m->key.len);
	if (rv != KVP_OK)
		return exec_fail(c, rv, "write tokens");
	c->p->counters.bytes_written += 2 * m->key.len;
	out->result_case = KVPOOL__V1__REPLY__RESULT_WRITE_TOKENS;
	out->write_tokens = r;
	return KVP_OK;
}
