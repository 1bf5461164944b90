#define _POSIX_C_SOURCE 200809L

#include "dispatch.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "manager.h"
#include "pool.h"
#include "wire.h"

#define MAX_GROUPS_PER_LOOKUP 64
#define MAX_MM_FEATURES 256

/* One call in progress: its status, detail, and its pool's scratch arena. */
struct call {
	struct kvpd_pool *p;
	struct kvpd_session *sess;
	int status;
	char detail[256];
	bool oom;
};

static int
fail(struct call *c, int status, const char *fmt, ...)
{
	va_list ap;
	c->status = status;
	va_start(ap, fmt);
	vsnprintf(c->detail, sizeof(c->detail), fmt, ap);
	va_end(ap);
	return status;
}

/*
 * Zeroed memory that lives until the call's reply is packed. It comes from
 * the pool's arena (the pool's lock is held): a batch builds hundreds of
 * reply messages, and a heap allocation each cost more than the calls.
 */
static void *
scratch(struct call *c, size_t n)
{
	struct kvpd_arena *a = &c->p->arena;
	size_t need = (n + 15) & ~(size_t)15;

	if (need == 0)
		need = 16;
	if (a->cur == NULL || a->cur->used + need > a->cur->cap) {
		/* The next kept chunk if it fits, else a new one. */
		struct kvpd_chunk *next = a->cur ? a->cur->next : a->head;
		if (next == NULL || next->cap < need) {
			size_t cap = need > KVPD_CHUNK ? need : KVPD_CHUNK;
			struct kvpd_chunk *ch = calloc(1, sizeof(*ch) + cap);
			if (ch == NULL) {
				c->oom = true;
				return NULL;
			}
			ch->cap = cap;
			ch->next = next;
			if (a->cur)
				a->cur->next = ch;
			else
				a->head = ch;
			next = ch;
		}
		a->cur = next;
	}
	void *p = a->cur->data + a->cur->used;
	a->cur->used += need;
	return p;
}

/* Zeroes what the call used and keeps the chunks (freeing oversized ones). */
static void
scratch_reset(struct kvpd_pool *p)
{
	struct kvpd_arena *a = &p->arena;
	struct kvpd_chunk **link = &a->head;
	size_t kept = 0;

	while (*link) {
		struct kvpd_chunk *ch = *link;
		memset(ch->data, 0, ch->used);
		ch->used = 0;
		if (kept + ch->cap > KVPD_ARENA_KEEP) {
			*link = ch->next;
			free(ch);
			continue;
		}
		kept += ch->cap;
		link = &ch->next;
	}
	a->cur = NULL;
}

void
kvpd_arena_fini(struct kvpd_arena *a)
{
	while (a->head) {
		struct kvpd_chunk *ch = a->head;
		a->head = ch->next;
		free(ch);
	}
	a->cur = NULL;
}

/* A zeroed, initialised protobuf-c message that frees itself with the call. */
static void *
new_msg(struct call *c, const ProtobufCMessageDescriptor *d)
{
	void *m = scratch(c, d->sizeof_message);
	if (m != NULL)
		protobuf_c_message_init(d, m);
	return m;
}

#define NEW(c, type, desc) ((type *)new_msg((c), &(desc)))

/* A batch call's oneof numbers are the request's: one switch serves both. */
#define SAME_CASE(x) \
	_Static_assert((int)KVPOOL__V1__BATCH_CALL__CALL_##x == (int)KVPOOL__V1__REQUEST__CALL_##x, #x)
SAME_CASE(ALLOCATE);
SAME_CASE(TOUCH);
SAME_CASE(FREE);
SAME_CASE(CACHE);
SAME_CASE(LOOKUP);
SAME_CASE(EVICT);
SAME_CASE(STATS);
SAME_CASE(ALLOCATE_SLOTS);
SAME_CASE(FREE_REQUEST);
SAME_CASE(GET_COMPUTED_BLOCKS);
#undef SAME_CASE

static int
check_ids(struct call *c, const int32_t *ids, size_t n)
{
	uint32_t nb = kvp_pool_num_blocks(c->p->pool);
	if (n > c->p->limits.max_ids)
		return fail(c, KVP_EINVAL, "%zu ids in one call; the limit is %u", n,
		            c->p->limits.max_ids);
	for (size_t i = 0; i < n; i++)
		if (ids[i] < 0 || (uint32_t)ids[i] >= nb)
			return fail(c, KVP_ERANGE, "block id %d is outside the pool (0..%u)", ids[i],
			            nb - 1);
	return KVP_OK;
}

/* The session must hold one reference per occurrence of each non-null id. */
static int
check_owned(struct call *c, const int32_t *ids, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (ids[i] == KVP_NULL_BLOCK)
			continue;
		/* Repeats need one reference each; in long lists the engine refuses them. */
		uint32_t need = 1;
		for (size_t j = 0; n <= 64 && j < i; j++)
			need += ids[j] == ids[i];
		if (kvpd_session_held(c->sess, ids[i]) < need)
			return fail(c, KVP_ENOTOWNER, "this session holds no reference on block %d",
			            ids[i]);
	}
	return KVP_OK;
}

static int
engine(struct call *c, int rv, const char *what)
{
	if (rv != KVP_OK)
		return fail(c, rv, "%s: %s", what, kvp_strerror(rv));
	return KVP_OK;
}

/* ---- block-level calls ---- */

static int
h_allocate(struct call *c, const Kvpool__V1__AllocateRequest *m, Kvpool__V1__Reply *out)
{
	Kvpool__V1__AllocateReply *r;
	int32_t *ids;
	int rv;

	if (m->num_blocks > c->p->limits.max_ids)
		return fail(c, KVP_EINVAL, "%u blocks in one call; the limit is %u", m->num_blocks,
		            c->p->limits.max_ids);
	if (m->num_blocks > kvp_pool_num_free(c->p->pool))
		return fail(c, KVP_ENOSPACE, "%u blocks asked, %u free", m->num_blocks,
		            kvp_pool_num_free(c->p->pool));
	r = NEW(c, Kvpool__V1__AllocateReply, kvpool__v1__allocate_reply__descriptor);
	ids = scratch(c, (size_t)m->num_blocks * sizeof(*ids));
	if (r == NULL || ids == NULL || kvpd_session_reserve(c->sess, m->num_blocks) != KVP_OK)
		return fail(c, KVP_ENOMEM, "out of memory");
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

static int
h_touch(struct call *c, const Kvpool__V1__TouchRequest *m, Kvpool__V1__Reply *out)
{
	Kvpool__V1__TouchReply *r = NEW(c, Kvpool__V1__TouchReply, kvpool__v1__touch_reply__descriptor);
	int rv;

	if ((rv = check_ids(c, m->block_ids, m->n_block_ids)))
		return rv;
	if (r == NULL || kvpd_session_reserve(c->sess, m->n_block_ids) != KVP_OK)
		return fail(c, KVP_ENOMEM, "out of memory");
	if ((rv = engine(c, kvp_pool_touch(c->p->pool, m->block_ids, m->n_block_ids), "touch")))
		return rv;
	for (size_t i = 0; i < m->n_block_ids; i++)
		if (m->block_ids[i] != KVP_NULL_BLOCK)
			kvpd_session_add(c->sess, m->block_ids[i]);
	out->result_case = KVPOOL__V1__REPLY__RESULT_TOUCH;
	out->touch = r;
	return KVP_OK;
}

static int
h_free(struct call *c, const Kvpool__V1__FreeRequest *m, Kvpool__V1__Reply *out)
{
	Kvpool__V1__FreeReply *r = NEW(c, Kvpool__V1__FreeReply, kvpool__v1__free_reply__descriptor);
	int rv;

	if ((rv = check_ids(c, m->block_ids, m->n_block_ids)) ||
	    (rv = check_owned(c, m->block_ids, m->n_block_ids)))
		return rv;
	if (r == NULL)
		return fail(c, KVP_ENOMEM, "out of memory");
	if ((rv = engine(c, kvp_pool_free_blocks(c->p->pool, m->block_ids, m->n_block_ids), "free")))
		return rv;
	for (size_t i = 0; i < m->n_block_ids; i++)
		if (m->block_ids[i] != KVP_NULL_BLOCK)
			kvpd_session_remove(c->sess, m->block_ids[i]);
	out->result_case = KVPOOL__V1__REPLY__RESULT_FREE;
	out->free = r;
	return KVP_OK;
}

/* A call's extra-key sources, decoded from the wire. */
struct call_keys {
	struct kvp_mm_feature mm[MAX_MM_FEATURES];
	struct kvp_request_keys keys;
	const struct kvp_request_keys *ptr; /* NULL when the call has none */
	bool has_lora_id;
	int64_t lora_id;
};

static int
parse_keys(struct call *c, const Kvpool__V1__RequestKeys *k, struct call_keys *out)
{
	if (kvp_wire_keys_from_proto(k, &out->keys, out->mm, MAX_MM_FEATURES, &out->has_lora_id,
	                             &out->lora_id) != KVP_OK)
		return fail(c, KVP_EINVAL, "bad request keys (mm features unsorted, or over %d)",
		            MAX_MM_FEATURES);
	out->ptr = k ? &out->keys : NULL;
	return KVP_OK;
}

/*
 * The fine hashes of a call: given (a multiple of 32 bytes) or computed
 * from the request's tokens (from position 0) and keys.
 */
static int
fine_hashes(struct call *c, ProtobufCBinaryData given, const int64_t *tokens, size_t ntok,
            const struct kvp_request_keys *keys, const uint8_t **out, size_t *n, bool *computed)
{
	uint32_t hbs = kvp_pool_hash_block_size(c->p->pool);
	*computed = false;
	if (given.len > 0) {
		if (given.len % KVP_HASH_LEN != 0)
			return fail(c, KVP_EINVAL, "block_hashes is %zu bytes, not a multiple of 32",
			            given.len);
		if (given.len / KVP_HASH_LEN > c->p->limits.max_ids)
			return fail(c, KVP_EINVAL, "too many hashes in one call");
		*out = given.data;
		*n = given.len / KVP_HASH_LEN;
		return KVP_OK;
	}
	if (ntok > c->p->limits.max_ids)
		return fail(c, KVP_EINVAL, "%zu tokens in one call; the limit is %u", ntok,
		            c->p->limits.max_ids);
	size_t full = ntok / hbs;
	uint8_t *buf = scratch(c, full * KVP_HASH_LEN);
	if (buf == NULL)
		return fail(c, KVP_ENOMEM, "out of memory");
	int rv = kvp_hash_request(c->p->hasher, keys, tokens, ntok, hbs, NULL, 0, buf, full, n);
	if (rv != KVP_OK)
		return fail(c, rv, "hashing tokens: %s", kvp_strerror(rv));
	*out = buf;
	*computed = true;
	return KVP_OK;
}

static int
h_cache(struct call *c, const Kvpool__V1__CacheRequest *m, Kvpool__V1__Reply *out)
{
	Kvpool__V1__CacheReply *r = NEW(c, Kvpool__V1__CacheReply, kvpool__v1__cache_reply__descriptor);
	struct call_keys ck;
	bool computed;
	const uint8_t *hashes = NULL;
	size_t nh = 0;
	bool *mask = NULL;
	int rv;

	if (r == NULL)
		return fail(c, KVP_ENOMEM, "out of memory");
	if ((rv = check_ids(c, m->block_ids, m->n_block_ids)))
		return rv;
	if (m->n_token_ids > c->p->limits.max_ids)
		return fail(c, KVP_EINVAL, "too many tokens in one call");
	if ((rv = parse_keys(c, m->keys, &ck)))
		return rv;
	uint32_t nc = m->num_cached_blocks, nf = m->num_full_blocks;
	if (nf > m->n_block_ids)
		return fail(c, KVP_EINVAL, "num_full_blocks %u > %zu block ids", nf, m->n_block_ids);
	if (m->block_mask.len > 0) {
		if (nf < nc || m->block_mask.len != (size_t)(nf - nc))
			return fail(c, KVP_EINVAL, "block_mask must have num_full - num_cached entries");
		if ((mask = scratch(c, m->block_mask.len * sizeof(*mask))) == NULL)
			return fail(c, KVP_ENOMEM, "out of memory");
		for (size_t i = 0; i < m->block_mask.len; i++)
			mask[i] = m->block_mask.data[i] != 0;
	}
	for (uint32_t i = nc; i < nf; i++) {
		int32_t id = m->block_ids[i];
		if (id != KVP_NULL_BLOCK && (mask == NULL || mask[i - nc]) &&
		    kvpd_session_held(c->sess, id) == 0)
			return fail(c, KVP_ENOTOWNER, "this session holds no reference on block %d", id);
	}
	uint32_t hbs = kvp_pool_hash_block_size(c->p->pool);
	size_t first_token = 0;
	if (m->parent_hash.len > 0) {
		/* Only the new tokens, chained from the caller's last hash. */
		uint8_t *all;
		size_t n = 0;
		if (m->parent_hash.len != KVP_HASH_LEN || nc == 0 || nf < nc ||
		    (m->block_size && m->block_size != hbs) || m->block_hashes.len > 0)
			return fail(c, KVP_EINVAL, "parent_hash needs 32 bytes, num_cached_blocks >= 1, "
			                           "token_ids (not block_hashes) and the pool's block size");
		if ((all = scratch(c, (size_t)nf * KVP_HASH_LEN)) == NULL)
			return fail(c, KVP_ENOMEM, "out of memory");
		memcpy(all + (size_t)(nc - 1) * KVP_HASH_LEN, m->parent_hash.data, KVP_HASH_LEN);
		/* Hash only the blocks to cache; later tokens (a partial block) wait. */
		size_t want = (size_t)(nf - nc) * hbs;
		rv = kvp_hash_chain(c->p->hasher, ck.ptr, m->token_ids,
		                    m->n_token_ids < want ? m->n_token_ids : want, hbs, nc,
		                    m->parent_hash.data, all + (size_t)nc * KVP_HASH_LEN, nf - nc, &n);
		if (rv != KVP_OK)
			return fail(c, rv, "hashing tokens: %s", kvp_strerror(rv));
		if (n < nf - nc)
			return fail(c, KVP_EINVAL, "%zu token(s) fill %zu of the %u blocks to cache",
			            m->n_token_ids, n, nf - nc);
		hashes = all;
		nh = nf;
		first_token = (size_t)nc * hbs;
	} else if ((rv = fine_hashes(c, m->block_hashes, m->token_ids, m->n_token_ids, ck.ptr,
	                             &hashes, &nh, &computed))) {
		return rv;
	}
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
		return fail(c, rv, "cache: bad range, block size, hash list or mask (num_cached %u, "
		                   "num_full %u, %zu hashes, block_size %u)", nc, nf, nh, a.block_size);
	if ((rv = engine(c, rv, "cache")))
		return rv;
	kvp_pool_get_stats(c->p->pool, &after);
	r->num_stored = (uint32_t)(after.blocks_stored - before.blocks_stored);
	out->result_case = KVPOOL__V1__REPLY__RESULT_CACHE;
	out->cache = r;
	return KVP_OK;
}

static int
h_lookup(struct call *c, const Kvpool__V1__LookupRequest *m, Kvpool__V1__Reply *out)
{
	Kvpool__V1__LookupReply *r = NEW(c, Kvpool__V1__LookupReply, kvpool__v1__lookup_reply__descriptor);
	struct call_keys ck;
	bool computed;
	const uint8_t *hashes = NULL;
	size_t nh = 0;
	const uint32_t g0 = 0;
	const uint32_t *groups = m->n_group_ids ? m->group_ids : &g0;
	size_t ng = m->n_group_ids ? m->n_group_ids : 1;
	uint32_t hbs = kvp_pool_hash_block_size(c->p->pool);
	uint32_t bs = m->block_size ? m->block_size : hbs;
	int rv;

	if (r == NULL)
		return fail(c, KVP_ENOMEM, "out of memory");
	if (ng > MAX_GROUPS_PER_LOOKUP)
		return fail(c, KVP_EINVAL, "%zu groups in one lookup; the limit is %d", ng,
		            MAX_GROUPS_PER_LOOKUP);
	if (bs % hbs != 0 || (size_t)(bs / hbs) * KVP_HASH_LEN > kvp_pool_max_hash_len(c->p->pool))
		return fail(c, KVP_EINVAL, "block_size %u is not a supported multiple of %u", bs, hbs);
	if ((rv = parse_keys(c, m->keys, &ck)) ||
	    (rv = fine_hashes(c, m->block_hashes, m->token_ids, m->n_token_ids, ck.ptr, &hashes,
	                      &nh, &computed)))
		return rv;
	uint32_t k = bs / hbs;
	size_t ncoarse = nh / k, hit = 0;
	int32_t *ids = scratch(c, ncoarse * ng * sizeof(*ids));
	int32_t *row = scratch(c, ng * sizeof(*row));
	if (ids == NULL || row == NULL)
		return fail(c, KVP_ENOMEM, "out of memory");
	/* Left to right, all groups per position, stopping at the first miss. */
	while (hit < ncoarse &&
	       kvp_pool_get_cached_block(c->p->pool, hashes + hit * k * KVP_HASH_LEN,
	                                 (size_t)k * KVP_HASH_LEN, groups, ng, row) == KVP_OK) {
		for (size_t g = 0; g < ng; g++)
			ids[g * ncoarse + hit] = row[g];
		hit++;
	}
	/* Compact to hit entries per group, group after group. */
	for (size_t g = 1; g < ng; g++)
		memmove(ids + g * hit, ids + g * ncoarse, hit * sizeof(*ids));
	r->num_hit_blocks = (uint32_t)hit;
	r->block_ids = ids;
	r->n_block_ids = hit * ng;
	r->hit_tokens = (uint32_t)(hit * bs);
	if (computed) {
		r->block_hashes.data = (uint8_t *)hashes;
		r->block_hashes.len = nh * KVP_HASH_LEN;
	}
	out->result_case = KVPOOL__V1__REPLY__RESULT_LOOKUP;
	out->lookup = r;
	return KVP_OK;
}

static int
h_evict(struct call *c, const Kvpool__V1__EvictRequest *m, Kvpool__V1__Reply *out)
{
	Kvpool__V1__EvictReply *r = NEW(c, Kvpool__V1__EvictReply, kvpool__v1__evict_reply__descriptor);
	struct kvp_pool_stats before, after;
	int rv;

	if (r == NULL)
		return fail(c, KVP_ENOMEM, "out of memory");
	if ((rv = check_ids(c, m->block_ids, m->n_block_ids)))
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

static int
h_reset(struct call *c, Kvpool__V1__Reply *out)
{
	Kvpool__V1__ResetReply *r = NEW(c, Kvpool__V1__ResetReply, kvpool__v1__reset_reply__descriptor);
	int rv;

	if (r == NULL)
		return fail(c, KVP_ENOMEM, "out of memory");
	rv = kvp_pool_reset_prefix_cache(c->p->pool);
	if (rv == KVP_ESTATE)
		return fail(c, rv, "reset refused: %u blocks are in use",
		            kvp_pool_num_blocks(c->p->pool) - 1 - kvp_pool_num_free(c->p->pool));
	if ((rv = engine(c, rv, "reset")))
		return rv;
	out->result_case = KVPOOL__V1__REPLY__RESULT_RESET;
	out->reset = r;
	return KVP_OK;
}

static int
h_stats(struct call *c, Kvpool__V1__Reply *out)
{
	Kvpool__V1__StatsReply *r = NEW(c, Kvpool__V1__StatsReply, kvpool__v1__stats_reply__descriptor);

	if (r == NULL)
		return fail(c, KVP_ENOMEM, "out of memory");
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

/* ---- request-level calls (vLLM's KVCacheManager) ---- */

static int
mgr_status(struct call *c, int rv, const char *what)
{
	switch (rv) {
	case KVP_OK:
		return KVP_OK;
	case KVP_ENOSPACE:
		return fail(c, rv, "%s: not enough free blocks (%u free): preempt and retry", what,
		            kvp_pool_num_free(c->p->pool));
	case KVP_ESTATE:
		return fail(c, rv, "%s: a prefix hit was evicted meanwhile, or the request is in a "
		                   "state that forbids this", what);
	case KVP_EBUSY:
		return fail(c, rv, "%s: the pool's request limit is reached", what);
	default:
		return fail(c, rv, "%s: %s", what, kvp_strerror(rv));
	}
}

static int
h_allocate_slots(struct call *c, const Kvpool__V1__AllocateSlotsRequest *m, Kvpool__V1__Reply *out)
{
	Kvpool__V1__AllocateSlotsReply *r =
		NEW(c, Kvpool__V1__AllocateSlotsReply, kvpool__v1__allocate_slots_reply__descriptor);
	uint64_t mid = kvpd_session_request(c->sess, m->request_id);
	int rv;

	if (r == NULL)
		return fail(c, KVP_ENOMEM, "out of memory");
	if (m->n_prompt_token_ids > c->p->limits.max_ids || m->n_new_token_ids > c->p->limits.max_ids ||
	    m->num_new_tokens > c->p->limits.max_ids || m->num_lookahead_tokens > c->p->limits.max_ids)
		return fail(c, KVP_EINVAL, "too many tokens in one call; the limit is %u",
		            c->p->limits.max_ids);
	if (mid == 0) {
		struct call_keys ck;
		if (m->n_prompt_token_ids == 0)
			return fail(c, KVP_ENOTFOUND, "no request %llu in this session (send its prompt "
			                              "to add it)", (unsigned long long)m->request_id);
		if ((rv = parse_keys(c, m->keys, &ck)))
			return rv;
		struct kvp_request_desc d = {.prompt = m->prompt_token_ids,
		                             .num_prompt = m->n_prompt_token_ids, .keys = ck.ptr,
		                             .has_lora_id = ck.has_lora_id, .lora_id = ck.lora_id};
		mid = ++c->p->next_mgr_id;
		if ((rv = mgr_status(c, kvp_mgr_add_request(c->p->mgr, mid, &d), "add request")))
			return rv;
		if (kvpd_session_add_request(c->sess, m->request_id, mid) != KVP_OK) {
			(void)kvp_mgr_free_request(c->p->mgr, mid);
			return fail(c, KVP_ENOMEM, "out of memory");
		}
	} else if (m->n_prompt_token_ids > 0) {
		return fail(c, KVP_ESTATE, "request %llu exists: send new_token_ids, not a prompt",
		            (unsigned long long)m->request_id);
	}
	if (m->n_new_token_ids > 0 &&
	    (rv = mgr_status(c, kvp_mgr_append_tokens(c->p->mgr, mid, m->new_token_ids,
	                                              m->n_new_token_ids), "append tokens")))
		return rv;
	/* A request that holds no blocks (new, or preempted) takes its prefix hit. */
	const int32_t *held;
	size_t nheld = 0;
	uint32_t hit = 0;
	int32_t *hits = NULL;
	(void)kvp_mgr_request_blocks(c->p->mgr, mid, 0, &held, &nheld);
	if (m->use_prefix_cache && nheld == 0) {
		size_t ntok = 0;
		(void)kvp_mgr_request_info(c->p->mgr, mid, &ntok, NULL, NULL);
		size_t cap = ntok / c->p->cfg.block_size + 1;
		if ((hits = scratch(c, cap * sizeof(*hits))) == NULL)
			return fail(c, KVP_ENOMEM, "out of memory");
		int32_t *const hit_out[] = {hits};
		if ((rv = mgr_status(c, kvp_mgr_get_computed_blocks(c->p->mgr, mid, hit_out, cap, &hit),
		                     "lookup")))
			return rv;
	}
	size_t ntok = 0, ncomp = 0;
	(void)kvp_mgr_request_info(c->p->mgr, mid, &ntok, &ncomp, NULL);
	uint32_t num_new = m->num_new_tokens;
	if (num_new == 0) {
		size_t remaining = ntok > ncomp + hit ? ntok - ncomp - hit : 0;
		if (m->token_budget > 0 && remaining > m->token_budget)
			remaining = m->token_budget;
		num_new = (uint32_t)remaining;
	}
	size_t need = ncomp + hit + num_new + m->num_lookahead_tokens;
	size_t cap = need / c->p->cfg.block_size + 2;
	int32_t *fresh = scratch(c, cap * sizeof(*fresh));
	uint32_t *per_group = scratch(c, sizeof(*per_group));
	if (fresh == NULL || per_group == NULL)
		return fail(c, KVP_ENOMEM, "out of memory");
	int32_t *const fresh_out[] = {fresh};
	const int32_t *const hit_in[] = {hits};
	size_t count = 0;
	struct kvp_alloc_args a = {.num_new_tokens = num_new,
	                           .num_new_computed_tokens = hit,
	                           .computed_blocks = hit ? hit_in : NULL,
	                           .num_lookahead_tokens = m->num_lookahead_tokens,
	                           .delay_cache_blocks = m->delay_cache_blocks};
	rv = kvp_mgr_allocate_slots(c->p->mgr, mid, &a, fresh_out, cap, &count);
	if (rv == KVP_EINVAL && num_new == 0)
		return fail(c, rv, "allocate_slots: nothing to schedule (every token is computed)");
	if ((rv = mgr_status(c, rv, "allocate_slots")))
		return rv;
	(void)kvp_mgr_request_info(c->p->mgr, mid, NULL, &ncomp, NULL);
	r->hit_tokens = hit;
	r->num_scheduled_tokens = num_new;
	r->num_computed_tokens = (uint32_t)ncomp;
	r->new_block_ids = fresh;
	r->n_new_block_ids = count;
	per_group[0] = (uint32_t)count;
	r->new_blocks_per_group = per_group;
	r->n_new_blocks_per_group = 1;
	out->result_case = KVPOOL__V1__REPLY__RESULT_ALLOCATE_SLOTS;
	out->allocate_slots = r;
	return KVP_OK;
}

static int
h_free_request(struct call *c, const Kvpool__V1__FreeRequestRequest *m, Kvpool__V1__Reply *out)
{
	Kvpool__V1__FreeRequestReply *r =
		NEW(c, Kvpool__V1__FreeRequestReply, kvpool__v1__free_request_reply__descriptor);
	uint64_t mid = kvpd_session_request(c->sess, m->request_id);

	if (r == NULL)
		return fail(c, KVP_ENOMEM, "out of memory");
	if (mid == 0)
		return fail(c, KVP_ENOTFOUND, "no request %llu in this session",
		            (unsigned long long)m->request_id);
	if (m->preempt) {
		(void)kvp_mgr_preempt(c->p->mgr, mid);
	} else {
		(void)kvp_mgr_free_request(c->p->mgr, mid);
		kvpd_session_remove_request(c->sess, m->request_id);
	}
	out->result_case = KVPOOL__V1__REPLY__RESULT_FREE_REQUEST;
	out->free_request = r;
	return KVP_OK;
}

static int
h_get_computed_blocks(struct call *c, const Kvpool__V1__GetComputedBlocksRequest *m,
                      Kvpool__V1__Reply *out)
{
	Kvpool__V1__GetComputedBlocksReply *r =
		NEW(c, Kvpool__V1__GetComputedBlocksReply, kvpool__v1__get_computed_blocks_reply__descriptor);
	uint64_t mid = kvpd_session_request(c->sess, m->request_id);
	size_t ntok = 0;
	uint32_t hit = 0;
	int rv;

	if (r == NULL)
		return fail(c, KVP_ENOMEM, "out of memory");
	if (mid == 0)
		return fail(c, KVP_ENOTFOUND, "no request %llu in this session",
		            (unsigned long long)m->request_id);
	(void)kvp_mgr_request_info(c->p->mgr, mid, &ntok, NULL, NULL);
	size_t cap = ntok / c->p->cfg.block_size + 1;
	int32_t *hits = scratch(c, cap * sizeof(*hits));
	if (hits == NULL)
		return fail(c, KVP_ENOMEM, "out of memory");
	int32_t *const hit_out[] = {hits};
	if ((rv = mgr_status(c, kvp_mgr_get_computed_blocks(c->p->mgr, mid, hit_out, cap, &hit),
	                     "get_computed_blocks")))
		return rv;
	r->hit_tokens = hit;
	r->block_ids = hits;
	r->n_block_ids = hit / c->p->cfg.block_size;
	out->result_case = KVPOOL__V1__REPLY__RESULT_GET_COMPUTED_BLOCKS;
	out->get_computed_blocks = r;
	return KVP_OK;
}

/* ---- the event stream's repair ---- */

static int
h_replay(struct call *c, const Kvpool__V1__ReplayRequest *m, Kvpool__V1__Reply *out)
{
	Kvpool__V1__ReplayReply *r = NEW(c, Kvpool__V1__ReplayReply, kvpool__v1__replay_reply__descriptor);
	struct kvpd_stream *st = &c->p->stream;

	if (r == NULL)
		return fail(c, KVP_ENOMEM, "out of memory");
	r->epoch = st->epoch;
	r->next_seq = st->next_seq;
	r->oldest_seq = kvpd_stream_oldest(st);
	r->available = m->epoch == st->epoch && m->from_seq <= st->next_seq;
	for (uint64_t q = m->from_seq; r->available && q < st->next_seq; q++)
		if (kvpd_stream_get(st, q) == NULL)
			r->available = 0; /* the ring no longer holds it: take a Snapshot */
	if (r->available) {
		/* As many as fit in half a message, so the reply always goes out. */
		size_t max = m->max_batches ? m->max_batches : SIZE_MAX, bytes = 0;
		size_t n = (size_t)(st->next_seq - m->from_seq);
		if (n > max)
			n = max;
		ProtobufCBinaryData *b = scratch(c, (n ? n : 1) * sizeof(*b));
		if (b == NULL)
			return fail(c, KVP_ENOMEM, "out of memory");
		size_t k = 0;
		for (; k < n; k++) {
			const struct kvpd_ring_slot *slot = kvpd_stream_get(st, m->from_seq + k);
			if (k > 0 && bytes + slot->len > c->p->limits.max_reply_bytes / 2)
				break;
			b[k].data = slot->bytes;
			b[k].len = slot->len;
			bytes += slot->len;
		}
		r->batches = b;
		r->n_batches = k;
		c->p->counters.replays_served++;
	} else {
		c->p->counters.replays_refused++;
	}
	out->result_case = KVPOOL__V1__REPLY__RESULT_REPLAY;
	out->replay = r;
	return KVP_OK;
}

static int
key_cmp(const void *x, const void *y)
{
	const struct kvpd_key {
		const uint8_t *k;
		size_t len;
	} *a = x, *b = y;
	if (a->len != b->len)
		return a->len < b->len ? -1 : 1;
	return memcmp(a->k, b->k, a->len);
}

static int
h_snapshot(struct call *c, Kvpool__V1__Reply *out)
{
	Kvpool__V1__SnapshotReply *r =
		NEW(c, Kvpool__V1__SnapshotReply, kvpool__v1__snapshot_reply__descriptor);
	struct kvp_pool *pool = c->p->pool;
	struct kvpd_key {
		const uint8_t *k;
		size_t len;
	} *keys;
	uint32_t nb = kvp_pool_num_blocks(pool), nk = 0;

	if (r == NULL || (keys = scratch(c, (size_t)nb * sizeof(*keys))) == NULL)
		return fail(c, KVP_ENOMEM, "out of memory");
	for (uint32_t id = 1; id < nb; id++)
		if ((keys[nk].k = kvp_pool_block_key(pool, (int32_t)id, &keys[nk].len)) != NULL)
			nk++;
	/* One entry per distinct (hash, group), with how many blocks hold it. */
	qsort(keys, nk, sizeof(*keys), key_cmp);
	Kvpool__V1__SnapshotEntry *e = scratch(c, (nk ? nk : 1) * sizeof(*e));
	Kvpool__V1__SnapshotEntry **ep = scratch(c, (nk ? nk : 1) * sizeof(*ep));
	if (e == NULL || ep == NULL)
		return fail(c, KVP_ENOMEM, "out of memory");
	size_t ne = 0;
	for (uint32_t i = 0; i < nk; i++) {
		if (ne > 0 && key_cmp(&keys[i], &keys[i - 1]) == 0) {
			e[ne - 1].num_blocks++;
			continue;
		}
		const uint8_t *k = keys[i].k;
		size_t hl = keys[i].len - 4;
		kvpool__v1__snapshot_entry__init(&e[ne]);
		e[ne].hash.data = (uint8_t *)k;
		e[ne].hash.len = hl;
		e[ne].group_idx = (uint32_t)k[hl] << 24 | (uint32_t)k[hl + 1] << 16 |
		                  (uint32_t)k[hl + 2] << 8 | k[hl + 3];
		e[ne].num_blocks = 1;
		ep[ne] = &e[ne];
		ne++;
	}
	r->epoch = c->p->stream.epoch;
	r->next_seq = c->p->stream.next_seq;
	r->entries = ep;
	r->n_entries = ne;
	c->p->counters.snapshots++;
	out->result_case = KVPOOL__V1__REPLY__RESULT_SNAPSHOT;
	out->snapshot = r;
	return KVP_OK;
}

/* ---- sessions ---- */

static struct kvpd_session *
find_session(struct kvpd_pool *p, uint64_t id, size_t *index)
{
	for (size_t i = 0; i < p->num_sessions; i++)
		if (p->sessions[i]->id == id) {
			if (index)
				*index = i;
			return p->sessions[i];
		}
	return NULL;
}

static bool
token_ok(const char *want, const char *got)
{
	/* Compares every byte whatever the first difference: no timing hint. */
	size_t lw = strlen(want), lg = strlen(got);
	unsigned diff = (unsigned)(lw ^ lg);
	for (size_t i = 0; i < lw; i++)
		diff |= (unsigned char)want[i] ^ (unsigned char)(i < lg ? got[i] : 0);
	return diff == 0;
}

static uint64_t
new_session_id(struct kvpd_pool *p)
{
	uint64_t id;
	do {
		id = (uint64_t)nng_random() << 32 | nng_random();
	} while (id == 0 || find_session(p, id, NULL) != NULL);
	return id;
}

static int
h_hello(struct call *c, const Kvpool__V1__HelloRequest *m, uint64_t now_ms,
        Kvpool__V1__Reply *out)
{
	struct kvpd_pool *p = c->p;
	Kvpool__V1__HelloReply *r = NEW(c, Kvpool__V1__HelloReply, kvpool__v1__hello_reply__descriptor);
	Kvpool__V1__PoolInfo *info = NEW(c, Kvpool__V1__PoolInfo, kvpool__v1__pool_info__descriptor);
	Kvpool__V1__GroupInfo *g = NEW(c, Kvpool__V1__GroupInfo, kvpool__v1__group_info__descriptor);
	Kvpool__V1__GroupInfo **gl = scratch(c, sizeof(*gl));

	if (r == NULL || info == NULL || g == NULL || gl == NULL)
		return fail(c, KVP_ENOMEM, "out of memory");
	if (m->protocol_version != KVP_PROTOCOL_VERSION)
		return fail(c, KVP_EVERSION, "protocol version %u; this daemon speaks %u",
		            m->protocol_version, KVP_PROTOCOL_VERSION);
	if (!token_ok(p->cfg.token, m->auth_token ? m->auth_token : ""))
		return fail(c, KVP_EUNAUTH, "wrong auth token for pool %s", p->cfg.name);
	if (p->num_sessions >= p->limits.max_sessions)
		return fail(c, KVP_EBUSY, "pool %s has %zu sessions, the limit", p->cfg.name,
		            p->num_sessions);
	if (p->num_sessions == p->cap_sessions) {
		size_t cap = p->cap_sessions ? p->cap_sessions * 2 : 8;
		struct kvpd_session **ns = realloc(p->sessions, cap * sizeof(*ns));
		if (ns == NULL)
			return fail(c, KVP_ENOMEM, "out of memory");
		p->sessions = ns;
		p->cap_sessions = cap;
	}
	uint32_t lease = m->lease_ms ? m->lease_ms : p->limits.lease_ms;
	if (lease < 100)
		lease = 100;
	if (lease > 86400000u)
		lease = 86400000u;
	struct kvpd_session *s = kvpd_session_create(new_session_id(p), lease, m->client_name, now_ms);
	if (s == NULL)
		return fail(c, KVP_ENOMEM, "out of memory");
	p->sessions[p->num_sessions++] = s;
	p->counters.sessions_opened++;

	info->name = p->cfg.name;
	info->num_blocks = kvp_pool_num_blocks(p->pool);
	info->hash_block_size = kvp_pool_hash_block_size(p->pool);
	info->hash_algorithm = "sha256_cbor";
	info->none_hash_fingerprint.data = p->none_fp;
	info->none_hash_fingerprint.len = sizeof(p->none_fp);
	g->group_id = 0;
	g->block_size = p->cfg.block_size;
	g->kind = "full_attention";
	gl[0] = g;
	info->groups = gl;
	info->n_groups = 1;
	info->medium = p->cfg.medium;
	info->event_epoch = p->stream.epoch;
	info->event_seq = p->stream.next_seq;
	info->max_model_len = p->cfg.max_model_len;
	info->max_ids_per_call = p->limits.max_ids;
	info->max_hash_len = kvp_pool_max_hash_len(p->pool);
	r->session_id = s->id;
	r->lease_ms = lease;
	r->pool = info;
	out->result_case = KVPOOL__V1__REPLY__RESULT_HELLO;
	out->hello = r;
	return KVP_OK;
}

size_t
kvpd_pool_release_session(struct kvpd_pool *p, struct kvpd_session *s)
{
	size_t n = 0;
	int32_t *ids;

	/* The session's requests first, newest first: each frees its blocks tail first. */
	while (s->num_reqs > 0) {
		struct kvpd_request_ref *r = &s->reqs[s->num_reqs - 1];
		(void)kvp_mgr_free_request(p->mgr, r->mgr_id);
		s->num_reqs--;
	}
	ids = kvpd_session_all_newest_first(s, &n);

	/* One block at a time, newest first, as the scheduler would have freed them. */
	for (size_t i = 0; i < n; i++) {
		int rv = kvp_pool_free_blocks(p->pool, &ids[i], 1);
		if (rv == KVP_OK)
			kvpd_session_remove(s, ids[i]);
	}
	free(ids);
	return n;
}

static void
drop_session(struct kvpd_pool *p, size_t index)
{
	struct kvpd_session *s = p->sessions[index];
	kvpd_pool_release_session(p, s);
	kvpd_session_destroy(s);
	p->sessions[index] = p->sessions[--p->num_sessions];
}

size_t
kvpd_pool_expire(struct kvpd_pool *p, uint64_t now_ms)
{
	size_t n = 0;
	for (size_t i = 0; i < p->num_sessions;) {
		struct kvpd_session *s = p->sessions[i];
		if (now_ms - s->last_seen_ms > s->lease_ms && now_ms > s->last_seen_ms) {
			drop_session(p, i);
			p->counters.leases_expired++;
			n++;
		} else {
			i++;
		}
	}
	if (n > 0)
		kvpd_pool_publish(p);
	return n;
}

/* ---- dispatch ---- */

static bool
mutating(Kvpool__V1__Request__CallCase cc)
{
	switch (cc) {
	case KVPOOL__V1__REQUEST__CALL_ALLOCATE:
	case KVPOOL__V1__REQUEST__CALL_TOUCH:
	case KVPOOL__V1__REQUEST__CALL_FREE:
	case KVPOOL__V1__REQUEST__CALL_CACHE:
	case KVPOOL__V1__REQUEST__CALL_EVICT:
	case KVPOOL__V1__REQUEST__CALL_RESET:
	case KVPOOL__V1__REQUEST__CALL_BATCH:
	case KVPOOL__V1__REQUEST__CALL_ALLOCATE_SLOTS:
	case KVPOOL__V1__REQUEST__CALL_FREE_REQUEST:
		return true;
	default:
		return false;
	}
}

static int run_batch(struct call *c, const Kvpool__V1__BatchRequest *m, Kvpool__V1__Reply *out);

/* Runs one call (a top-level call or one inside a batch). */
static int
run_one(struct call *c, int cc, void *msg, Kvpool__V1__Reply *out)
{
	switch (cc) {
	case KVPOOL__V1__REQUEST__CALL_ALLOCATE:
		return h_allocate(c, msg, out);
	case KVPOOL__V1__REQUEST__CALL_TOUCH:
		return h_touch(c, msg, out);
	case KVPOOL__V1__REQUEST__CALL_FREE:
		return h_free(c, msg, out);
	case KVPOOL__V1__REQUEST__CALL_CACHE:
		return h_cache(c, msg, out);
	case KVPOOL__V1__REQUEST__CALL_LOOKUP:
		return h_lookup(c, msg, out);
	case KVPOOL__V1__REQUEST__CALL_EVICT:
		return h_evict(c, msg, out);
	case KVPOOL__V1__REQUEST__CALL_RESET:
		return h_reset(c, out);
	case KVPOOL__V1__REQUEST__CALL_STATS:
		return h_stats(c, out);
	case KVPOOL__V1__REQUEST__CALL_BATCH:
		return run_batch(c, msg, out);
	case KVPOOL__V1__REQUEST__CALL_REPLAY:
		return h_replay(c, msg, out);
	case KVPOOL__V1__REQUEST__CALL_SNAPSHOT:
		return h_snapshot(c, out);
	case KVPOOL__V1__REQUEST__CALL_ALLOCATE_SLOTS:
		return h_allocate_slots(c, msg, out);
	case KVPOOL__V1__REQUEST__CALL_FREE_REQUEST:
		return h_free_request(c, msg, out);
	case KVPOOL__V1__REQUEST__CALL_GET_COMPUTED_BLOCKS:
		return h_get_computed_blocks(c, msg, out);
	default:
		return fail(c, KVP_EINVAL, "no call in the request, or one this daemon does not know");
	}
}

static int
run_batch(struct call *c, const Kvpool__V1__BatchRequest *m, Kvpool__V1__Reply *out)
{
	Kvpool__V1__BatchReply *r = NEW(c, Kvpool__V1__BatchReply, kvpool__v1__batch_reply__descriptor);
	Kvpool__V1__Reply **replies = scratch(c, m->n_calls * sizeof(*replies));

	if (r == NULL || replies == NULL)
		return fail(c, KVP_ENOMEM, "out of memory");
	if (m->n_calls > c->p->limits.max_ids)
		return fail(c, KVP_EINVAL, "%zu calls in one batch", m->n_calls);
	out->result_case = KVPOOL__V1__REPLY__RESULT_BATCH;
	out->batch = r;
	r->replies = replies;
	for (size_t i = 0; i < m->n_calls; i++) {
		const Kvpool__V1__BatchCall *bc = m->calls[i];
		Kvpool__V1__Reply *sub = NEW(c, Kvpool__V1__Reply, kvpool__v1__reply__descriptor);
		if (sub == NULL)
			return fail(c, KVP_ENOMEM, "out of memory");
		replies[r->n_replies++] = sub;
		/* BatchCall's oneof numbers are the Request's, so one switch serves both. */
		int cc = (int)bc->call_case;
		int rv = cc == KVPOOL__V1__REQUEST__CALL_BATCH ? fail(c, KVP_EINVAL, "nested batch")
		                                                : run_one(c, cc, bc->allocate, sub);
		sub->status = (Kvpool__V1__Status)rv;
		if (rv != KVP_OK) {
			/* The failing call's reply carries its own detail; the batch's says which. */
			char *d = scratch(c, sizeof(c->detail));
			if (d != NULL) {
				memcpy(d, c->detail, sizeof(c->detail));
				sub->detail = d;
				snprintf(c->detail, sizeof(c->detail), "batch stopped at call %zu", i);
			}
			return rv; /* the batch stops at its first failure */
		}
	}
	return KVP_OK;
}

int
kvpd_pack_reply(const Kvpool__V1__Reply *r, uint8_t **out, size_t *len)
{
	size_t n = kvpool__v1__reply__get_packed_size(r);
	uint8_t *buf = malloc(n ? n : 1);
	if (buf == NULL)
		return KVP_ENOMEM;
	*len = kvpool__v1__reply__pack(r, buf);
	*out = buf;
	return KVP_OK;
}

int
kvpd_dispatch(struct kvpd_pool *p, const Kvpool__V1__Request *rq, uint64_t now_ms,
              uint8_t **reply, size_t *reply_len)
{
	struct call c = {.p = p};
	Kvpool__V1__Reply out = KVPOOL__V1__REPLY__INIT;
	size_t index = 0;
	int rv;

	p->counters.calls++;
	if (rq->call_case == KVPOOL__V1__REQUEST__CALL_HELLO) {
		rv = h_hello(&c, rq->hello, now_ms, &out);
	} else if ((c.sess = find_session(p, rq->session_id, &index)) == NULL) {
		rv = fail(&c, KVP_EUNAUTH, "no session %llu on pool %s (Hello first; leases expire)",
		          (unsigned long long)rq->session_id, p->cfg.name);
	} else {
		c.sess->last_seen_ms = now_ms;
		const struct kvpd_cached_reply *cached =
			mutating(rq->call_case) ? kvpd_session_cached(c.sess, rq->call_id) : NULL;
		if (cached != NULL) {
			/* A retry: answer what the first attempt answered, apply nothing. */
			if ((*reply = malloc(cached->len ? cached->len : 1)) == NULL)
				return KVP_ENOMEM;
			memcpy(*reply, cached->bytes, cached->len);
			*reply_len = cached->len;
			return KVP_OK;
		}
		switch (rq->call_case) {
		case KVPOOL__V1__REQUEST__CALL_HEARTBEAT: {
			Kvpool__V1__HeartbeatReply *r =
				NEW(&c, Kvpool__V1__HeartbeatReply, kvpool__v1__heartbeat_reply__descriptor);
			if (r == NULL) {
				rv = fail(&c, KVP_ENOMEM, "out of memory");
				break;
			}
			r->lease_ms = c.sess->lease_ms;
			out.result_case = KVPOOL__V1__REPLY__RESULT_HEARTBEAT;
			out.heartbeat = r;
			rv = KVP_OK;
			break;
		}
		case KVPOOL__V1__REQUEST__CALL_GOODBYE: {
			Kvpool__V1__GoodbyeReply *r =
				NEW(&c, Kvpool__V1__GoodbyeReply, kvpool__v1__goodbye_reply__descriptor);
			if (r == NULL) {
				rv = fail(&c, KVP_ENOMEM, "out of memory");
				break;
			}
			r->references_released = (uint32_t)c.sess->held;
			drop_session(p, index);
			c.sess = NULL;
			p->counters.goodbyes++;
			out.result_case = KVPOOL__V1__REPLY__RESULT_GOODBYE;
			out.goodbye = r;
			rv = KVP_OK;
			break;
		}
		default:
			rv = run_one(&c, (int)rq->call_case, rq->allocate, &out);
		}
	}
	if (c.oom && rv == KVP_OK)
		rv = fail(&c, KVP_ENOMEM, "out of memory");
	if ((int)rq->call_case > 0 && (int)rq->call_case < KVPD_NUM_CALLS && rv >= 0 &&
	    rv < KVPD_NUM_STATUS)
		p->counters.by_call[rq->call_case][rv]++;
	if (rv != KVP_OK) {
		p->counters.call_errors++;
		/* An error reply carries no result, except a batch's partial list. */
		if (out.result_case != KVPOOL__V1__REPLY__RESULT_BATCH)
			out.result_case = KVPOOL__V1__REPLY__RESULT__NOT_SET;
	}
	out.call_id = rq->call_id;
	out.status = (Kvpool__V1__Status)rv;
	out.detail = rv == KVP_OK ? "" : c.detail;
	rv = kvpd_pack_reply(&out, reply, reply_len);
	if (rv == KVP_OK && c.sess != NULL && mutating(rq->call_case))
		kvpd_session_remember(c.sess, rq->call_id, *reply, *reply_len);
	scratch_reset(p);
	kvpd_pool_publish(p); /* one batch per call that produced events */
	return rv;
}

void
kvpd_pool_publish(struct kvpd_pool *p)
{
	struct timespec ts;

	/* The manager's take also names each BlockStored's spec kind. */
	if (kvp_mgr_take_events(p->mgr, &p->events) != KVP_OK ||
	    kvp_event_batch_count(&p->events) == 0)
		return;
	p->counters.events_emitted += kvp_event_batch_count(&p->events);
	clock_gettime(CLOCK_REALTIME, &ts);
	(void)kvpd_stream_emit(&p->stream, p->cfg.name, &p->events,
	                       (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec);
}

void
kvpd_pool_gauges(struct kvpd_pool *p, struct kvpd_pool_gauges *out)
{
	struct kvp_pool_stats ps;
	struct kvp_mgr_stats ms;

	memset(out, 0, sizeof(*out));
	kvp_pool_get_stats(p->pool, &ps);
	kvp_mgr_get_stats(p->mgr, &ms);
	out->num_blocks = kvp_pool_num_blocks(p->pool);
	out->num_free = kvp_pool_num_free(p->pool);
	out->num_cached_blocks = kvp_pool_num_cached_blocks(p->pool);
	out->num_cached_keys = kvp_pool_num_cached_keys(p->pool);
	out->usage = kvp_pool_usage(p->pool);
	out->blocks_allocated = ps.blocks_allocated;
	out->blocks_evicted = ps.blocks_evicted;
	out->alloc_failures = ps.alloc_failures + ms.alloc_failures;
	out->blocks_stored = ps.blocks_stored;
	out->resets = ps.resets;
	out->prefix_requests = ms.requests;
	out->prefix_queries = ms.queries;
	out->prefix_hits = ms.hits;
	out->active_requests = ms.active_requests;
}

int
kvpd_pool_check(struct kvpd_pool *p, char *detail, size_t len)
{
	int rv = kvp_pool_check(p->pool, detail, len);
	if (rv != KVP_OK)
		return rv;
	/* No block may be held by sessions more often than its ref count. */
	uint32_t nb = kvp_pool_num_blocks(p->pool);
	for (uint32_t id = 1; id < nb; id++) {
		uint64_t held = 0;
		for (size_t i = 0; i < p->num_sessions; i++)
			held += kvpd_session_held(p->sessions[i], (int32_t)id);
		if (held > (uint64_t)kvp_pool_ref_cnt(p->pool, (int32_t)id)) {
			snprintf(detail, len, "block %u: sessions hold %llu references, ref_cnt %d", id,
			         (unsigned long long)held, kvp_pool_ref_cnt(p->pool, (int32_t)id));
			return KVP_EINTERNAL;
		}
	}
	return KVP_OK;
}
