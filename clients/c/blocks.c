/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libkvpool's block-level calls (vLLM's BlockPool over the wire): Allocate,
 * Touch, Free, Evict, Cache, Lookup, Reset, Heartbeat, Stats. Each builds
 * its request from the caller's arguments and writes out-parameters only
 * on success.
 */
#include <stdlib.h>
#include <string.h>

#include "clients/c/client_impl.h"
#include "clients/c/kvpool.h"
#include "proto/wire.h"


int
kvp_client_allocate(struct kvp_client *c, uint32_t n, int32_t *ids)
{
	Kvpool__V1__AllocateRequest m = KVPOOL__V1__ALLOCATE_REQUEST__INIT;
	Kvpool__V1__Reply *r = NULL;

	if (c == NULL || (ids == NULL && n > 0))
		return KVP_EINVAL;
	m.num_blocks = n;
	KVP_CLIENT_CALL(c, allocate, ALLOCATE, &m, r);
	if (rv != KVP_OK)
		return rv;
	if (r->result_case != KVPOOL__V1__REPLY__RESULT_ALLOCATE || r->allocate->n_block_ids != n) {
		kvpool__v1__reply__free_unpacked(r, NULL);
		return kvp_client_fail_(c, KVP_EINTERNAL, "allocate: unexpected reply", NULL);
	}
	if (n > 0)
		memcpy(ids, r->allocate->block_ids, n * sizeof(*ids));
	kvpool__v1__reply__free_unpacked(r, NULL);
	return KVP_OK;
}

static int
ids_call(struct kvp_client *c, int which, const int32_t *ids, size_t n, uint32_t *count)
{
	Kvpool__V1__TouchRequest t = KVPOOL__V1__TOUCH_REQUEST__INIT;
	Kvpool__V1__FreeRequest f = KVPOOL__V1__FREE_REQUEST__INIT;
	Kvpool__V1__EvictRequest e = KVPOOL__V1__EVICT_REQUEST__INIT;
	Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
	Kvpool__V1__Reply *r = NULL;
	int rv;

	if (c == NULL || (ids == NULL && n > 0))
		return KVP_EINVAL;
	t.block_ids = f.block_ids = e.block_ids = (int32_t *)ids;
	t.n_block_ids = f.n_block_ids = e.n_block_ids = n;
	rq.call_case = (Kvpool__V1__Request__CallCase)which;
	if (which == KVPOOL__V1__REQUEST__CALL_TOUCH)
		rq.touch = &t;
	else if (which == KVPOOL__V1__REQUEST__CALL_FREE)
		rq.free = &f;
	else
		rq.evict = &e;
	if ((rv = kvp_client_call_(c, &rq, &r)) != KVP_OK)
		return rv;
	if (count && r->result_case == KVPOOL__V1__REPLY__RESULT_EVICT)
		*count = r->evict->num_evicted;
	kvpool__v1__reply__free_unpacked(r, NULL);
	return KVP_OK;
}

int
kvp_client_touch(struct kvp_client *c, const int32_t *ids, size_t n)
{
	return ids_call(c, KVPOOL__V1__REQUEST__CALL_TOUCH, ids, n, NULL);
}

int
kvp_client_free(struct kvp_client *c, const int32_t *ids, size_t n)
{
	return ids_call(c, KVPOOL__V1__REQUEST__CALL_FREE, ids, n, NULL);
}

int
kvp_client_evict(struct kvp_client *c, const int32_t *ids, size_t n, uint32_t *num_evicted)
{
	return ids_call(c, KVPOOL__V1__REQUEST__CALL_EVICT, ids, n, num_evicted);
}

int
kvp_client_cache(struct kvp_client *c, const struct kvp_client_cache *a, uint32_t *num_stored)
{
	Kvpool__V1__CacheRequest m;
	Kvpool__V1__RequestKeys keys;
	Kvpool__V1__MmFeature mm[KVP_CLIENT_MAX_MM], *mmp[KVP_CLIENT_MAX_MM];
	Kvpool__V1__Reply *r = NULL;

	if (c == NULL || kvp_build_cache_(&m, a, c->info.hash_len) != KVP_OK)
		return KVP_EINVAL;
	if (a->keys || a->has_lora_id) {
		kvp_wire_keys_to_proto(a->keys, a->has_lora_id, a->lora_id, &keys, mm, mmp);
		m.keys = &keys;
	}
	KVP_CLIENT_CALL(c, cache, CACHE, &m, r);
	if (rv != KVP_OK)
		return rv;
	if (num_stored && r->result_case == KVPOOL__V1__REPLY__RESULT_CACHE)
		*num_stored = r->cache->num_stored;
	kvpool__v1__reply__free_unpacked(r, NULL);
	return KVP_OK;
}

int
kvp_client_cache_partial(struct kvp_client *c, const struct kvp_client_cache *a,
                         uint32_t num_tokens, bool replace_existing, bool *stored)
{
	Kvpool__V1__CacheRequest full;
	Kvpool__V1__CachePartialRequest m = KVPOOL__V1__CACHE_PARTIAL_REQUEST__INIT;
	Kvpool__V1__RequestKeys keys;
	Kvpool__V1__MmFeature mm[KVP_CLIENT_MAX_MM], *mmp[KVP_CLIENT_MAX_MM];
	Kvpool__V1__Reply *r = NULL;

	/* The same arguments as a Cache, checked the same way; one block, no range. */
	if (c == NULL || a == NULL || a->num_block_ids != 1 || a->parent_hash != NULL ||
	    a->block_mask != NULL || kvp_build_cache_(&full, a, c->info.hash_len) != KVP_OK)
		return KVP_EINVAL;
	m.block_id = a->block_ids[0];
	m.num_tokens = num_tokens;
	m.group_id = a->group_id;
	m.block_size = a->block_size;
	m.block_hashes = full.block_hashes;
	m.token_ids = full.token_ids;
	m.n_token_ids = full.n_token_ids;
	m.replace_existing = replace_existing;
	if (a->keys || a->has_lora_id) {
		kvp_wire_keys_to_proto(a->keys, a->has_lora_id, a->lora_id, &keys, mm, mmp);
		m.keys = &keys;
	}
	KVP_CLIENT_CALL(c, cache_partial, CACHE_PARTIAL, &m, r);
	if (rv != KVP_OK)
		return rv;
	if (stored)
		*stored = r->result_case == KVPOOL__V1__REPLY__RESULT_CACHE_PARTIAL &&
		          r->cache_partial->stored;
	kvpool__v1__reply__free_unpacked(r, NULL);
	return KVP_OK;
}

int
kvp_client_report_cached(struct kvp_client *c, const struct kvp_client_cache *a,
                         uint32_t *num_reported)
{
	Kvpool__V1__CacheRequest full;
	Kvpool__V1__ReportCachedRequest m = KVPOOL__V1__REPORT_CACHED_REQUEST__INIT;
	Kvpool__V1__RequestKeys keys;
	Kvpool__V1__MmFeature mm[KVP_CLIENT_MAX_MM], *mmp[KVP_CLIENT_MAX_MM];
	Kvpool__V1__Reply *r = NULL;

	/* A Cache's request description with no blocks: checked the same way. */
	if (c == NULL || a == NULL || a->num_block_ids != 0 || a->num_cached_blocks != 0 ||
	    a->parent_hash != NULL || a->block_mask != NULL ||
	    kvp_build_cache_(&full, a, c->info.hash_len) != KVP_OK)
		return KVP_EINVAL;
	m.num_blocks = a->num_full_blocks;
	m.group_id = a->group_id;
	m.block_size = a->block_size;
	m.block_hashes = full.block_hashes;
	m.token_ids = full.token_ids;
	m.n_token_ids = full.n_token_ids;
	if (a->keys || a->has_lora_id) {
		kvp_wire_keys_to_proto(a->keys, a->has_lora_id, a->lora_id, &keys, mm, mmp);
		m.keys = &keys;
	}
	KVP_CLIENT_CALL(c, report_cached, REPORT_CACHED, &m, r);
	if (rv != KVP_OK)
		return rv;
	if (num_reported)
		*num_reported = r->result_case == KVPOOL__V1__REPLY__RESULT_REPORT_CACHED
		                        ? r->report_cached->num_reported
		                        : 0;
	kvpool__v1__reply__free_unpacked(r, NULL);
	return KVP_OK;
}

int
kvp_client_move_hashes(struct kvp_client *c, int32_t src_block, int32_t dst_block)
{
	Kvpool__V1__MoveHashesRequest m = KVPOOL__V1__MOVE_HASHES_REQUEST__INIT;
	Kvpool__V1__Reply *r = NULL;

	if (c == NULL || src_block < 0 || dst_block < 0)
		return KVP_EINVAL;
	m.src_block = src_block;
	m.dst_block = dst_block;
	KVP_CLIENT_CALL(c, move_hashes, MOVE_HASHES, &m, r);
	if (rv != KVP_OK)
		return rv;
	kvpool__v1__reply__free_unpacked(r, NULL);
	return KVP_OK;
}

int
kvp_client_lookup(struct kvp_client *c, const struct kvp_client_lookup *q, int32_t *ids,
                  size_t cap, uint32_t *num_hit_blocks, uint32_t *hit_tokens)
{
	return kvp_client_lookup_refs(c, q, ids, NULL, cap, num_hit_blocks, hit_tokens);
}

int
kvp_client_lookup_refs(struct kvp_client *c, const struct kvp_client_lookup *q, int32_t *ids,
                       uint32_t *ref_cnts, size_t cap, uint32_t *num_hit_blocks,
                       uint32_t *hit_tokens)
{
	Kvpool__V1__LookupRequest m;
	Kvpool__V1__RequestKeys keys;
	Kvpool__V1__MmFeature mm[KVP_CLIENT_MAX_MM], *mmp[KVP_CLIENT_MAX_MM];
	Kvpool__V1__Reply *r = NULL;

	if (c == NULL || num_hit_blocks == NULL || kvp_build_lookup_(&m, q, c->info.hash_len) != KVP_OK)
		return KVP_EINVAL;
	if (q->keys) {
		kvp_wire_keys_to_proto(q->keys, false, 0, &keys, mm, mmp);
		m.keys = &keys;
	}
	KVP_CLIENT_CALL(c, lookup, LOOKUP, &m, r);
	if (rv != KVP_OK)
		return rv;
	if (r->result_case != KVPOOL__V1__REPLY__RESULT_LOOKUP) {
		kvpool__v1__reply__free_unpacked(r, NULL);
		return kvp_client_fail_(c, KVP_EINTERNAL, "lookup: unexpected reply", NULL);
	}
	size_t groups = q->group_ids && q->num_groups ? q->num_groups : 1;
	size_t hit = r->lookup->num_hit_blocks;
	if (hit > cap || r->lookup->n_block_ids != hit * groups) {
		kvpool__v1__reply__free_unpacked(r, NULL);
		return kvp_client_fail_(c, KVP_EINVAL, "lookup: more hits than the ids buffer holds", NULL);
	}
	if (ref_cnts && hit > 0 && r->lookup->n_ref_cnts != hit * groups) {
		kvpool__v1__reply__free_unpacked(r, NULL);
		return kvp_client_fail_(c, KVP_ENOTSUP, "lookup: this daemon reports no ref counts "
		                        "(it predates LookupReply.ref_cnts)", NULL);
	}
	for (size_t g = 0; g < groups && ids && hit > 0; g++)
		memcpy(ids + g * cap, r->lookup->block_ids + g * hit, hit * sizeof(*ids));
	for (size_t g = 0; g < groups && ref_cnts && hit > 0; g++)
		memcpy(ref_cnts + g * cap, r->lookup->ref_cnts + g * hit, hit * sizeof(*ref_cnts));
	*num_hit_blocks = (uint32_t)hit;
	if (hit_tokens)
		*hit_tokens = r->lookup->hit_tokens;
	kvpool__v1__reply__free_unpacked(r, NULL);
	return KVP_OK;
}

int
kvp_client_find_hit(struct kvp_client *c, const uint8_t *hashes, size_t num_hashes,
                    uint32_t hash_len, uint32_t max_tokens, int32_t *ids, uint32_t *ref_cnts,
                    size_t cap, uint32_t *blocks_per_group, uint32_t *hit_tokens,
                    uint32_t *uncached)
{
	struct kvp_client_lookup q = {.hashes = hashes, .num_hashes = num_hashes,
	                              .hash_len = hash_len};
	Kvpool__V1__LookupRequest m;
	Kvpool__V1__Reply *r = NULL;

	if (c == NULL || (hashes == NULL && num_hashes > 0) || blocks_per_group == NULL ||
	    hit_tokens == NULL || uncached == NULL || (ids == NULL && cap > 0) ||
	    kvp_build_lookup_(&m, &q, c->info.hash_len) != KVP_OK)
		return KVP_EINVAL;
	m.coordinator = true;
	m.max_tokens = max_tokens;
	KVP_CLIENT_CALL(c, lookup, LOOKUP, &m, r);
	if (rv != KVP_OK)
		return rv;
	const Kvpool__V1__LookupReply *l = r->lookup;
	size_t ng = l ? l->n_blocks_per_group : 0, n = 0;
	if (r->result_case != KVPOOL__V1__REPLY__RESULT_LOOKUP || ng == 0 || ng > KVP_MAX_GROUPS ||
	    l->n_ref_cnts != l->n_block_ids) {
		kvpool__v1__reply__free_unpacked(r, NULL);
		return kvp_client_fail_(c, KVP_EINTERNAL, "find_hit: unexpected reply (a daemon "
		                        "without the coordinator lookup?)", NULL);
	}
	for (size_t g = 0; g < ng; g++) {
		if (l->blocks_per_group[g] > cap || n + l->blocks_per_group[g] > l->n_block_ids) {
			kvpool__v1__reply__free_unpacked(r, NULL);
			return kvp_client_fail_(c, KVP_EINVAL, "find_hit: a group's hit is longer than "
			                        "the ids buffer", NULL);
		}
		n += l->blocks_per_group[g];
	}
	n = 0;
	for (size_t g = 0; g < ng; g++) {
		uint32_t k = l->blocks_per_group[g];
		if (k > 0) {
			memcpy(ids + g * cap, l->block_ids + n, k * sizeof(*ids));
			if (ref_cnts)
				memcpy(ref_cnts + g * cap, l->ref_cnts + n, k * sizeof(*ref_cnts));
		}
		blocks_per_group[g] = k;
		n += k;
	}
	for (size_t g = ng; g < KVP_MAX_GROUPS; g++)
		blocks_per_group[g] = 0;
	*hit_tokens = l->hit_tokens;
	*uncached = l->uncached_tokens;
	kvpool__v1__reply__free_unpacked(r, NULL);
	return KVP_OK;
}

int
kvp_client_reset(struct kvp_client *c)
{
	Kvpool__V1__ResetRequest m = KVPOOL__V1__RESET_REQUEST__INIT;
	Kvpool__V1__Reply *r = NULL;

	if (c == NULL)
		return KVP_EINVAL;
	KVP_CLIENT_CALL(c, reset, RESET, &m, r);
	if (rv == KVP_OK)
		kvpool__v1__reply__free_unpacked(r, NULL);
	return rv;
}

int
kvp_client_heartbeat(struct kvp_client *c)
{
	Kvpool__V1__HeartbeatRequest m = KVPOOL__V1__HEARTBEAT_REQUEST__INIT;
	Kvpool__V1__Reply *r = NULL;

	if (c == NULL)
		return KVP_EINVAL;
	KVP_CLIENT_CALL(c, heartbeat, HEARTBEAT, &m, r);
	if (rv == KVP_OK)
		kvpool__v1__reply__free_unpacked(r, NULL);
	return rv;
}

int
kvp_client_event_position(struct kvp_client *c, uint64_t *epoch, uint64_t *next_seq)
{
	Kvpool__V1__HeartbeatRequest m = KVPOOL__V1__HEARTBEAT_REQUEST__INIT;
	Kvpool__V1__Reply *r = NULL;

	if (c == NULL || epoch == NULL || next_seq == NULL)
		return KVP_EINVAL;
	m.with_pool_info = true;
	KVP_CLIENT_CALL(c, heartbeat, HEARTBEAT, &m, r);
	if (rv != KVP_OK)
		return rv;
	if (r->result_case != KVPOOL__V1__REPLY__RESULT_HEARTBEAT || r->heartbeat->pool == NULL) {
		kvpool__v1__reply__free_unpacked(r, NULL);
		return kvp_client_fail_(c, KVP_EINTERNAL, "heartbeat: no pool description", NULL);
	}
	*epoch = r->heartbeat->pool->event_epoch;
	*next_seq = r->heartbeat->pool->event_seq;
	kvpool__v1__reply__free_unpacked(r, NULL);
	return KVP_OK;
}

void
kvp_client_stats_from_(const Kvpool__V1__StatsReply *s, struct kvp_client_stats *out)
{
	out->num_blocks = s->num_blocks;
	out->num_free = s->num_free;
	out->num_cached_blocks = s->num_cached_blocks;
	out->num_cached_keys = s->num_cached_keys;
	out->usage = s->usage;
	out->blocks_allocated = s->blocks_allocated;
	out->blocks_evicted = s->blocks_evicted;
	out->alloc_failures = s->alloc_failures;
	out->blocks_stored = s->blocks_stored;
	out->resets = s->resets;
	out->prefix_requests = s->prefix_requests;
	out->prefix_queries = s->prefix_queries;
	out->prefix_hits = s->prefix_hits;
	out->sessions = s->sessions;
	out->leases_expired = s->leases_expired;
	out->events_emitted = s->events_emitted;
	out->active_requests = s->active_requests;
}

int
kvp_client_stats(struct kvp_client *c, struct kvp_client_stats *out)
{
	Kvpool__V1__StatsRequest m = KVPOOL__V1__STATS_REQUEST__INIT;
	Kvpool__V1__Reply *r = NULL;

	if (c == NULL || out == NULL)
		return KVP_EINVAL;
	KVP_CLIENT_CALL(c, stats, STATS, &m, r);
	if (rv != KVP_OK)
		return rv;
	if (r->result_case != KVPOOL__V1__REPLY__RESULT_STATS) {
		kvpool__v1__reply__free_unpacked(r, NULL);
		return kvp_client_fail_(c, KVP_EINTERNAL, "stats: unexpected reply", NULL);
	}
	kvp_client_stats_from_(r->stats, out);
	kvpool__v1__reply__free_unpacked(r, NULL);
	return KVP_OK;
}

int
kvp_client_block_keys(struct kvp_client *c, const int32_t *ids, size_t n, uint32_t *num_keys,
                      uint8_t *keys, size_t keys_cap, uint32_t *key_lens, size_t lens_cap,
                      size_t *total)
{
	Kvpool__V1__BlockKeysRequest m = KVPOOL__V1__BLOCK_KEYS_REQUEST__INIT;
	Kvpool__V1__Reply *r = NULL;
	size_t at = 0, want = 0;

	if (c == NULL || total == NULL || (n > 0 && (ids == NULL || num_keys == NULL)) ||
	    (keys == NULL && keys_cap > 0) || (key_lens == NULL && lens_cap > 0))
		return KVP_EINVAL;
	m.block_ids = (int32_t *)ids;
	m.n_block_ids = n;
	KVP_CLIENT_CALL(c, block_keys, BLOCK_KEYS, &m, r);
	if (rv != KVP_OK)
		return rv;
	const Kvpool__V1__BlockKeysReply *x = r->block_keys;
	for (size_t i = 0; r->result_case == KVPOOL__V1__REPLY__RESULT_BLOCK_KEYS && i < x->n_num_keys;
	     i++)
		want += x->num_keys[i];
	if (r->result_case != KVPOOL__V1__REPLY__RESULT_BLOCK_KEYS || x->n_num_keys != n ||
	    want != x->n_keys) {
		kvpool__v1__reply__free_unpacked(r, NULL);
		return kvp_client_fail_(c, KVP_EINTERNAL, "%s", "malformed BlockKeys reply");
	}
	if (x->n_keys > lens_cap) {
		kvpool__v1__reply__free_unpacked(r, NULL);
		return KVP_ETOOLARGE;
	}
	for (size_t j = 0; j < x->n_keys; j++) {
		if (x->keys[j].len > keys_cap - at) {
			kvpool__v1__reply__free_unpacked(r, NULL);
			return KVP_ETOOLARGE;
		}
		if (x->keys[j].len > 0)
			memcpy(keys + at, x->keys[j].data, x->keys[j].len);
		key_lens[j] = (uint32_t)x->keys[j].len;
		at += x->keys[j].len;
	}
	if (n > 0)
		memcpy(num_keys, x->num_keys, n * sizeof(*num_keys));
	*total = x->n_keys;
	kvpool__v1__reply__free_unpacked(r, NULL);
	return KVP_OK;
}

int
kvp_client_free_queue(struct kvp_client *c, int32_t after, int32_t *ids, size_t cap, size_t *n,
                      bool *more)
{
	Kvpool__V1__FreeQueueRequest m = KVPOOL__V1__FREE_QUEUE_REQUEST__INIT;
	Kvpool__V1__Reply *r = NULL;

	if (c == NULL || n == NULL || more == NULL || (ids == NULL && cap > 0) || after < 0 ||
	    cap > UINT32_MAX)
		return KVP_EINVAL;
	m.after = after;
	m.max_ids = (uint32_t)(cap ? cap : 1);
	KVP_CLIENT_CALL(c, free_queue, FREE_QUEUE, &m, r);
	if (rv != KVP_OK)
		return rv;
	if (r->result_case != KVPOOL__V1__REPLY__RESULT_FREE_QUEUE ||
	    r->free_queue->n_block_ids > cap) {
		kvpool__v1__reply__free_unpacked(r, NULL);
		return kvp_client_fail_(c, KVP_EINTERNAL, "free queue: unexpected reply", NULL);
	}
	*n = r->free_queue->n_block_ids;
	if (*n > 0)
		memcpy(ids, r->free_queue->block_ids, *n * sizeof(*ids));
	*more = r->free_queue->more;
	kvpool__v1__reply__free_unpacked(r, NULL);
	return KVP_OK;
}
