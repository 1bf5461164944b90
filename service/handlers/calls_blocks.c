/* SPDX-License-Identifier: Apache-2.0 */
/* Block-level calls: vLLM's BlockPool primitives over the wire. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "service/rpc/call.h"
#include "service/rpc/disk.h"
#include "common/kvp_status.h"
#include "engine/manager.h"
#include "engine/pool.h"
#include "proto/wire.h"

#define MAX_GROUPS_PER_LOOKUP 64

int
kvpd_check_ids(struct call *c, const int32_t *ids, size_t n)
{
	uint32_t nb = kvp_pool_num_blocks(c->p->pool);
	if (n > c->p->limits.max_ids)
		return kvpd_fail(c, KVP_EINVAL, "%zu ids in one call; the limit is %u", n,
		            c->p->limits.max_ids);
	for (size_t i = 0; i < n; i++)
		if (ids[i] < 0 || (uint32_t)ids[i] >= nb)
			return kvpd_fail(c, KVP_ERANGE, "block id %d is outside the pool (0..%u)", ids[i],
			            nb - 1);
	return KVP_OK;
}

/*
 * Whether this session may take n more references (the pool's
 * session_refs: QUOTA_EXCEEDED), and the pool's sessions together
 * (--max-refs: BUSY).
 */
int
kvpd_room_for_refs(struct call *c, size_t n)
{
	uint64_t held = c->p->refs_held, limit = c->p->limits.max_refs;
	uint64_t mine = c->sess->held, quota = c->p->limits.session_refs;
	if (mine + n > quota) {
		c->p->counters.quota_refusals++;
		return kvpd_fail(c, KVP_EQUOTA, "this session holds %llu references (blocks allocated "
		                 "or touched, rows reserved or locked); %zu more would pass its quota "
		                 "of %llu (the pool's session_refs): release some first",
		                 (unsigned long long)mine, n, (unsigned long long)quota);
	}
	if (held + n <= limit)
		return KVP_OK;
	c->p->counters.limit_refusals++;
	return kvpd_fail(c, KVP_EBUSY, "the pool's sessions hold %llu block references (this one "
	                 "%llu); %zu more would pass the limit of %llu (max-refs): free some first",
	                 (unsigned long long)held, (unsigned long long)c->sess->held, n,
	                 (unsigned long long)limit);
}

static int
engine(struct call *c, int rv, const char *what)
{
	if (rv != KVP_OK)
		return kvpd_fail(c, rv, "%s: %s", what, kvp_strerror(rv));
	return KVP_OK;
}

/* ---- block-level calls ---- */

int
kvpd_h_allocate(struct call *c, const Kvpool__V1__AllocateRequest *m, Kvpool__V1__Reply *out)
{
	Kvpool__V1__AllocateReply *r;
	int32_t *ids;
	int rv;

	if (m->num_blocks > c->p->limits.max_ids)
		return kvpd_fail(c, KVP_EINVAL, "%u blocks in one call; the limit is %u", m->num_blocks,
		            c->p->limits.max_ids);
	if (m->num_blocks > kvp_pool_num_free(c->p->pool))
		return kvpd_fail(c, KVP_ENOSPACE, "%u blocks asked, %u free", m->num_blocks,
		            kvp_pool_num_free(c->p->pool));
	if ((rv = kvpd_room_for_refs(c, m->num_blocks)))
		return rv;
	r = NEW(c, Kvpool__V1__AllocateReply, kvpool__v1__allocate_reply__descriptor);
	ids = kvpd_scratch(c, (size_t)m->num_blocks * sizeof(*ids));
	if (r == NULL || ids == NULL || kvpd_session_reserve(c->sess, m->num_blocks) != KVP_OK)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	if ((rv = engine(c, kvp_pool_get_new_blocks(c->p->pool, m->num_blocks, ids), "allocate")))
		return rv;
	for (uint32_t i = 0; i < m->num_blocks; i++)
		kvpd_session_add(c->sess, ids[i]);
	r->block_ids = ids;
	r->n_block_ids = m->num_blocks;
	out->result_case = KVPOOL__V1__REPLY__RESULT_ALLOCATE;
	out->allocate = r;
	return KVP_OK;
}

int
kvpd_h_touch(struct call *c, const Kvpool__V1__TouchRequest *m, Kvpool__V1__Reply *out)
{
	Kvpool__V1__TouchReply *r = NEW(c, Kvpool__V1__TouchReply, kvpool__v1__touch_reply__descriptor);
	int rv;

	size_t refs = 0;
	if ((rv = kvpd_check_ids(c, m->block_ids, m->n_block_ids)))
		return rv;
	for (size_t i = 0; i < m->n_block_ids; i++) {
		refs += m->block_ids[i] != KVP_NULL_BLOCK;
		/*
		 * A reserved row belongs to the session that reserved it until its
		 * Commit or Abort: a reference taken by number would let another
		 * session commit, abort or read the half-written row.
		 */
		if (kvp_pool_is_pending(c->p->pool, m->block_ids[i]))
			return kvpd_fail(c, KVP_ENOTOWNER,
			                 "block %d is reserved for a store in flight (Reserve): it "
			                 "belongs to its reserver until Commit or Abort",
			                 m->block_ids[i]);
	}
	if ((rv = kvpd_room_for_refs(c, refs)))
		return rv;
	if (r == NULL || kvpd_session_reserve(c->sess, m->n_block_ids) != KVP_OK)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	if ((rv = engine(c, kvp_pool_touch(c->p->pool, m->block_ids, m->n_block_ids), "touch")))
		return rv;
	for (size_t i = 0; i < m->n_block_ids; i++)
		if (m->block_ids[i] != KVP_NULL_BLOCK)
			kvpd_session_add(c->sess, m->block_ids[i]);
	out->result_case = KVPOOL__V1__REPLY__RESULT_TOUCH;
	out->touch = r;
	return KVP_OK;
}

int
kvpd_h_free(struct call *c, const Kvpool__V1__FreeRequest *m, Kvpool__V1__Reply *out)
{
	Kvpool__V1__FreeReply *r = NEW(c, Kvpool__V1__FreeReply, kvpool__v1__free_reply__descriptor);
	int rv;

	if ((rv = kvpd_check_ids(c, m->block_ids, m->n_block_ids)))
		return rv;
	if (r == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	/* The session gives up its references first: one for each occurrence of an id. */
	size_t k = kvpd_session_take(c->sess, m->block_ids, m->n_block_ids, KVP_NULL_BLOCK);
	if (k < m->n_block_ids)
		return kvpd_fail(c, KVP_ENOTOWNER, "this session holds no reference on block %d",
		                 m->block_ids[k]);
	if ((rv = engine(c, kvp_pool_free_blocks(c->p->pool, m->block_ids, m->n_block_ids), "free"))) {
		kvpd_session_untake(c->sess, m->block_ids, m->n_block_ids, KVP_NULL_BLOCK);
		return rv;
	}
	out->result_case = KVPOOL__V1__REPLY__RESULT_FREE;
	out->free = r;
	return KVP_OK;
}

int
kvpd_parse_keys(struct call *c, const Kvpool__V1__RequestKeys *k, struct call_keys *out)
{
	if (kvp_wire_keys_from_proto(k, &out->keys, out->mm, MAX_MM_FEATURES, &out->has_lora_id,
	                             &out->lora_id) != KVP_OK)
		return kvpd_fail(c, KVP_EINVAL,
		                 "bad request keys: mm features unsorted or over %d, a LoRA name, "
		                 "path, cache salt or mm identifier over %d bytes, or a LoRA path "
		                 "without a name",
		                 MAX_MM_FEATURES, KVP_MAX_KEY_LEN);
	if (out->keys.lora_name != NULL && out->keys.lora_path == NULL &&
	    kvp_hasher_keys_form(c->p->hasher) == KVP_KEYS_TAGGED)
		return kvpd_fail(c, KVP_EINVAL,
		                 "LoRA %.64s has no lora_path: pool %s hashes as vLLM 0.33, whose block "
		                 "hashes hold the adapter's name and path",
		                 out->keys.lora_name, c->p->cfg.name);
	out->ptr = k ? &out->keys : NULL;
	return KVP_OK;
}

int
kvpd_check_group(struct call *c, uint32_t g)
{
	uint32_t n = kvp_mgr_num_groups(c->p->mgr);
	if (g < n)
		return KVP_OK;
	return kvpd_fail(c, KVP_EINVAL, "group_id %u: pool %s has %u group(s)", g, c->p->cfg.name, n);
}

int
kvpd_fine_hashes(struct call *c, ProtobufCBinaryData given, const int64_t *tokens, size_t ntok,
            const struct kvp_request_keys *keys, const uint8_t **out, size_t *n, bool *computed)
{
	uint32_t hbs = kvp_pool_hash_block_size(c->p->pool), hl = kvp_pool_hash_len(c->p->pool);
	*computed = false;
	if (given.len > 0) {
		if (given.len % hl != 0)
			return kvpd_fail(c, KVP_EINVAL,
			                 "block_hashes is %zu bytes, not a multiple of %u (pool %s hashes "
			                 "with %s)", given.len, hl, c->p->cfg.name,
			                 kvp_hash_algo_name(kvp_hasher_algo(c->p->hasher)));
		if (given.len / hl > c->p->limits.max_ids)
			return kvpd_fail(c, KVP_EINVAL, "too many hashes in one call");
		*out = given.data;
		*n = given.len / hl;
		return KVP_OK;
	}
	if (ntok > c->p->limits.max_ids)
		return kvpd_fail(c, KVP_EINVAL, "%zu tokens in one call; the limit is %u", ntok,
		            c->p->limits.max_ids);
	size_t full = ntok / hbs;
	uint8_t *buf = kvpd_scratch(c, full * hl);
	if (buf == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	int rv = kvp_hash_request(c->p->hasher, keys, tokens, ntok, hbs, NULL, 0, buf, full, n);
	if (rv != KVP_OK)
		return kvpd_fail(c, rv, "hashing tokens: %s", kvp_strerror(rv));
	*out = buf;
	*computed = true;
	return KVP_OK;
}

int
kvpd_h_cache(struct call *c, const Kvpool__V1__CacheRequest *m, Kvpool__V1__Reply *out)
{
	Kvpool__V1__CacheReply *r = NEW(c, Kvpool__V1__CacheReply, kvpool__v1__cache_reply__descriptor);
	struct call_keys ck;
	bool computed;
	const uint8_t *hashes = NULL;
	size_t nh = 0;
	bool *mask = NULL;
	int rv;

	if (r == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	if ((rv = kvpd_check_ids(c, m->block_ids, m->n_block_ids)))
		return rv;
	if (m->n_token_ids > c->p->limits.max_ids)
		return kvpd_fail(c, KVP_EINVAL, "too many tokens in one call");
	if ((rv = kvpd_parse_keys(c, m->keys, &ck)))
		return rv;
	uint32_t nc = m->num_cached_blocks, nf = m->num_full_blocks;
	if (nf > m->n_block_ids)
		return kvpd_fail(c, KVP_EINVAL, "num_full_blocks %u > %zu block ids", nf, m->n_block_ids);
	if (m->block_mask.len > 0) {
		if (nf < nc || m->block_mask.len != (size_t)(nf - nc))
			return kvpd_fail(c, KVP_EINVAL, "block_mask must have num_full - num_cached entries");
		if ((mask = kvpd_scratch(c, m->block_mask.len * sizeof(*mask))) == NULL)
			return kvpd_fail(c, KVP_ENOMEM, "out of memory");
		for (size_t i = 0; i < m->block_mask.len; i++)
			mask[i] = m->block_mask.data[i] != 0;
	}
	for (uint32_t i = nc; i < nf; i++) {
		int32_t id = m->block_ids[i];
		if (id != KVP_NULL_BLOCK && (mask == NULL || mask[i - nc]) &&
		    kvpd_session_held(c->sess, id) == 0)
			return kvpd_fail(c, KVP_ENOTOWNER, "this session holds no reference on block %d", id);
	}
	uint32_t hbs = kvp_pool_hash_block_size(c->p->pool), hl = kvp_pool_hash_len(c->p->pool);
	size_t first_token = 0;
	if (m->parent_hash.len > 0) {
		/* Only the new tokens, chained from the caller's last hash. */
		uint8_t *all;
		size_t n = 0;
		if (m->parent_hash.len != hl || nc == 0 || nf < nc ||
		    (m->block_size && m->block_size != hbs) || m->block_hashes.len > 0)
			return kvpd_fail(c, KVP_EINVAL, "parent_hash needs %u bytes, num_cached_blocks >= 1, "
			                 "token_ids (not block_hashes) and the pool's block size", hl);
		if ((all = kvpd_scratch(c, (size_t)nf * hl)) == NULL)
			return kvpd_fail(c, KVP_ENOMEM, "out of memory");
		memcpy(all + (size_t)(nc - 1) * hl, m->parent_hash.data, hl);
		/* Hash only the blocks to cache; later tokens (a partial block) wait. */
		size_t want = (size_t)(nf - nc) * hbs;
		rv = kvp_hash_chain(c->p->hasher, ck.ptr, m->token_ids,
		                    m->n_token_ids < want ? m->n_token_ids : want, hbs, nc,
		                    m->parent_hash.data, all + (size_t)nc * hl, nf - nc, &n);
		if (rv != KVP_OK)
			return kvpd_fail(c, rv, "hashing tokens: %s", kvp_strerror(rv));
		if (n < nf - nc)
			return kvpd_fail(c, KVP_EINVAL, "%zu token(s) fill %zu of the %u blocks to cache",
			            m->n_token_ids, n, nf - nc);
		hashes = all;
		nh = nf;
		first_token = (size_t)nc * hbs;
	} else if ((rv = kvpd_fine_hashes(c, m->block_hashes, m->token_ids, m->n_token_ids, ck.ptr,
	                             &hashes, &nh, &computed))) {
		return rv;
	}
	if ((rv = kvpd_check_group(c, m->group_id)))
		return rv;
	struct kvp_cache_args a = {
		.block_hashes = hashes, .num_block_hashes = nh,
		.token_ids = m->token_ids, .num_tokens = m->n_token_ids, .first_token = first_token,
		.keys = ck.ptr, .has_lora_id = ck.has_lora_id, .lora_id = ck.lora_id,
		.num_cached_blocks = nc, .num_full_blocks = nf,
		.block_size = m->block_size ? m->block_size : kvp_pool_hash_block_size(c->p->pool),
		.group_id = m->group_id, .block_mask = mask,
	};
	struct kvp_pool_stats before, after;
	kvp_pool_get_stats(c->p->pool, &before);
	rv = kvp_pool_cache_full_blocks(c->p->pool, m->block_ids, m->n_block_ids, &a);
	if (rv == KVP_EINVAL)
		return kvpd_fail(c, rv, "cache: bad range, block size, hash list or mask (num_cached %u, "
		                   "num_full %u, %zu hashes, block_size %u)", nc, nf, nh, a.block_size);
	if ((rv = engine(c, rv, "cache")))
		return rv;
	kvp_pool_get_stats(c->p->pool, &after);
	r->num_stored = (uint32_t)(after.blocks_stored - before.blocks_stored);
	out->result_case = KVPOOL__V1__REPLY__RESULT_CACHE;
	out->cache = r;
	return KVP_OK;
}

/*
 * Lookup with coordinator: the manager's find_longest_cache_hit over the
 * chain, every group's hit in r (the null block as 0, with its ref count 0).
 */
static int
lookup_coordinator(struct call *c, const Kvpool__V1__LookupRequest *m, const uint8_t *hashes,
                   size_t nh, Kvpool__V1__LookupReply *r)
{
	uint32_t ng = kvp_mgr_num_groups(c->p->mgr), hit = 0, uncached = 0;
	size_t cap = nh; /* a group's hit has at most one block per fine hash */
	int32_t *ids = kvpd_scratch(c, (cap * ng + 1) * sizeof(*ids));
	int32_t **rows = kvpd_scratch(c, ng * sizeof(*rows));
	uint32_t *per = kvpd_scratch(c, ng * sizeof(*per));
	int rv;

	if (ids == NULL || rows == NULL || per == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	for (uint32_t g = 0; g < ng; g++)
		rows[g] = ids + g * cap;
	if ((rv = kvp_mgr_find_hit(c->p->mgr, hashes, nh, m->max_tokens, rows, cap, &hit,
	                           &uncached)) != KVP_OK)
		return kvpd_fail(c, rv, "find_longest_cache_hit: %s", kvp_strerror(rv));
	size_t n = 0;
	for (uint32_t g = 0; g < ng; g++) {
		per[g] = hit / kvp_mgr_group_spec(c->p->mgr, g)->block_size;
		memmove(ids + n, rows[g], per[g] * sizeof(*ids));
		n += per[g];
	}
	uint32_t *refs = kvpd_scratch(c, (n + 1) * sizeof(*refs));
	if (refs == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++)
		refs[i] = ids[i] == KVP_NULL_BLOCK ? 0 : (uint32_t)kvp_pool_ref_cnt(c->p->pool, ids[i]);
	r->block_ids = ids;
	r->n_block_ids = n;
	r->ref_cnts = refs;
	r->n_ref_cnts = n;
	r->blocks_per_group = per;
	r->n_blocks_per_group = ng;
	r->hit_tokens = hit;
	r->uncached_tokens = uncached;
	return KVP_OK;
}

int
kvpd_h_lookup(struct call *c, const Kvpool__V1__LookupRequest *m, Kvpool__V1__Reply *out)
{
	Kvpool__V1__LookupReply *r = NEW(c, Kvpool__V1__LookupReply, kvpool__v1__lookup_reply__descriptor);
	struct call_keys ck;
	bool computed;
	const uint8_t *hashes = NULL;
	size_t nh = 0;
	const uint32_t g0 = 0;
	const uint32_t *groups = m->n_group_ids ? m->group_ids : &g0;
	size_t ng = m->n_group_ids ? m->n_group_ids : 1;
	uint32_t hbs = kvp_pool_hash_block_size(c->p->pool), hl = kvp_pool_hash_len(c->p->pool);
	uint32_t bs = m->block_size ? m->block_size : hbs;
	int rv;

	if (r == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	if (ng > MAX_GROUPS_PER_LOOKUP)
		return kvpd_fail(c, KVP_EINVAL, "%zu groups in one lookup; the limit is %d", ng,
		            MAX_GROUPS_PER_LOOKUP);
	if (bs % hbs != 0 ||
	    (kvp_pool_semantics(c->p->pool) == KVP_VLLM_9AAF83EF5 &&
	     (size_t)(bs / hbs) * hl > kvp_pool_max_hash_len(c->p->pool)))
		return kvpd_fail(c, KVP_EINVAL, "block_size %u is not a supported multiple of %u", bs, hbs);
	for (size_t i = 0; i < ng; i++)
		if ((rv = kvpd_check_group(c, groups[i])))
			return rv;
	if ((rv = kvpd_parse_keys(c, m->keys, &ck)) ||
	    (rv = kvpd_fine_hashes(c, m->block_hashes, m->token_ids, m->n_token_ids, ck.ptr, &hashes,
	                      &nh, &computed)))
		return rv;
	if (m->coordinator) {
		if ((rv = lookup_coordinator(c, m, hashes, nh, r)))
			return rv;
		out->result_case = KVPOOL__V1__REPLY__RESULT_LOOKUP;
		out->lookup = r;
		return KVP_OK;
	}
	uint32_t k = bs / hbs;
	size_t ncoarse = nh / k, hit = 0;
	int32_t *ids = kvpd_scratch(c, ncoarse * ng * sizeof(*ids));
	int32_t *row = kvpd_scratch(c, ng * sizeof(*row));
	uint32_t *refs;
	if (ids == NULL || row == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	/* Left to right, all groups per position, stopping at the first miss. */
	for (; hit < ncoarse; hit++) {
		size_t klen;
		const uint8_t *key = kvp_pool_coarse_hash(c->p->pool, hashes, k, hit, &klen);
		if (kvp_pool_get_cached_block(c->p->pool, key, klen, groups, ng, row) != KVP_OK)
			break;
		for (size_t g = 0; g < ng; g++)
			ids[g * ncoarse + hit] = row[g];
	}
	/* Compact to hit entries per group, group after group. */
	for (size_t g = 1; g < ng; g++)
		memmove(ids + g * hit, ids + g * ncoarse, hit * sizeof(*ids));
	/* vLLM's callers read a hit's ref_cnt (an evictable hit counts against capacity). */
	if (hit > 0) {
		if ((refs = kvpd_scratch(c, hit * ng * sizeof(*refs))) == NULL)
			return kvpd_fail(c, KVP_ENOMEM, "out of memory");
		for (size_t i = 0; i < hit * ng; i++)
			refs[i] = (uint32_t)kvp_pool_ref_cnt(c->p->pool, ids[i]);
		r->ref_cnts = refs;
		r->n_ref_cnts = hit * ng;
	}
	r->num_hit_blocks = (uint32_t)hit;
	r->block_ids = ids;
	r->n_block_ids = hit * ng;
	r->hit_tokens = (uint32_t)(hit * bs);
	if (computed) {
		r->block_hashes.data = (uint8_t *)hashes;
		r->block_hashes.len = nh * hl;
	}
	out->result_case = KVPOOL__V1__REPLY__RESULT_LOOKUP;
	out->lookup = r;
	return KVP_OK;
}

int
kvpd_h_evict(struct call *c, const Kvpool__V1__EvictRequest *m, Kvpool__V1__Reply *out)
{
	Kvpool__V1__EvictReply *r = NEW(c, Kvpool__V1__EvictReply, kvpool__v1__evict_reply__descriptor);
	struct kvp_pool_stats before, after;
	int rv;

	if (r == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	if ((rv = kvpd_check_ids(c, m->block_ids, m->n_block_ids)))
		return rv;
	kvp_pool_get_stats(c->p->pool, &before);
	if ((rv = engine(c, kvp_pool_evict_blocks(c->p->pool, m->block_ids, m->n_block_ids), "evict")))
		return rv;
	kvp_pool_get_stats(c->p->pool, &after);
	r->num_evicted = (uint32_t)(after.blocks_evicted - before.blocks_evicted);
	out->result_case = KVPOOL__V1__REPLY__RESULT_EVICT;
	out->evict = r;
	return KVP_OK;
}

int
kvpd_h_reset(struct call *c, const Kvpool__V1__ResetRequest *m, Kvpool__V1__Reply *out)
{
	Kvpool__V1__ResetReply *r = NEW(c, Kvpool__V1__ResetReply, kvpool__v1__reset_reply__descriptor);
	int rv;

	if (r == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	rv = kvp_pool_reset_prefix_cache(c->p->pool);
	if (rv == KVP_ESTATE)
		return kvpd_fail(c, rv, "reset refused: %u blocks are in use",
		            kvp_pool_num_blocks(c->p->pool) - 1 - kvp_pool_num_free(c->p->pool));
	if ((rv = engine(c, rv, "reset")))
		return rv;
	kvpd_disk_reset(c->p->disk); /* the tier below goes with it */
	out->result_case = KVPOOL__V1__REPLY__RESULT_RESET;
	out->reset = r;
	return KVP_OK;
}

int
kvpd_h_free_queue(struct call *c, const Kvpool__V1__FreeQueueRequest *m, Kvpool__V1__Reply *out)
{
	Kvpool__V1__FreeQueueReply *r =
		NEW(c, Kvpool__V1__FreeQueueReply, kvpool__v1__free_queue_reply__descriptor);
	uint32_t cap = m->max_ids == 0 || m->max_ids > c->p->limits.max_ids ? c->p->limits.max_ids
	                                                                     : m->max_ids;
	int32_t *ids = kvpd_scratch(c, ((size_t)cap + 1) * sizeof(*ids));
	size_t n = 0;
	bool more = false;
	int rv;

	if (r == NULL || ids == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	if (m->after < 0 || (uint32_t)m->after >= kvp_pool_num_blocks(c->p->pool))
		return kvpd_fail(c, KVP_ERANGE, "block id %d is outside the pool", m->after);
	rv = kvp_pool_free_queue_page(c->p->pool, m->after, ids, cap, &n, &more);
	if (rv == KVP_ENOTFOUND)
		return kvpd_fail(c, rv, "block %d is no longer free: the queue moved on (start again "
		                 "from the head)", m->after);
	if (rv != KVP_OK)
		return kvpd_fail(c, rv, "free queue: %s", kvp_strerror(rv));
	r->block_ids = ids;
	r->n_block_ids = n;
	r->more = more;
	r->num_free = kvp_pool_num_free(c->p->pool);
	out->result_case = KVPOOL__V1__REPLY__RESULT_FREE_QUEUE;
	out->free_queue = r;
	return KVP_OK;
}

int
kvpd_h_block_keys(struct call *c, const Kvpool__V1__BlockKeysRequest *m, Kvpool__V1__Reply *out)
{
	Kvpool__V1__BlockKeysReply *r =
		NEW(c, Kvpool__V1__BlockKeysReply, kvpool__v1__block_keys_reply__descriptor);
	uint32_t nb = kvp_pool_num_blocks(c->p->pool), *counts;
	size_t total = 0, k = 0, len;
	ProtobufCBinaryData *keys;

	if (r == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	if (m->n_block_ids > c->p->limits.max_ids)
		return kvpd_fail(c, KVP_EINVAL, "%zu blocks in one call; the limit is %u",
		                 m->n_block_ids, c->p->limits.max_ids);
	for (size_t i = 0; i < m->n_block_ids; i++) {
		if (m->block_ids[i] < 0 || (uint32_t)m->block_ids[i] >= nb)
			return kvpd_fail(c, KVP_ERANGE, "block id %d is outside the pool", m->block_ids[i]);
	}
	/* Count first, then copy: the reply points into the pool's keys (read under the lock). */
	for (size_t i = 0; i < m->n_block_ids; i++)
		for (size_t j = 0; kvp_pool_block_key_at(c->p->pool, m->block_ids[i], j, &len); j++)
			total++;
	counts = kvpd_scratch(c, (m->n_block_ids + 1) * sizeof(*counts));
	keys = kvpd_scratch(c, (total + 1) * sizeof(*keys));
	if (counts == NULL || keys == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	for (size_t i = 0; i < m->n_block_ids; i++) {
		const uint8_t *key;
		counts[i] = 0;
		for (size_t j = 0; (key = kvp_pool_block_key_at(c->p->pool, m->block_ids[i], j, &len));
		     j++) {
			keys[k].data = (uint8_t *)key;
			keys[k++].len = len;
			counts[i]++;
		}
	}
	r->num_keys = counts;
	r->n_num_keys = m->n_block_ids;
	r->keys = keys;
	r->n_keys = k;
	out->result_case = KVPOOL__V1__REPLY__RESULT_BLOCK_KEYS;
	out->block_keys = r;
	return KVP_OK;
}

int
kvpd_h_stats(struct call *c, const Kvpool__V1__StatsRequest *m, Kvpool__V1__Reply *out)
{
	Kvpool__V1__StatsReply *r = NEW(c, Kvpool__V1__StatsReply, kvpool__v1__stats_reply__descriptor);

	if (r == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	struct kvpd_pool_gauges g;
	kvpd_pool_gauges(c->p, &g);
	r->num_blocks = g.num_blocks;
	r->num_free = g.num_free;
	r->num_cached_blocks = g.num_cached_blocks;
	r->num_cached_keys = g.num_cached_keys;
	r->usage = g.usage;
	r->blocks_allocated = g.blocks_allocated;
	r->blocks_evicted = g.blocks_evicted;
	r->alloc_failures = g.alloc_failures;
	r->blocks_stored = g.blocks_stored;
	r->resets = g.resets;
	r->prefix_requests = g.prefix_requests;
	r->prefix_queries = g.prefix_queries;
	r->prefix_hits = g.prefix_hits;
	r->sessions = (uint32_t)c->p->num_sessions;
	r->leases_expired = c->p->counters.leases_expired;
	r->events_emitted = c->p->counters.events_emitted;
	r->active_requests = (uint32_t)g.active_requests;
	out->result_case = KVPOOL__V1__REPLY__RESULT_STATS;
	out->stats = r;
	return KVP_OK;
}

