/* SPDX-License-Identifier: Apache-2.0 */
#include "engine/manager.h"

#include <stdlib.h>
#include <string.h>

#include "common/kvp_status.h"
#include "common/map_key.h"

struct group_blocks {
	int32_t *ids;
	size_t n, cap;
	uint32_t num_cached;   /* vLLM's num_cached_block[req] */
};

struct request {
	uint64_t id;
	int64_t *tokens;
	size_t num_tokens, tok_cap;
	uint8_t *hashes;       /* fine hashes, KVP_HASH_LEN each */
	size_t num_hashes, hash_cap;
	size_t num_computed;
	uint32_t num_preemptions;
	bool started;          /* vLLM: request_id in num_cached_block */
	bool skip_reading;
	bool has_lora_id;
	int64_t lora_id;
	/* Owned copies of the extra-key sources; keys points into them. */
	struct kvp_request_keys keys;
	bool has_keys;
	char *strings;         /* lora name, salt and mm identifiers, back to back */
	struct kvp_mm_feature *mm;
	struct group_blocks groups[KVP_MGR_MAX_GROUPS];
};

struct kvp_mgr {
	struct kvp_pool *pool;
	struct kvp_hasher *hasher;
	uint32_t num_groups;
	uint32_t block_size[KVP_MGR_MAX_GROUPS];
	uint32_t lcm;
	uint32_t hash_bs;
	uint32_t max_model_len;
	uint32_t max_requests;
	/* Requests: open addressing on the id, backward-shift deletion. */
	struct request **slots;
	uint32_t mask;
	uint32_t count;
	struct kvp_mgr_stats stats;
};

/* ---- the request table ---- */

static uint32_t
id_hash(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	return (uint32_t)x;
}

static struct request *
find(const struct kvp_mgr *m, uint64_t id)
{
	for (uint32_t i = id_hash(id) & m->mask;; i = (i + 1) & m->mask) {
		struct request *r = m->slots[i];
		if (r == NULL || r->id == id)
			return r;
	}
}

static void
table_insert(struct kvp_mgr *m, struct request *r)
{
	uint32_t i = id_hash(r->id) & m->mask;
	while (m->slots[i] != NULL)
		i = (i + 1) & m->mask;
	m->slots[i] = r;
	m->count++;
}

static void
table_remove(struct kvp_mgr *m, uint64_t id)
{
	uint32_t i = id_hash(id) & m->mask, j;

	while (m->slots[i]->id != id)
		i = (i + 1) & m->mask;
	for (j = i;;) {
		j = (j + 1) & m->mask;
		if (m->slots[j] == NULL)
			break;
		uint32_t home = id_hash(m->slots[j]->id) & m->mask;
		int stays = (i <= j) ? (home > i && home <= j) : (home > i || home <= j);
		if (!stays) {
			m->slots[i] = m->slots[j];
			i = j;
		}
	}
	m->slots[i] = NULL;
	m->count--;
}

static void
request_destroy(struct request *r)
{
	if (r == NULL)
		return;
	for (int g = 0; g < KVP_MGR_MAX_GROUPS; g++)
		free(r->groups[g].ids);
	free(r->tokens);
	free(r->hashes);
	free(r->strings);
	free(r->mm);
	free(r);
}

/* ---- helpers ---- */

static uint32_t
gcd(uint32_t a, uint32_t b)
{
	while (b) {
		uint32_t t = a % b;
		a = b;
		b = t;
	}
	return a;
}

static int
grow(void **p, size_t *cap, size_t need, size_t elem)
{
	size_t c = *cap ? *cap : 16;
	void *np;

	if (need <= *cap)
		return KVP_OK;
	while (c < need)
		c *= 2;
	if ((np = realloc(*p, c * elem)) == NULL)
		return KVP_ENOMEM;
	*p = np;
	*cap = c;
	return KVP_OK;
}

static size_t
cdiv(size_t a, size_t b)
{
	return (a + b - 1) / b;
}

/* The coarse hash of group block i: k fine hashes, contiguous already. */
static const uint8_t *
coarse(const struct request *r, uint32_t k, size_t i)
{
	return r->hashes + i * k * KVP_HASH_LEN;
}

/* ---- lifecycle ---- */

int
kvp_mgr_create(struct kvp_pool *pool, struct kvp_hasher *hasher,
               const struct kvp_mgr_config *cfg, struct kvp_mgr **out)
{
	struct kvp_mgr *m;
	uint64_t nslots = 16, lcm = 1;

	if (pool == NULL || hasher == NULL || cfg == NULL || out == NULL ||
	    cfg->num_groups == 0 || cfg->num_groups > KVP_MGR_MAX_GROUPS ||
	    cfg->block_sizes == NULL || cfg->max_model_len == 0)
		return KVP_EINVAL;
	uint32_t hbs = kvp_pool_hash_block_size(pool);
	for (uint32_t g = 0; g < cfg->num_groups; g++) {
		uint32_t bs = cfg->block_sizes[g];
		if (bs == 0 || bs % hbs != 0 ||
		    (uint64_t)(bs / hbs) * KVP_HASH_LEN > kvp_pool_max_hash_len(pool))
			return KVP_EINVAL;
		lcm = lcm / gcd((uint32_t)lcm, bs) * bs;
		if (lcm > UINT32_MAX)
			return KVP_EINVAL;
	}
	uint32_t maxr = cfg->max_requests ? cfg->max_requests : 65536;
	if (maxr > (1u << 30))
		return KVP_EINVAL;
	while (nslots < 2ull * maxr)
		nslots <<= 1;
	if ((m = calloc(1, sizeof(*m))) == NULL)
		return KVP_ENOMEM;
	if ((m->slots = calloc(nslots, sizeof(*m->slots))) == NULL) {
		free(m);
		return KVP_ENOMEM;
	}
	m->mask = (uint32_t)(nslots - 1);
	m->pool = pool;
	m->hasher = hasher;
	m->num_groups = cfg->num_groups;
	memcpy(m->block_size, cfg->block_sizes, cfg->num_groups * sizeof(uint32_t));
	m->lcm = (uint32_t)lcm;
	m->hash_bs = hbs;
	m->max_model_len = cfg->max_model_len;
	m->max_requests = maxr;
	*out = m;
	return KVP_OK;
}

static void release_blocks(struct kvp_mgr *m, struct request *r);

void
kvp_mgr_destroy(struct kvp_mgr *m)
{
	if (m == NULL)
		return;
	for (uint32_t i = 0; i <= m->mask; i++) {
		if (m->slots[i] != NULL) {
			release_blocks(m, m->slots[i]);
			request_destroy(m->slots[i]);
		}
	}
	free(m->slots);
	free(m);
}

/* ---- requests ---- */

static int
copy_keys(struct request *r, const struct kvp_request_keys *k)
{
	size_t total = 0;
	char *s;

	if (k == NULL)
		return KVP_OK;
	total += k->lora_name ? strlen(k->lora_name) + 1 : 0;
	total += k->cache_salt ? strlen(k->cache_salt) + 1 : 0;
	for (size_t i = 0; i < k->num_mm; i++)
		total += strlen(k->mm[i].identifier) + 1;
	if ((r->strings = s = malloc(total ? total : 1)) == NULL)
		return KVP_ENOMEM;
	if (k->num_mm && (r->mm = malloc(k->num_mm * sizeof(*r->mm))) == NULL)
		return KVP_ENOMEM;
#define DUP(dst, src)                                  \
	do {                                           \
		size_t l_ = strlen(src) + 1;           \
		memcpy(s, (src), l_);                  \
		(dst) = s;                             \
		s += l_;                               \
	} while (0)
	if (k->lora_name)
		DUP(r->keys.lora_name, k->lora_name);
	if (k->cache_salt)
		DUP(r->keys.cache_salt, k->cache_salt);
	for (size_t i = 0; i < k->num_mm; i++) {
		r->mm[i] = k->mm[i];
		DUP(r->mm[i].identifier, k->mm[i].identifier);
	}
#undef DUP
	r->keys.mm = r->mm;
	r->keys.num_mm = k->num_mm;
	r->has_keys = true;
	return KVP_OK;
}

static const struct kvp_request_keys *
keys_of(const struct request *r)
{
	return r->has_keys ? &r->keys : NULL;
}

/* Hashes the request's newly completed fine blocks. */
static int
extend_hashes(struct kvp_mgr *m, struct request *r)
{
	size_t full = r->num_tokens / m->hash_bs, n = 0;
	int rv;

	if (full <= r->num_hashes)
		return KVP_OK;
	rv = grow((void **)&r->hashes, &r->hash_cap, full, KVP_HASH_LEN);
	if (rv != KVP_OK)
		return rv;
	rv = kvp_hash_request(m->hasher, keys_of(r), r->tokens, r->num_tokens, m->hash_bs,
	                      r->hashes, r->num_hashes,
	                      r->hashes + r->num_hashes * KVP_HASH_LEN, full - r->num_hashes, &n);
	if (rv == KVP_OK)
		r->num_hashes += n;
	return rv;
}

int
kvp_mgr_add_request(struct kvp_mgr *m, uint64_t req_id, const struct kvp_request_desc *d)
{
	struct request *r;
	int rv;

	if (m == NULL || d == NULL || d->num_prompt == 0 || d->prompt == NULL ||
	    d->num_prompt > m->max_model_len || kvp_request_keys_validate(d->keys) != KVP_OK)
		return KVP_EINVAL;
	if (find(m, req_id) != NULL)
		return KVP_ESTATE;
	if (m->count >= m->max_requests)
		return KVP_EBUSY;
	if ((r = calloc(1, sizeof(*r))) == NULL)
		return KVP_ENOMEM;
	r->id = req_id;
	r->skip_reading = d->skip_reading_prefix_cache;
	r->has_lora_id = d->has_lora_id;
	r->lora_id = d->lora_id;
	if ((rv = copy_keys(r, d->keys)) != KVP_OK ||
	    (rv = grow((void **)&r->tokens, &r->tok_cap, d->num_prompt, sizeof(int64_t))) != KVP_OK) {
		request_destroy(r);
		return rv;
	}
	memcpy(r->tokens, d->prompt, d->num_prompt * sizeof(int64_t));
	r->num_tokens = d->num_prompt;
	if ((rv = extend_hashes(m, r)) != KVP_OK) {
		request_destroy(r);
		return rv;
	}
	table_insert(m, r);
	m->stats.active_requests = m->count;
	return KVP_OK;
}

int
kvp_mgr_append_tokens(struct kvp_mgr *m, uint64_t req_id, const int64_t *tokens, size_t n)
{
	struct request *r;
	size_t old;
	int rv;

	if (m == NULL || (tokens == NULL && n > 0))
		return KVP_EINVAL;
	if ((r = find(m, req_id)) == NULL)
		return KVP_ENOTFOUND;
	if (n > m->max_model_len - r->num_tokens)
		return KVP_EINVAL;
	if ((rv = grow((void **)&r->tokens, &r->tok_cap, r->num_tokens + n, sizeof(int64_t))) != KVP_OK)
		return rv;
	old = r->num_tokens;
	memcpy(r->tokens + old, tokens, n * sizeof(int64_t));
	r->num_tokens += n;
	if ((rv = extend_hashes(m, r)) != KVP_OK)
		r->num_tokens = old; /* the appended tokens are not kept */
	return rv;
}

/*
 * find_longest_cache_hit over every group: per block size, scan left to
 * right while every group of that size hits; the result is the shortest
 * length, rounded down to the LCM of the block sizes. Writes nothing.
 */
static size_t
longest_hit(const struct kvp_mgr *m, const struct request *r, size_t max_len)
{
	size_t hit = max_len;
	uint32_t gids[KVP_MGR_MAX_GROUPS];
	int32_t ids[KVP_MGR_MAX_GROUPS];

	for (uint32_t g = 0; g < m->num_groups; g++) {
		uint32_t bs = m->block_size[g], k = bs / m->hash_bs, ng = 0;
		bool seen = false;
		for (uint32_t e = 0; e < g; e++)
			seen |= m->block_size[e] == bs;
		if (seen)
			continue; /* merged with an earlier group of the same size */
		for (uint32_t e = g; e < m->num_groups; e++)
			if (m->block_size[e] == bs)
				gids[ng++] = e;
		size_t max_blocks = hit / bs, ncoarse = r->num_hashes / k, n = 0;
		while (n < max_blocks && n < ncoarse &&
		       kvp_pool_get_cached_block(m->pool, coarse(r, k, n), (size_t)k * KVP_HASH_LEN,
		                                 gids, ng, ids) == KVP_OK)
			n++;
		while ((n * bs) % m->lcm != 0)
			n--;
		hit = n * bs;
	}
	return hit;
}

int
kvp_mgr_get_computed_blocks(struct kvp_mgr *m, uint64_t req_id, int32_t *const *out,
                            size_t cap, uint32_t *hit_tokens)
{
	struct request *r;
	size_t hit = 0;

	if (m == NULL || hit_tokens == NULL)
		return KVP_EINVAL;
	if ((r = find(m, req_id)) == NULL)
		return KVP_ENOTFOUND;
	if (kvp_pool_caching_enabled(m->pool) && !r->skip_reading)
		hit = longest_hit(m, r, r->num_tokens - 1);
	for (uint32_t g = 0; g < m->num_groups; g++)
		if (hit / m->block_size[g] > cap || (hit > 0 && (out == NULL || out[g] == NULL)))
			return KVP_EINVAL;
	for (uint32_t g = 0; g < m->num_groups && hit > 0; g++) {
		uint32_t bs = m->block_size[g], k = bs / m->hash_bs;
		for (size_t i = 0; i < hit / bs; i++)
			(void)kvp_pool_get_cached_block(m->pool, coarse(r, k, i),
			                                (size_t)k * KVP_HASH_LEN, &g, 1, &out[g][i]);
	}
	if (kvp_pool_caching_enabled(m->pool) && !r->skip_reading) {
		if (r->num_preemptions > 0) {
			m->stats.preempted_requests++;
			m->stats.preempted_queries += r->num_tokens;
			m->stats.preempted_hits += hit;
		} else {
			m->stats.requests++;
			m->stats.queries += r->num_tokens;
			m->stats.hits += hit;
		}
	}
	*hit_tokens = (uint32_t)hit;
	return KVP_OK;
}

int
kvp_mgr_allocate_slots(struct kvp_mgr *m, uint64_t req_id, const struct kvp_alloc_args *a,
                       int32_t *const *new_blocks, size_t cap, size_t *counts)
{
	struct request *r;
	size_t need, total_computed, num_hits[KVP_MGR_MAX_GROUPS] = {0};
	size_t num_new[KVP_MGR_MAX_GROUPS] = {0};
	uint64_t to_allocate = 0;
	int rv;

	if (m == NULL || a == NULL || counts == NULL || a->num_new_tokens == 0)
		return KVP_EINVAL;
	if ((r = find(m, req_id)) == NULL)
		return KVP_ENOTFOUND;
	total_computed = r->num_computed + a->num_new_computed_tokens;
	if (total_computed > m->max_model_len)
		total_computed = m->max_model_len;
	need = total_computed + a->num_new_tokens + (size_t)a->num_lookahead_tokens;
	if (need > m->max_model_len)
		need = m->max_model_len;

	/* Validate everything before touching anything. */
	if (a->num_new_computed_tokens > 0) {
		bool holds = r->started;
		for (uint32_t g = 0; g < m->num_groups; g++)
			holds |= r->groups[g].n > 0;
		if (holds || a->computed_blocks == NULL ||
		    r->num_computed + a->num_new_computed_tokens > r->num_tokens)
			return KVP_EINVAL;
	}
	for (uint32_t g = 0; g < m->num_groups; g++) {
		uint32_t bs = m->block_size[g], k = bs / m->hash_bs;
		size_t nh = a->num_new_computed_tokens / bs;
		if (a->num_new_computed_tokens % bs != 0 || nh > r->num_hashes / k)
			return KVP_EINVAL;
		if (nh > 0 && a->computed_blocks[g] == NULL)
			return KVP_EINVAL;
		for (size_t i = 0; i < nh; i++) {
			int32_t id = a->computed_blocks[g][i];
			size_t klen;
			const uint8_t *key;
			if (id < 0 || (uint32_t)id >= kvp_pool_num_blocks(m->pool))
				return KVP_ERANGE;
			key = kvp_pool_block_key(m->pool, id, &klen);
			if (key == NULL || klen != (size_t)k * KVP_HASH_LEN + KVP_MAP_KEY_GROUP_LEN ||
			    memcmp(key, coarse(r, k, i), klen - KVP_MAP_KEY_GROUP_LEN) != 0 ||
			    kvp_map_key_group(key, klen) != g)
				return KVP_ESTATE;
			if (kvp_pool_ref_cnt(m->pool, id) == 0)
				to_allocate++; /* evictable hits leave the free queue */
		}
		num_hits[g] = nh;
		size_t have = nh + r->groups[g].n, required = cdiv(need, bs);
		num_new[g] = required > have ? required - have : 0;
		if (num_new[g] > cap || (num_new[g] > 0 && (new_blocks == NULL || new_blocks[g] == NULL)))
			return KVP_EINVAL;
		to_allocate += num_new[g];
	}
	if (to_allocate > kvp_pool_num_free(m->pool)) {
		m->stats.alloc_failures++;
		return KVP_ENOSPACE;
	}
	for (uint32_t g = 0; g < m->num_groups; g++) {
		struct group_blocks *gb = &r->groups[g];
		rv = grow((void **)&gb->ids, &gb->cap, gb->n + num_hits[g] + num_new[g],
		          sizeof(int32_t));
		if (rv != KVP_OK)
			return rv;
	}

	/* allocate_new_computed_blocks: touch the hits and adopt them. */
	if (a->num_new_computed_tokens > 0) {
		for (uint32_t g = 0; g < m->num_groups; g++) {
			struct group_blocks *gb = &r->groups[g];
			if ((rv = kvp_pool_touch(m->pool, a->computed_blocks[g], num_hits[g])) != KVP_OK)
				return rv;
			memcpy(gb->ids, a->computed_blocks[g], num_hits[g] * sizeof(int32_t));
			gb->n = num_hits[g];
			gb->num_cached = (uint32_t)gb->n;
		}
		r->started = true;
	}
	/* allocate_new_blocks, in group order: consecutive chunks of the queue head. */
	for (uint32_t g = 0; g < m->num_groups; g++) {
		struct group_blocks *gb = &r->groups[g];
		counts[g] = num_new[g];
		if (num_new[g] == 0)
			continue;
		rv = kvp_pool_get_new_blocks(m->pool, (uint32_t)num_new[g], gb->ids + gb->n);
		if (rv != KVP_OK)
			return rv;
		memcpy(new_blocks[g], gb->ids + gb->n, num_new[g] * sizeof(int32_t));
		gb->n += num_new[g];
	}
	r->num_computed = total_computed + a->num_new_tokens;
	if (r->num_computed > m->max_model_len)
		r->num_computed = m->max_model_len;
	if (a->delay_cache_blocks || !kvp_pool_caching_enabled(m->pool))
		return KVP_OK;

	/* cache_blocks: every group up to the same LCM-aligned token count. */
	size_t to_cache = total_computed + a->num_new_tokens;
	if (to_cache > r->num_tokens)
		to_cache = r->num_tokens;
	if (m->num_groups > 1)
		to_cache -= to_cache % m->lcm;
	for (uint32_t g = 0; g < m->num_groups; g++) {
		struct group_blocks *gb = &r->groups[g];
		uint32_t bs = m->block_size[g];
		uint32_t full = (uint32_t)(to_cache / bs);
		if (gb->num_cached >= full)
			continue;
		struct kvp_cache_args ca = {
			.block_hashes = r->hashes, .num_block_hashes = r->num_hashes,
			.token_ids = r->tokens, .num_tokens = r->num_tokens,
			.keys = keys_of(r), .has_lora_id = r->has_lora_id, .lora_id = r->lora_id,
			.num_cached_blocks = gb->num_cached, .num_full_blocks = full,
			.block_size = bs, .group_id = g,
		};
		if ((rv = kvp_pool_cache_full_blocks(m->pool, gb->ids, gb->n, &ca)) != KVP_OK)
			return rv;
		gb->num_cached = full;
		r->started = true;
	}
	return KVP_OK;
}

/* Frees each group's blocks in reverse order (deepest evicted first). */
static void
release_blocks(struct kvp_mgr *m, struct request *r)
{
	for (uint32_t g = 0; g < m->num_groups; g++) {
		struct group_blocks *gb = &r->groups[g];
		for (size_t i = 0; i < gb->n / 2; i++) {
			int32_t t = gb->ids[i];
			gb->ids[i] = gb->ids[gb->n - 1 - i];
			gb->ids[gb->n - 1 - i] = t;
		}
		/* The manager took exactly these references: cannot fail. */
		(void)kvp_pool_free_blocks(m->pool, gb->ids, gb->n);
		gb->n = 0;
		gb->num_cached = 0;
	}
	r->started = false;
	r->num_computed = 0;
}

int
kvp_mgr_preempt(struct kvp_mgr *m, uint64_t req_id)
{
	struct request *r;

	if (m == NULL)
		return KVP_EINVAL;
	if ((r = find(m, req_id)) == NULL)
		return KVP_ENOTFOUND;
	release_blocks(m, r);
	r->num_preemptions++;
	return KVP_OK;
}

int
kvp_mgr_free_request(struct kvp_mgr *m, uint64_t req_id)
{
	struct request *r;

	if (m == NULL)
		return KVP_EINVAL;
	if ((r = find(m, req_id)) == NULL)
		return KVP_ENOTFOUND;
	release_blocks(m, r);
	table_remove(m, req_id);
	request_destroy(r);
	m->stats.active_requests = m->count;
	return KVP_OK;
}

int
kvp_mgr_request_blocks(const struct kvp_mgr *m, uint64_t req_id, uint32_t g,
                       const int32_t **ids, size_t *n)
{
	const struct request *r;

	if (m == NULL || ids == NULL || n == NULL || g >= m->num_groups)
		return KVP_EINVAL;
	if ((r = find(m, req_id)) == NULL)
		return KVP_ENOTFOUND;
	*ids = r->groups[g].ids;
	*n = r->groups[g].n;
	return KVP_OK;
}

int
kvp_mgr_request_info(const struct kvp_mgr *m, uint64_t req_id, size_t *num_tokens,
                     size_t *num_computed, size_t *num_hashes)
{
	const struct request *r;

	if (m == NULL)
		return KVP_EINVAL;
	if ((r = find(m, req_id)) == NULL)
		return KVP_ENOTFOUND;
	if (num_tokens)
		*num_tokens = r->num_tokens;
	if (num_computed)
		*num_computed = r->num_computed;
	if (num_hashes)
		*num_hashes = r->num_hashes;
	return KVP_OK;
}

int
kvp_mgr_take_events(struct kvp_mgr *m, struct kvp_event_batch *out)
{
	int rv;

	if (m == NULL || out == NULL)
		return KVP_EINVAL;
	if ((rv = kvp_pool_take_events(m->pool, out)) != KVP_OK)
		return rv;
	for (size_t i = 0; i < kvp_event_batch_count(out); i++) {
		struct kvp_event ev;
		(void)kvp_event_batch_get(out, i, &ev);
		if (ev.type == KVP_EVENT_BLOCK_STORED && ev.has_group_idx &&
		    ev.group_idx < m->num_groups)
			(void)kvp_event_batch_set_spec(out, i, "full_attention", false, 0);
	}
	return KVP_OK;
}

void
kvp_mgr_get_stats(const struct kvp_mgr *m, struct kvp_mgr_stats *out)
{
	*out = m->stats;
}

uint32_t
kvp_mgr_num_groups(const struct kvp_mgr *m)
{
	return m->num_groups;
}
