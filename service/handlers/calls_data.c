/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Data-plane calls: block contents in the pool's executor.
 *
 * Rules (kvpool.proto says the same): every block a call names must be held
 * by this session, by a block-level call (Allocate, Touch, a region lock) or
 * through one of its requests (AllocateSlots), so a session reads only what
 * it holds and the block cannot change hands under it (a decode peer
 * Touches a looked-up prefix, then reads). WriteBlocks and a copy's
 * destinations also refuse cached blocks and blocks another holder shares;
 * WriteTokens skips the slots of cached blocks (a cached block's content is
 * immutable to everyone; vLLM's rewrite of a hit's recomputed last token
 * would put back what is there). The executor then checks lengths, repeats
 * and ranges before it writes.
 */
#include <stdio.h>
#include <string.h>

#include "common/crc32c.h"
#include "common/kvp_status.h"
#include "engine/manager.h"
#include "engine/pool.h"
#include "gpu/executor.h"
#include "proto/data_wire.h"
#include "service/rpc/call.h"

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

/* The blocks this session's requests hold (AllocateSlots' own references). */
struct req_map {
	struct call *c;
	uint8_t *bits; /* one bit per block id; NULL until first needed */
	uint32_t nb;
};

static void
mark_request(void *ctx, uint64_t mgr_id)
{
	struct req_map *m = ctx;
	uint32_t ng = kvp_mgr_num_groups(m->c->p->mgr);
	for (uint32_t g = 0; g < ng; g++) {
		const int32_t *ids;
		size_t n;
		if (kvp_mgr_request_blocks(m->c->p->mgr, mgr_id, g, &ids, &n) != KVP_OK)
			continue;
		for (size_t j = 0; j < n; j++)
			if (ids[j] > 0 && (uint32_t)ids[j] < m->nb)
				m->bits[ids[j] / 8] |= (uint8_t)(1u << (ids[j] % 8));
	}
}

/* Whether one of this session's requests holds block id: a scan of their
 * block tables, once per call (bounded by the pool's size). */
static int
request_holds(struct req_map *m, int32_t id, bool *held)
{
	if (m->bits == NULL) {
		m->nb = kvp_pool_num_blocks(m->c->p->pool);
		if ((m->bits = kvpd_scratch(m->c, m->nb / 8 + 1)) == NULL)
			return kvpd_fail(m->c, KVP_ENOMEM, "out of memory");
		memset(m->bits, 0, m->nb / 8 + 1);
		kvpd_session_each_request(m->c->sess, mark_request, m);
	}
	*held = id > 0 && (uint32_t)id < m->nb && (m->bits[id / 8] >> (id % 8) & 1u);
	return KVP_OK;
}

/*
 * Every block held by this session, by a block-level call (Allocate,
 * Touch, Lookup's references) or by one of its requests (AllocateSlots);
 * with exclusive, none of them cached.
 */
static int
writable(struct req_map *m, const int32_t *ids, size_t n, bool exclusive)
{
	struct call *c = m->c;
	for (size_t i = 0; i < n; i++) {
		int32_t own = (int32_t)kvpd_session_held(c->sess, ids[i]);
		bool by_request = false;
		int rv;
		if ((own == 0 || exclusive) && (rv = request_holds(m, ids[i], &by_request)) != KVP_OK)
			return rv;
		own += by_request;
		if (own == 0)
			return kvpd_fail(c, KVP_ENOTOWNER,
			                 "neither this session nor its requests hold block %d", ids[i]);
		if (exclusive && cached(c, ids[i]))
			return kvpd_fail(c, KVP_ESTATE,
			                 "block %d is cached: its content is shared (copy it, then write)",
			                 ids[i]);
		/* A reference taken with Touch is not ownership of the content. */
		if (exclusive && kvp_pool_ref_cnt(c->p->pool, ids[i]) > own)
			return kvpd_fail(c, KVP_ENOTOWNER,
			                 "block %d is also held by another session or request: only its "
			                 "sole holder may write it", ids[i]);
	}
	return KVP_OK;
}

/*
 * Every block held by this session or its requests: what it reads cannot be
 * reused by another session mid-read, and another session's private blocks
 * are not its to read.
 */
static int
readable(struct call *c, const int32_t *ids, size_t n)
{
	struct req_map m = {.c = c};
	for (size_t i = 0; i < n; i++) {
		bool by_request = false;
		int rv;
		if (kvpd_session_held(c->sess, ids[i]) > 0)
			continue;
		if ((rv = request_holds(&m, ids[i], &by_request)) != KVP_OK)
			return rv;
		if (!by_request)
			return kvpd_fail(c, KVP_ENOTOWNER,
			                 "block %d is not held by this session or its requests: take a "
			                 "reference first (Touch a looked-up block, or LookupAndLock)",
			                 ids[i]);
	}
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
	    (rv = writable(&(struct req_map){.c = c}, m->block_ids, m->n_block_ids, true)))
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
 * message (proto/data_wire.h owns the bytes).
 */
static int
read_in_place(struct call *c, const int32_t *ids, size_t n, uint64_t bb)
{
	size_t total = kvp_wire_read_reply_size(c->call_id, n, bb);
	uint8_t *buf = c->sink->alloc(c->sink->ctx, total), *p, *payload;
	int rv;

	if (buf == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	p = kvp_wire_read_reply_begin(buf, c->call_id, n, bb, &payload);
	if ((rv = kvp_exec_read_blocks(c->p->exec, ids, n, payload, n * bb)) != KVP_OK)
		return exec_fail(c, rv, "read");
	for (size_t i = 0; i < n; i++)
		p = kvp_wire_put_crc(p, kvp_crc32c(0, payload + i * bb, bb));
	c->sink->buf = buf;
	c->sink->len = (size_t)(p - buf);
	c->replied = true;
	c->p->counters.bytes_read += n * bb;
	return KVP_OK;
}

int
kvpd_h_read_blocks(struct call *c, const Kvpool__V1__ReadBlocksRequest *m, Kvpool__V1__Reply *out)
{
	Kvpool__V1__ReadBlocksReply *r;
	uint64_t bb, most;
	int rv;

	if ((rv = no_exec(c)) || (rv = kvpd_check_ids(c, m->block_ids, m->n_block_ids)) ||
	    (rv = readable(c, m->block_ids, m->n_block_ids)))
		return rv;
	bb = kvp_exec_block_bytes(c->p->exec);
	most = kvp_wire_blocks_per_call(c->p->limits.max_reply_bytes, 0, bb);
	if (m->n_block_ids > most)
		return kvpd_fail(c, KVP_ETOOLARGE,
		                 "%zu blocks of %llu bytes exceed max-msg-bytes %zu: read at most %llu "
		                 "per call",
		                 m->n_block_ids, (unsigned long long)bb, c->p->limits.max_reply_bytes,
		                 (unsigned long long)most);
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
	    (rv = writable(&(struct req_map){.c = c}, m->dst_block_ids, m->n_dst_block_ids, true)))
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
	/*
	 * The slot's block must be held by this session or its requests. A slot
	 * in a cached block is skipped (-1): cached content is immutable to
	 * everyone, and vLLM's rewrite of a full hit's recomputed last token
	 * would put back the KV that is there.
	 */
	struct req_map held = {.c = c};
	int64_t *slots = NULL;
	for (size_t i = 0; i < m->n_slot_mapping; i++) {
		int64_t s = m->slot_mapping[i];
		if (s < 0)
			continue;
		if ((uint64_t)s >= max_slot)
			return kvpd_fail(c, KVP_ERANGE, "slot %lld is outside the pool (0..%llu)",
			                 (long long)s, (unsigned long long)(max_slot - 1));
		int32_t b = (int32_t)(s / bs);
		if ((rv = writable(&held, &b, 1, false)))
			return rv;
		if (cached(c, b)) {
			if (slots == NULL) {
				if ((slots = kvpd_scratch(c, m->n_slot_mapping * sizeof(*slots))) == NULL)
					return kvpd_fail(c, KVP_ENOMEM, "out of memory");
				memcpy(slots, m->slot_mapping, m->n_slot_mapping * sizeof(*slots));
			}
			slots[i] = KVP_PAD_SLOT;
		}
	}
	if ((r = NEW(c, Kvpool__V1__WriteTokensReply, kvpool__v1__write_tokens_reply__descriptor)) ==
	    NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	rv = kvp_exec_write_tokens(c->p->exec, m->all_layers, m->layer,
	                           slots ? slots : m->slot_mapping, m->n_slot_mapping, m->key.data,
	                           m->value.data, m->key.len);
	if (rv != KVP_OK)
		return exec_fail(c, rv, "write tokens");
	c->p->counters.bytes_written += 2 * m->key.len;
	out->result_case = KVPOOL__V1__REPLY__RESULT_WRITE_TOKENS;
	out->write_tokens = r;
	return KVP_OK;
}
