/* SPDX-License-Identifier: Apache-2.0 */
#include "engine/pool.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/big_alloc.h"
#include "engine/free_queue.h"
#include "engine/hash_map.h"
#include "common/kvp_status.h"
#include "common/map_key.h"
#include "engine/pool_impl.h"


int
kvp_pool_create(const struct kvp_pool_config *cfg, struct kvp_pool **out)
{
	struct kvp_pool *p;
	uint32_t mhl, hl;
	int rv;

	if (cfg == NULL || out == NULL || cfg->num_blocks == 0 ||
	    cfg->num_blocks > INT32_MAX - 3 || cfg->hash_block_size == 0)
		return KVP_EINVAL;
	hl = cfg->hash_len ? cfg->hash_len : KVP_HASH_LEN;
	if (hl != KVP_HASH_LEN && hl != KVP_HASH_MIN_LEN)
		return KVP_EINVAL;
	mhl = cfg->max_hash_len ? cfg->max_hash_len : hl;
	if (mhl % hl != 0 || mhl > 32 * hl)
		return KVP_EINVAL;
	if (cfg->medium != NULL && strlen(cfg->medium) >= sizeof(p->medium))
		return KVP_EINVAL;
	if (kvp_vllm_semantics_name(cfg->semantics) == NULL)
		return KVP_EINVAL;
	if (cfg->metrics != NULL && kvp_metrics_num_blocks(cfg->metrics) < cfg->num_blocks)
		return KVP_EINVAL;
	if ((p = calloc(1, sizeof(*p))) == NULL)
		return KVP_ENOMEM;
	p->n = cfg->num_blocks;
	p->hash_block_size = cfg->hash_block_size;
	p->hash_len = hl;
	p->max_hash_len = mhl;
	p->caching = cfg->enable_caching;
	p->events_on = cfg->enable_events;
	p->free_unhashed_first = cfg->semantics == KVP_VLLM_0_33;
	p->coarse_concat = cfg->semantics == KVP_VLLM_9AAF83EF5;
	p->metrics = cfg->metrics;
	p->on_alloc = cfg->on_alloc;
	p->on_alloc_ctx = cfg->on_alloc_ctx;
	snprintf(p->medium, sizeof(p->medium), "%s", cfg->medium ? cfg->medium : "GPU");
	kvp_event_batch_init(&p->events);
	p->blocks = kvp_big_alloc(((size_t)p->n + 2) * sizeof(*p->blocks));
	p->scratch = malloc((size_t)p->n * sizeof(*p->scratch));
	p->htok = kvp_big_alloc((size_t)p->n * sizeof(*p->htok));
	if (p->blocks == NULL || p->scratch == NULL || p->htok == NULL) {
		kvp_pool_destroy(p);
		return KVP_ENOMEM;
	}
	if ((rv = kvp_map_init(&p->map, p->n, mhl + GROUP_LEN)) != KVP_OK) {
		kvp_pool_destroy(p);
		return rv;
	}
	/* Link 1..N-1 in id order: vLLM links 0..N-1 and then pops 0 as null. */
	kvp_queue_init(&p->queue, p->blocks, p->n, NULL, 0);
	if (p->n > 1) {
		struct kvp_block *b = p->blocks;
		for (uint32_t i = 1; i < p->n; i++) {
			b[i].prev = (int32_t)i - 1;
			b[i].next = (int32_t)i + 1;
		}
		b[1].prev = p->queue.head;
		b[p->n - 1].next = p->queue.tail;
		b[p->queue.head].next = 1;
		b[p->queue.tail].prev = (int32_t)p->n - 1;
		p->queue.num_free = p->n - 1;
	}
	*out = p;
	return KVP_OK;
}

void
kvp_pool_destroy(struct kvp_pool *p)
{
	if (p == NULL)
		return;
	kvp_map_fini(&p->map);
	kvp_map_fini(&p->pending);
	kvp_event_batch_fini(&p->events);
	kvp_big_free(p->blocks, ((size_t)p->n + 2) * sizeof(*p->blocks));
	free(p->scratch);
	free(p->extra_buf);
	kvp_big_free(p->htok, (size_t)p->n * sizeof(*p->htok));
	free(p->xowner);
	free(p->xnext);
	free(p->xhead);
	free(p);
}

/* A fresh mark for duplicate detection; clears all marks on wrap. */
static uint32_t
next_stamp(struct kvp_pool *p)
{
	if (++p->stamp == 0) {
		for (uint32_t i = 0; i < p->n; i++)
			p->blocks[i].mark = 0;
		p->stamp = 1;
	}
	return p->stamp;
}

/* _maybe_evict_cached_block; the caller reserved room for one event. */
static inline __attribute__((always_inline)) void
maybe_evict(struct kvp_pool *p, int32_t id)
{
	size_t len;
	const uint8_t *key;

	if (p->metrics)
		kvp_metrics_on_evicted(p->metrics, id);
	if ((key = kvp_map_key(&p->map, id, &len)) == NULL)
		return;
	if (p->events_on) {
		kvp_event_append_removed(&p->events, key, len - GROUP_LEN, p->medium,
		                         kvp_map_key_group(key, len));
	}
	kvp_map__remove_id(&p->map, id);
	p->num_hashed--;
	p->stats.blocks_evicted++;
	if (p->on_unkey)
		p->on_unkey(p->on_unkey_ctx, id);
	if (__builtin_expect(p->num_extra != 0, 0))
		kvp_pool__drop_extras(p, id);
}

/*
 * Evicts the hashes of n blocks just popped for an allocation (the caller
 * reserved their events), and counts them in the metrics. Out of line: an
 * allocation from a pool with nothing cached should not save the registers
 * it needs.
 */
static __attribute__((noinline)) void
evict_popped(struct kvp_pool *p, const int32_t *ids, uint32_t n)
{
	if (!p->caching) {
		for (uint32_t i = 0; i < n; i++)
			kvp_metrics_on_allocated(p->metrics, ids[i]);
		return;
	}
	if (p->num_hashed > 0) {
		/* The popped blocks' entries and buckets are cold: ask for all first, so misses overlap. */
		for (uint32_t i = 0; i < n; i++)
			kvp_map_prefetch_id(&p->map, ids[i]);
		for (uint32_t i = 0; i < n; i++)
			if (kvp_map_has_id(&p->map, ids[i]))
				kvp_map_prefetch_hash(&p->map, p->map.ent[ids[i]].hash);
	}
	for (uint32_t i = 0; i < n; i++) {
		maybe_evict(p, ids[i]);
		if (p->metrics)
			kvp_metrics_on_allocated(p->metrics, ids[i]);
	}
}

static int
reserve_removed(struct kvp_pool *p, size_t n)
{
	if (!p->events_on || n == 0)
		return KVP_OK;
	size_t per = kvp_event_removed_bytes(p->max_hash_len, p->medium);
	if (n > SIZE_MAX / 2 / per)
		return KVP_ENOMEM;
	return kvp_event_batch_reserve(&p->events, n, n * per);
}

int
kvp_pool_get_new_blocks(struct kvp_pool *p, uint32_t n, int32_t *ids)
{
	int rv;

	if (p == NULL || (ids == NULL && n > 0))
		return KVP_EINVAL;
	if (n > p->queue.num_free) {
		p->stats.alloc_failures++;
		return KVP_ENOSPACE;
	}
	/* Reserve for the worst case (every popped block cached) up front. */
	if (p->caching && p->num_hashed > 0 &&
	    (rv = reserve_removed(p, (n < p->num_hashed ? n : p->num_hashed) + p->num_extra)) !=
	            KVP_OK)
		return rv;
	if (n == 0)
		return KVP_OK;
	kvp_queue__take_n(&p->queue, n, ids); /* each with ref_cnt 1 */
	/* With no hash cached and no metrics, eviction has nothing to do. */
	if (p->metrics != NULL || (p->caching && p->num_hashed > 0))
		evict_popped(p, ids, n);
	if (p->on_alloc != NULL)
		p->on_alloc(p->on_alloc_ctx, ids, n);
	p->stats.blocks_allocated += n;
	return KVP_OK;
}

static int32_t
lookup_group(const struct kvp_pool *p, uint8_t *key, size_t hash_len, uint32_t gid)
{
	kvp_map_key_put_group(key + hash_len, gid);
	return kvp_map_lookup(&p->map, key, hash_len + GROUP_LEN);
}

/* kvp_pool_get_cached_block for several groups or a hash that is not 32 bytes. */
static __attribute__((noinline)) int
get_cached_slow(const struct kvp_pool *p, const uint8_t *hash, size_t hash_len,
                const uint32_t *groups, size_t ngroups, int32_t *ids)
{
	uint8_t key[MAX_KEY];

	memcpy(key, hash, hash_len);
	/* All or nothing: prove every group hits before writing any id (one group: one lookup). */
	for (size_t g = 0; g < ngroups; g++) {
		int32_t id = lookup_group(p, key, hash_len, groups[g]);
		if (id < 0)
			return KVP_ENOTFOUND;
		if (ngroups == 1)
			ids[0] = kvp_pool__owner(p, id);
	}
	for (size_t g = 0; ngroups > 1 && g < ngroups; g++)
		ids[g] = kvp_pool__owner(p, lookup_group(p, key, hash_len, groups[g]));
	return KVP_OK;
}

int
kvp_pool_get_cached_block(const struct kvp_pool *p, const uint8_t *hash, size_t hash_len,
                          const uint32_t *groups, size_t ngroups, int32_t *ids)
{
	/* The common call first: one group, a 32-byte hash, and no key to build. */
	if (hash_len != KVP_HASH_LEN || ngroups != 1 || p == NULL || hash == NULL ||
	    groups == NULL || ids == NULL || p->max_hash_len < KVP_HASH_LEN) {
		if (p == NULL || hash == NULL || hash_len == 0 || hash_len > p->max_hash_len ||
		    (ngroups > 0 && (groups == NULL || ids == NULL)))
			return KVP_EINVAL;
		return get_cached_slow(p, hash, hash_len, groups, ngroups, ids);
	}
	uint8_t gbe[GROUP_LEN];
	kvp_map_key_put_group(gbe, groups[0]);
	int32_t id = kvp_map__lookup_hg(&p->map, hash, gbe);
	if (id < 0)
		return KVP_ENOTFOUND;
	ids[0] = kvp_pool__owner(p, id);
	return KVP_OK;
}

int
kvp_pool_touch(struct kvp_pool *p, const int32_t *ids, size_t n)
{
	if (p == NULL || (ids == NULL && n > 0))
		return KVP_EINVAL;
	struct kvp_block *b = p->blocks; /* locals: the stores below could alias p's fields */
	uint32_t nb = p->n;
	struct kvp_metrics *mt = p->metrics;
	for (size_t i = 0; i < n; i++) {
		int32_t id = ids[i];
		if ((uint32_t)id - 1u >= nb - 1u) { /* the null block (0), or out of range */
			if (id == KVP_NULL_BLOCK)
				continue;
			return KVP_ERANGE; /* a negative id too */
		}
		/* Duplicates add up; refuse anything that could overflow. */
		if (b[id].ref_cnt > INT32_MAX - (int64_t)n)
			return KVP_ESTATE;
		if (b[id].ref_cnt == 0 && !kvp_queue_contains(&p->queue, id))
			return KVP_ESTATE; /* vLLM raises; impossible while invariants hold */
	}
	uint32_t unlinked = 0;
	for (size_t i = 0; i < n; i++) {
		int32_t id = ids[i];
		if (id != KVP_NULL_BLOCK) {
			if (b[id].ref_cnt == 0) { /* queued (checked above): take it out */
				kvp_queue__unlink(b, id);
				unlinked++;
			}
			b[id].ref_cnt++;
		}
		if (mt)
			kvp_metrics_on_accessed(mt, id);
	}
	p->queue.num_free -= unlinked;
	return KVP_OK;
}

int
kvp_pool_free_blocks(struct kvp_pool *p, const int32_t *ids, size_t n)
{
	uint32_t mark;

	if (p == NULL || (ids == NULL && n > 0))
		return KVP_EINVAL;
	mark = next_stamp(p);
	struct kvp_block *b = p->blocks;
	uint32_t nb = p->n;
#pragma GCC unroll 4
	for (size_t i = 0; i < n; i++) {
		int32_t id = ids[i];
		/* One test for both: the null block (0) and anything out of range. */
		if ((uint32_t)id - 1u >= nb - 1u) {
			if (id == KVP_NULL_BLOCK)
				continue;
			return KVP_ERANGE; /* a negative id too */
		}
		if (b[id].mark == mark)
			return KVP_EINVAL;
		if (b[id].ref_cnt == 0)
			return KVP_ESTATE;
		b[id].mark = mark;
	}
	/*
	 * Each block appears once, so deciding and linking in one pass keeps
	 * vLLM's order (all decrements, then the unhashed prepended in list
	 * order, then the hashed appended in list order): a block's place
	 * depends only on its own hash, which freeing does not change. The
	 * prepended ones go in after front, the last one prepended.
	 */
	int32_t last = b[p->queue.tail].prev, front = p->queue.head;
	struct kvp_block *lb = &b[last]; /* &b[last], kept so it is not recomputed */
	uint32_t appended = 0;
	const bool split = p->free_unhashed_first;
#pragma GCC unroll 4
	for (size_t i = 0; i < n; i++) {
		int32_t id = ids[i];
		if (id == KVP_NULL_BLOCK || --b[id].ref_cnt != 0)
			continue;
		appended++;
		/* A reserved block whose reserver went without commit or abort: its key goes too. */
		if (__builtin_expect(p->num_pending != 0, 0) && kvp_map_has_id(&p->pending, id))
			kvp_pool__drop_pending(p, id);
		if (split && (!p->caching || !kvp_map_has_id(&p->map, id))) {
			int32_t nx = b[front].next;
			b[id].prev = front;
			b[id].next = nx;
			b[front].next = id;
			b[nx].prev = id;
			if (front == last) /* the queue was empty: id is also its tail */
				last = id, lb = &b[id];
			front = id;
			continue;
		}
		lb->next = id;
		b[id].prev = last;
		last = id;
		lb = &b[id];
	}
	lb->next = p->queue.tail;
	b[p->queue.tail].prev = last;
	p->queue.num_free += appended;
	return KVP_OK;
}

/* Writes block id's key (hash h, group gbe) into its slot of the map's key slab, and its hash. */
static inline __attribute__((always_inline)) void
stage_key(struct kvp_pool *p, int32_t id, const uint8_t *h, size_t hlen, const uint8_t *gbe)
{
	uint8_t *key = kvp_map__slot_mut(&p->map, id);
	uint32_t kh;
	if (hlen == KVP_HASH_LEN) {
		memcpy(key, h, KVP_HASH_LEN); /* a constant size: moves */
		memcpy(key + KVP_HASH_LEN, gbe, GROUP_LEN);
		kh = kvp_map__hash_hg(&p->map, h, gbe);
	} else {
		memcpy(key, h, hlen);
		memcpy(key + hlen, gbe, GROUP_LEN);
		kh = kvp_map_hash(&p->map, key, hlen + GROUP_LEN);
	}
	p->map.ent[id].hash = kh;
	kvp_map_prefetch_hash(&p->map, kh);
}

int
kvp_pool_cache_full_blocks(struct kvp_pool *p, const int32_t *blocks, size_t num_blocks,
                           const struct kvp_cache_args *a)
{
	uint32_t k, nc, nf, mark;
	size_t hlen, olen, stored = 0, promoted = 0; /* olen: kvp_pool_coarse_hash's, always hlen */
	int rv;

	if (p == NULL || a == NULL || (blocks == NULL && num_blocks > 0))
		return KVP_EINVAL;
	nc = a->num_cached_blocks;
	nf = a->num_full_blocks;
	if (nc >= nf)
		return KVP_OK;
	if (!p->caching)
		return KVP_ENOTSUP;
	if (a->block_size == 0 || a->block_size % p->hash_block_size != 0)
		return KVP_EINVAL;
	k = a->block_size / p->hash_block_size;
	hlen = p->coarse_concat ? (size_t)k * p->hash_len : p->hash_len;
	if (hlen > p->max_hash_len || nf > num_blocks || a->block_hashes == NULL ||
	    a->num_block_hashes / k < nf || (a->token_ids == NULL && a->num_tokens > 0) ||
	    kvp_request_keys_validate(a->keys) != KVP_OK)
		return KVP_EINVAL;
	/*
	 * One pass checks every block and stages its key: built in the block's
	 * own slot of the map's key slab, hashed into its (unused) map entry,
	 * its bucket prefetched so the buckets' misses overlap. A block not in
	 * the map has no key, so a refused call leaves nothing visible behind.
	 */
	struct kvp_block *b = p->blocks; /* locals: the stores below could alias p's and a's fields */
	const bool *mask = a->block_mask;
	const bool events = p->events_on;
	uint32_t nblk = p->n;
	size_t klen = hlen + GROUP_LEN;
	uint8_t gbe[GROUP_LEN];
	kvp_map_key_put_group(gbe, a->group_id);
	mark = next_stamp(p);
	for (uint32_t i = nc; i < nf; i++) {
		int32_t id = blocks[i];
		if ((uint32_t)id >= nblk) /* a negative id too */
			return KVP_ERANGE;
		if (id == KVP_NULL_BLOCK || (mask && !mask[i - nc]))
			continue;
		if (b[id].mark == mark)
			return KVP_EINVAL;
		if (b[id].ref_cnt == 0 || (p->num_pending != 0 && kvp_map_has_id(&p->pending, id)))
			return KVP_ESTATE;
		b[id].mark = mark;
		stored++;
		if (__builtin_expect(kvp_map_has_id(&p->map, id), 0)) {
			/* Only a partial primary's promotion to its whole block (vLLM 0.33;
			 * vLLM would re-key any block covering fewer tokens): the old keys
			 * go first, so its key is staged after them. */
			if (!(p->htok[id] & HTOK_PARTIAL) ||
			    (p->htok[id] & ~HTOK_PARTIAL) >= (uint64_t)(i + 1) * a->block_size)
				return KVP_ESTATE;
			promoted += 1 + kvp_pool__num_extras(p, id);
			continue;
		}
		stage_key(p, id, kvp_pool_coarse_hash(p, a->block_hashes, k, i, &olen), hlen, gbe);
	}
	/* all_token_ids[nc*bs : nf*bs], Python slice clamping, over a window of
	 * the request's tokens that starts at first_token. */
	size_t t0 = (size_t)nc * a->block_size, t1 = (size_t)nf * a->block_size;
	if (p->events_on) {
		kvp_pool__token_window(a, &t0, &t1);
		if ((rv = kvp_pool__extra_room(p, a->keys)) != KVP_OK)
			return rv;
		rv = kvp_event_batch_reserve(
			&p->events, 1 + promoted,
			kvp_pool__stored_bytes(p, a, stored, hlen, nc > 0, t1 - t0) +
			        promoted * kvp_event_removed_bytes(p->max_hash_len, p->medium));
		if (rv != KVP_OK)
			return rv;
	}
	for (uint32_t i = nc; promoted > 0 && i < nf; i++) {
		int32_t id = blocks[i];
		if (id == KVP_NULL_BLOCK || (mask && !mask[i - nc]) || !kvp_map_has_id(&p->map, id))
			continue;
		kvp_pool__drop_all(p, id); /* its BlockRemoveds precede the BlockStored, as vLLM's */
		stage_key(p, id, kvp_pool_coarse_hash(p, a->block_hashes, k, i, &olen), hlen, gbe);
	}
	if (p->events_on) {
		struct kvp_stored_desc d = kvp_pool__stored_desc(p, a, hlen, a->block_size, t0, t1, stored);
		d.parent = nc > 0 ? kvp_pool_coarse_hash(p, a->block_hashes, k, nc - 1, &olen) : NULL;
		kvp_event_stored_begin(&p->events, &d);
	}
	int64_t mm_idx = 0;
	for (uint32_t i = nc; i < nf; i++) {
		int32_t id = blocks[i];
		if (id == KVP_NULL_BLOCK || (mask && !mask[i - nc]))
			continue;
		kvp_map__insert_slot(&p->map, id, klen, p->map.ent[id].hash);
		uint64_t ntok = (uint64_t)(i + 1) * a->block_size;
		p->htok[id] = ntok < HTOK_PARTIAL ? (uint32_t)ntok : HTOK_PARTIAL - 1;
		if (events) {
			size_t elen = 0;
			int64_t start = (int64_t)i * a->block_size;
			rv = kvp_extra_keys_encode(a->keys, KVP_KEYS_PLAIN, start, start + a->block_size, &mm_idx,
			                           p->extra_buf, p->extra_cap, &elen);
			assert(rv == KVP_OK);
			kvp_event_stored_add(&p->events,
			                     kvp_pool_coarse_hash(p, a->block_hashes, k, i, &olen),
			                     p->extra_buf, elen);
		}
	}
	p->num_hashed += stored;
	if (p->events_on)
		kvp_event_stored_end(&p->events);
	p->stats.blocks_stored += stored;
	return KVP_OK;
}

const uint8_t *
kvp_pool_coarse_hash(const struct kvp_pool *p, const uint8_t *fine, uint32_t k, size_t i,
                     size_t *len)
{
	if (p->coarse_concat) {
		*len = (size_t)k * p->hash_len;
		return fine + i * k * p->hash_len;
	}
	*len = p->hash_len;
	return fine + ((i + 1) * k - 1) * p->hash_len;
}

enum kvp_vllm_semantics
kvp_pool_semantics(const struct kvp_pool *p)
{
	return p->coarse_concat ? KVP_VLLM_9AAF83EF5 : KVP_VLLM_0_33;
}

const char *
kvp_vllm_semantics_name(enum kvp_vllm_semantics s)
{
	switch (s) {
	case KVP_VLLM_0_33:
		return "0.33";
	case KVP_VLLM_9AAF83EF5:
		return "9aaf83ef5";
	}
	return NULL;
}

int
kvp_vllm_semantics_parse(const char *name, enum kvp_vllm_semantics *out)
{
	if (name == NULL || out == NULL)
		return KVP_EINVAL;
	for (int s = KVP_VLLM_0_33; s <= KVP_VLLM_9AAF83EF5; s++) {
		if (strcmp(name, kvp_vllm_semantics_name((enum kvp_vllm_semantics)s)) == 0) {
			*out = (enum kvp_vllm_semantics)s;
			return KVP_OK;
		}
	}
	return KVP_EINVAL;
}

int
kvp_pool_evict_blocks(struct kvp_pool *p, const int32_t *ids, size_t n)
{
	uint32_t mark;
	size_t m = 0, hashed = 0;
	int rv;

	if (p == NULL || (ids == NULL && n > 0))
		return KVP_EINVAL;
	mark = next_stamp(p);
	for (size_t i = 0; i < n; i++) {
		int32_t id = ids[i];
		if (id < 0 || (uint32_t)id >= p->n)
			return KVP_ERANGE;
		if (p->blocks[id].mark == mark)
			continue;
		p->blocks[id].mark = mark;
		p->scratch[m++] = id;
		if (kvp_map_has_id(&p->map, id))
			hashed += 1 + kvp_pool__num_extras(p, id);
	}
	if ((rv = reserve_removed(p, hashed)) != KVP_OK)
		return rv;
	for (size_t i = 0; i < m; i++)
		maybe_evict(p, p->scratch[i]);
	return KVP_OK;
}

int
kvp_pool_reset_prefix_cache(struct kvp_pool *p)
{
	int rv;

	if (p == NULL)
		return KVP_EINVAL;
	if (p->n - p->queue.num_free != 1)
		return KVP_ESTATE;
	if (p->events_on && (rv = kvp_event_batch_reserve(&p->events, 1, 0)) != KVP_OK)
		return rv;
	kvp_map_clear(&p->map);
	kvp_pool__clear_extras(p);
	p->num_hashed = 0;
	if (p->on_unkey)
		p->on_unkey(p->on_unkey_ctx, -1);
	if (p->metrics)
		kvp_metrics_reset(p->metrics);
	if (p->events_on)
		kvp_event_append_cleared(&p->events);
	p->stats.resets++;
	return KVP_OK;
}

int
kvp_pool_take_events(struct kvp_pool *p, struct kvp_event_batch *out)
{
	if (p == NULL || out == NULL)
		return KVP_EINVAL;
	kvp_event_batch_swap(&p->events, out);
	kvp_event_batch_clear(&p->events);
	return KVP_OK;
}
