/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pool_report.c: vLLM 0.33's BlockPool.emit_cached_block_events: a
 * BlockStored for the prefix-cache hits a request reused (vLLM's
 * kv_cache_report_mode "full"), so a router learns which session reuses
 * which blocks. It changes nothing in the pool.
 */
#include <assert.h>

#include "common/kvp_status.h"
#include "engine/pool_impl.h"

int
kvp_pool_report_cached(struct kvp_pool *p, const struct kvp_cache_args *a, uint32_t *reported)
{
	uint32_t k, n, nf;
	size_t hlen, olen;
	int rv;

	if (p == NULL || a == NULL || reported == NULL)
		return KVP_EINVAL;
	nf = a->num_full_blocks;
	if (a->num_cached_blocks != 0 || a->block_size == 0 ||
	    a->block_size % p->hash_block_size != 0)
		return KVP_EINVAL;
	k = a->block_size / p->hash_block_size;
	hlen = p->coarse_concat ? (size_t)k * p->hash_len : p->hash_len;
	if (hlen > p->max_hash_len || (a->block_hashes == NULL && nf > 0) ||
	    a->num_block_hashes / k < nf || (a->token_ids == NULL && a->num_tokens > 0) ||
	    kvp_request_keys_validate(a->keys) != KVP_OK)
		return KVP_EINVAL;
	if (!p->caching)
		return KVP_ENOTSUP;
	*reported = 0;
	if (!p->events_on)
		return KVP_OK; /* vLLM's: nothing without enable_kv_cache_events */
	/* Every hash, as vLLM reports them: the caller's hits, cached now or not. */
	n = nf;
	if (n == 0)
		return KVP_OK;
	size_t t0 = 0, t1 = (size_t)n * a->block_size;
	kvp_pool__token_window(a, &t0, &t1);
	if ((rv = kvp_pool__extra_room(p, a->keys)) != KVP_OK ||
	    (rv = kvp_event_batch_reserve(&p->events, 1, kvp_pool__stored_bytes(p, a, n, hlen, false,
	                                                                        t1 - t0))) != KVP_OK)
		return rv;
	struct kvp_stored_desc d = kvp_pool__stored_desc(p, a, hlen, a->block_size, t0, t1, n);
	kvp_event_stored_begin(&p->events, &d);
	int64_t mm_idx = 0;
	for (uint32_t i = 0; i < n; i++) {
		size_t elen = 0;
		int64_t start = (int64_t)i * a->block_size;
		rv = kvp_extra_keys_encode(a->keys, KVP_KEYS_PLAIN, start, start + a->block_size,
		                           &mm_idx, p->extra_buf, p->extra_cap, &elen);
		assert(rv == KVP_OK); /* the room was made above */
		kvp_event_stored_add(&p->events, kvp_pool_coarse_hash(p, a->block_hashes, k, i, &olen),
		                     p->extra_buf, elen);
	}
	kvp_event_stored_end(&p->events);
	*reported = n;
	return KVP_OK;
}
