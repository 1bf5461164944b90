/* SPDX-License-Identifier: Apache-2.0 */
/*
 * calls_partial.c: vLLM 0.33's partial prefix-cache entries over the wire:
 * CachePartial (BlockPool.cache_partial_block) and MoveHashes
 * (move_block_hashes), which act only on blocks the session holds; and
 * ReportCached (emit_cached_block_events), which changes nothing.
 */
#include <string.h>

#include "service/rpc/call.h"
#include "common/map_key.h"
#include "common/kvp_status.h"
#include "engine/pool.h"

static int
held(struct call *c, int32_t id)
{
	if (id == KVP_NULL_BLOCK || kvpd_session_held(c->sess, id) != 0)
		return KVP_OK;
	return kvpd_fail(c, KVP_ENOTOWNER, "this session holds no reference on block %d", id);
}

int
kvpd_h_cache_partial(struct call *c, const Kvpool__V1__CachePartialRequest *m,
                     Kvpool__V1__Reply *out)
{
	Kvpool__V1__CachePartialReply *r =
	        NEW(c, Kvpool__V1__CachePartialReply, kvpool__v1__cache_partial_reply__descriptor);
	struct call_keys ck;
	const uint8_t *hashes = NULL;
	size_t nh = 0;
	bool computed, stored = false;
	int rv;

	if (r == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	if ((rv = kvpd_check_ids(c, &m->block_id, 1)) || (rv = held(c, m->block_id)))
		return rv;
	if (m->n_token_ids > c->p->limits.max_ids)
		return kvpd_fail(c, KVP_EINVAL, "too many tokens in one call");
	if ((rv = kvpd_parse_keys(c, m->keys, &ck)) || (rv = kvpd_check_group(c, m->group_id)) ||
	    (rv = kvpd_fine_hashes(c, m->block_hashes, m->token_ids, m->n_token_ids, ck.ptr, &hashes,
	                           &nh, &computed)))
		return rv;
	uint32_t hbs = kvp_pool_hash_block_size(c->p->pool), hl = kvp_pool_hash_len(c->p->pool);
	struct kvp_cache_args a = {
		.block_hashes = hashes, .num_block_hashes = nh,
		.token_ids = m->token_ids, .num_tokens = m->n_token_ids,
		.keys = ck.ptr, .has_lora_id = ck.has_lora_id, .lora_id = ck.lora_id,
		.block_size = m->block_size ? m->block_size : hbs, .group_id = m->group_id,
	};
	rv = kvp_pool_cache_partial_block(c->p->pool, m->block_id, m->num_tokens,
	                                  m->replace_existing, &a, &stored);
	if (rv == KVP_EINVAL)
		return kvpd_fail(c, rv, "cache_partial: num_tokens %u must be a positive multiple of %u "
		                 "covered by the %zu hashes, and block_size %u a multiple of %u",
		                 m->num_tokens, hbs, nh, a.block_size, hbs);
	if (rv == KVP_ENOTSUP)
		return kvpd_fail(c, rv, "cache_partial: pool %s %s", c->p->cfg.name,
		                 kvp_pool_caching_enabled(c->p->pool)
		                         ? "reproduces vLLM 9aaf83ef5, which has no partial entries"
		                         : "has prefix caching off");
	if (rv == KVP_ENOSPACE)
		return kvpd_fail(c, rv, "cache_partial: the pool holds as many extra keys as blocks");
	if (rv != KVP_OK)
		return kvpd_fail(c, rv, "cache_partial: %s", kvp_strerror(rv));
	if (m->block_id != KVP_NULL_BLOCK) {
		uint8_t *key = kvpd_scratch(c, (size_t)hl + 4);
		if (key == NULL)
			return kvpd_fail(c, KVP_ENOMEM, "out of memory");
		memcpy(key, hashes + (size_t)(m->num_tokens / hbs - 1) * hl, hl);
		kvp_map_key_put_group(key + hl, m->group_id);
		r->key.data = key;
		r->key.len = (size_t)hl + 4;
	}
	r->stored = stored;
	out->result_case = KVPOOL__V1__REPLY__RESULT_CACHE_PARTIAL;
	out->cache_partial = r;
	return KVP_OK;
}

int
kvpd_h_move_hashes(struct call *c, const Kvpool__V1__MoveHashesRequest *m, Kvpool__V1__Reply *out)
{
	Kvpool__V1__MoveHashesReply *r =
	        NEW(c, Kvpool__V1__MoveHashesReply, kvpool__v1__move_hashes_reply__descriptor);
	int32_t ids[2] = {m->src_block, m->dst_block};
	int rv;

	if (r == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	if ((rv = kvpd_check_ids(c, ids, 2)) || (rv = held(c, ids[0])) || (rv = held(c, ids[1])))
		return rv;
	rv = kvp_pool_move_block_hashes(c->p->pool, ids[0], ids[1]);
	if (rv == KVP_ESTATE)
		return kvpd_fail(c, rv, "move_hashes: block %d already has a key, or is reserved", ids[1]);
	if (rv != KVP_OK)
		return kvpd_fail(c, rv, "move_hashes: %s", kvp_strerror(rv));
	out->result_case = KVPOOL__V1__REPLY__RESULT_MOVE_HASHES;
	out->move_hashes = r;
	return KVP_OK;
}

int
kvpd_h_report_cached(struct call *c, const Kvpool__V1__ReportCachedRequest *m,
                     Kvpool__V1__Reply *out)
{
	Kvpool__V1__ReportCachedReply *r =
	        NEW(c, Kvpool__V1__ReportCachedReply, kvpool__v1__report_cached_reply__descriptor);
	struct call_keys ck;
	const uint8_t *hashes = NULL;
	size_t nh = 0;
	bool computed;
	uint32_t n = 0, hbs = kvp_pool_hash_block_size(c->p->pool);
	int rv;

	if (r == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	if (m->n_token_ids > c->p->limits.max_ids || m->num_blocks > c->p->limits.max_ids)
		return kvpd_fail(c, KVP_EINVAL, "too many tokens or blocks in one call");
	if ((rv = kvpd_parse_keys(c, m->keys, &ck)) || (rv = kvpd_check_group(c, m->group_id)) ||
	    (rv = kvpd_fine_hashes(c, m->block_hashes, m->token_ids, m->n_token_ids, ck.ptr, &hashes,
	                           &nh, &computed)))
		return rv;
	struct kvp_cache_args a = {
		.block_hashes = hashes, .num_block_hashes = nh,
		.token_ids = m->token_ids, .num_tokens = m->n_token_ids,
		.keys = ck.ptr, .has_lora_id = ck.has_lora_id, .lora_id = ck.lora_id,
		.num_full_blocks = m->num_blocks,
		.block_size = m->block_size ? m->block_size : hbs, .group_id = m->group_id,
	};
	rv = kvp_pool_report_cached(c->p->pool, &a, &n);
	if (rv == KVP_EINVAL)
		return kvpd_fail(c, rv, "report_cached: %u block(s) of %u tokens need that many hashes "
		                 "(%zu given) and a block size that is a multiple of %u",
		                 m->num_blocks, a.block_size, nh, hbs);
	if (rv == KVP_ENOTSUP)
		return kvpd_fail(c, rv, "report_cached: pool %s has prefix caching off", c->p->cfg.name);
	if (rv != KVP_OK)
		return kvpd_fail(c, rv, "report_cached: %s", kvp_strerror(rv));
	r->num_reported = n;
	out->result_case = KVPOOL__V1__REPLY__RESULT_REPORT_CACHED;
	out->report_cached = r;
	return KVP_OK;
}
