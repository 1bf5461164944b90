/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Each function follows the vLLM method it is named after (reference
 * section 5; vllm/v1/core/single_type_kv_cache_manager.py), including its
 * order of frees and allocations, which decides every later block id.
 */
#include "engine/group_mgr.h"

#include <stdlib.h>
#include <string.h>

#include "common/kvp_status.h"

static size_t
cdiv(size_t a, size_t b)
{
	return (a + b - 1) / b;
}

static bool
mamba_align(const struct kvp_group_spec *s)
{
	return s->kind == KVP_GROUP_MAMBA && s->mamba_mode == KVP_MAMBA_ALIGN;
}

void
kvp_grp_blocks_reset(struct kvp_grp_blocks *b)
{
	b->n = 0;
	b->num_cached = 0;
	b->started = false;
	b->allocated = false;
	b->last_state = -1;
}

/* Pops blocks until len·bs is a multiple of align. */
static size_t
align_down(size_t len, uint32_t bs, uint32_t align)
{
	if (bs != align)
		while (len > 0 && (len * bs) % align != 0)
			len--;
	return len;
}

static struct kvp_grp_hit
search_window(const struct kvp_group_spec *s, size_t max_blocks, uint32_t align,
              kvp_grp_probe probe, void *ctx)
{
	uint32_t bs = s->block_size;
	size_t need = cdiv(s->window - 1, bs), run = 0;
	struct kvp_grp_hit h = {0, 0};

	/* Right to left; the first run of `need` aligned hits wins. */
	for (size_t i = max_blocks; i-- > 0;) {
		if (!probe(ctx, i)) {
			run = 0;
			continue;
		}
		if (run == 0 && bs != align && ((i + 1) * bs) % align != 0)
			continue;
		if (++run >= need) {
			h.first = i;
			h.len = i + run;
			return h;
		}
	}
	/* No full run: the run that starts at block 0 still counts. */
	h.len = align_down(run, bs, align);
	return h;
}

struct kvp_grp_hit
kvp_grp_search(const struct kvp_group_spec *s, size_t max_len, uint32_t align,
               kvp_grp_probe probe, void *ctx)
{
	uint32_t bs = s->block_size;
	size_t max_blocks = max_len / bs;
	struct kvp_grp_hit h = {0, 0};

	switch (s->kind) {
	case KVP_GROUP_FULL:
		while (h.len < max_blocks && probe(ctx, h.len))
			h.len++;
		h.len = align_down(h.len, bs, align);
		return h;
	case KVP_GROUP_SLIDING_WINDOW:
		return search_window(s, max_blocks, align, probe, ctx);
	case KVP_GROUP_CHUNKED_LOCAL:
		/* Blocks before the current chunk count as computed (null). */
		h.first = max_len > 0 ? (max_len / s->window * s->window) / bs : 0;
		h.len = h.first;
		while (h.len < max_blocks && probe(ctx, h.len))
			h.len++;
		return h;
	case KVP_GROUP_MAMBA:
		/* Only the last state matters: the rightmost aligned hit. */
		for (size_t i = max_blocks; i-- > 0;) {
			if (!probe(ctx, i))
				continue;
			if (bs != align && ((i + 1) * bs) % align != 0)
				continue;
			h.first = i;
			h.len = i + 1;
			return h;
		}
		return h;
	default:
		return h;
	}
}

size_t
kvp_grp_skipped_tokens(const struct kvp_group_spec *s, size_t n)
{
	switch (s->kind) {
	case KVP_GROUP_SLIDING_WINDOW:
		return n + 1 > s->window ? n + 1 - s->window : 0;
	case KVP_GROUP_CHUNKED_LOCAL:
		return n / s->window * s->window;
	case KVP_GROUP_MAMBA:
		return n > 0 ? n - 1 : 0; /* only the last token's state is kept */
	default:
		return 0;
	}
}

static size_t
evictable(const struct kvp_pool *pool, const int32_t *ids, size_t n)
{
	size_t e = 0;

	for (size_t i = 0; i < n; i++)
		e += ids[i] != KVP_NULL_BLOCK && kvp_pool_ref_cnt(pool, ids[i]) == 0;
	return e;
}

/*
 * allocate_new_computed_blocks' table for a request holding no blocks:
 * nulls for the skipped blocks, the hits past them, then (if external
 * tokens remain in the window) new blocks up to cdiv(total, bs). Its length.
 */
static size_t
adopted_len(const struct kvp_group_spec *s, size_t nh, size_t total, size_t ext, size_t *ext_new)
{
	uint32_t bs = s->block_size;
	size_t skipped_tokens = kvp_grp_skipped_tokens(s, total), skipped = skipped_tokens / bs;
	size_t len = skipped > nh ? skipped : nh;

	*ext_new = 0;
	if (skipped > 0 && total - skipped_tokens < ext)
		ext = total - skipped_tokens; /* external tokens that left the window too */
	if (ext > 0 && cdiv(total, bs) > len)
		*ext_new = cdiv(total, bs) - len;
	return len + *ext_new;
}

void
kvp_grp_plan(const struct kvp_group_spec *s, const struct kvp_grp_blocks *b,
             const struct kvp_pool *pool, const int32_t *hits, size_t nh, size_t total,
             size_t ext, size_t need, size_t main, struct kvp_grp_plan *out)
{
	uint32_t bs = s->block_size;
	size_t ext_new = 0;
	/* The table's length once the hit (and external blocks) are in: only with no blocks held. */
	size_t len = (!b->started && (nh > 0 || ext > 0)) ? adopted_len(s, nh, total, ext, &ext_new)
	                                                  : b->n;

	memset(out, 0, sizeof(*out));
	if (mamba_align(s)) {
		/* One running state block per step (lookahead not allocated). */
		size_t required = cdiv(main, bs);
		out->to_allocate = (required > nh + b->n ? 1 : 0) + evictable(pool, hits, nh);
		out->num_returned = required > len ? required - len : 0;
		out->max_len = required > len ? required : len;
		return;
	}
	size_t required = cdiv(need, bs);
	out->num_returned = required > len ? required - len : 0;
	out->num_external = ext_new;
	out->max_len = required > len ? required : len;
	if (b->started) {
		out->to_allocate = required > b->n ? required - b->n : 0;
		return;
	}
	size_t skipped = kvp_grp_skipped_tokens(s, total) / bs;
	size_t have = nh + b->n;
	size_t floor = skipped > have ? skipped : have;
	size_t skip_hits = skipped > b->n ? skipped - b->n : 0;
	out->to_allocate = required > floor ? required - floor : 0;
	if (skip_hits < nh)
		out->to_allocate += evictable(pool, hits + skip_hits, nh - skip_hits);
	if (skipped > out->max_len)
		out->max_len = skipped;
}

int
kvp_grp_reserve(struct kvp_grp_blocks *b, size_t n)
{
	size_t c = b->cap ? b->cap : 16;
	int32_t *p;

	if (n <= b->cap)
		return KVP_OK;
	while (c < n)
		c *= 2;
	if ((p = realloc(b->ids, c * sizeof(*p))) == NULL)
		return KVP_ENOMEM;
	b->ids = p;
	b->cap = c;
	return KVP_OK;
}

/*
 * Nulls and frees blocks below last walking back, stopping at a null: one
 * free_blocks of the list in walk order, as vLLM's _remove_blocks_in_range
 * (under vLLM 0.33's free order one call and several calls differ). The run
 * is reversed in place to be that list, then nulled.
 */
static void
remove_below(struct kvp_grp_blocks *b, struct kvp_pool *pool, size_t last)
{
	size_t hi = last < b->n ? last : b->n, lo = hi;

	while (lo > 0 && b->ids[lo - 1] != KVP_NULL_BLOCK)
		lo--;
	if (lo == hi)
		return; /* nothing to free (and b->ids may be NULL) */
	for (size_t i = lo, j = hi; i + 1 < j; i++, j--) {
		int32_t t = b->ids[i];
		b->ids[i] = b->ids[j - 1];
		b->ids[j - 1] = t;
	}
	/* The request holds these references: cannot fail. */
	(void)kvp_pool_free_blocks(pool, &b->ids[lo], hi - lo);
	for (size_t i = lo; i < hi; i++)
		b->ids[i] = KVP_NULL_BLOCK;
}

void
kvp_grp_remove_skipped(const struct kvp_group_spec *s, struct kvp_grp_blocks *b,
                       struct kvp_pool *pool, size_t total_computed)
{
	size_t skipped = kvp_grp_skipped_tokens(s, total_computed);

	if (skipped > 0)
		remove_below(b, pool, skipped / s->block_size);
	if (!mamba_align(s) || b->last_state < 0)
		return;
	/* The state block two steps old is no longer needed. */
	size_t idx = (size_t)b->last_state;
	if (total_computed > 0 && idx + 1 < cdiv(total_computed, s->block_size) && idx < b->n &&
	    b->ids[idx] != KVP_NULL_BLOCK) {
		(void)kvp_pool_free_blocks(pool, &b->ids[idx], 1);
		b->ids[idx] = KVP_NULL_BLOCK;
	}
}

void
kvp_grp_adopt_hits(const struct kvp_group_spec *s, struct kvp_grp_blocks *b,
                   struct kvp_pool *pool, const int32_t *hits, size_t nh, size_t total,
                   size_t ext)
{
	size_t skipped, len, ext_new;

	if (b->started)
		return; /* a running request: no hit, no external blocks (as vLLM) */
	len = adopted_len(s, nh, total, ext, &ext_new) - ext_new;
	skipped = kvp_grp_skipped_tokens(s, total) / s->block_size;
	size_t kept = skipped < nh ? skipped : nh;
	for (size_t i = 0; i < len - (nh - kept); i++)
		b->ids[i] = KVP_NULL_BLOCK;
	if (nh > kept) { /* external tokens alone come with no hit (hits may be NULL) */
		/* Validated and counted by the caller: cannot fail. */
		(void)kvp_pool_touch(pool, hits + kept, nh - kept);
		memcpy(b->ids + len - (nh - kept), hits + kept, (nh - kept) * sizeof(*hits));
	}
	b->n = len;
	b->num_cached = (uint32_t)len;
	b->started = true;
}

int
kvp_grp_add_external(struct kvp_grp_blocks *b, struct kvp_pool *pool, size_t n, int32_t *out)
{
	int rv;

	if (n == 0)
		return KVP_OK;
	if ((rv = kvp_pool_get_new_blocks(pool, (uint32_t)n, b->ids + b->n)) != KVP_OK)
		return rv;
	memcpy(out, b->ids + b->n, n * sizeof(*out));
	b->n += n;
	return KVP_OK;
}

int
kvp_grp_allocate(const struct kvp_group_spec *s, struct kvp_grp_blocks *b,
                 struct kvp_pool *pool, size_t need, size_t main, int32_t *out, size_t *count)
{
	size_t prev = b->n, required;
	int rv;

	*count = 0;
	if (!mamba_align(s)) {
		required = cdiv(need, s->block_size);
		if (required <= prev)
			return KVP_OK;
		if ((rv = kvp_pool_get_new_blocks(pool, (uint32_t)(required - prev), b->ids + prev)))
			return rv;
	} else {
		required = cdiv(main, s->block_size);
		if (required <= prev)
			return KVP_OK;
		/* The running state of the previous step (or the hit's) is the last block. */
		if (b->allocated || prev > 0)
			b->last_state = (int64_t)prev - 1;
		for (size_t i = prev; i + 1 < required; i++)
			b->ids[i] = KVP_NULL_BLOCK;
		if ((rv = kvp_pool_get_new_blocks(pool, 1, b->ids + required - 1)))
			return rv;
		b->allocated = true;
	}
	b->n = required;
	memcpy(out, b->ids + prev, (required - prev) * sizeof(*out));
	*count = required - prev;
	return KVP_OK;
}

bool
kvp_grp_cache_mask(const struct kvp_group_spec *s, uint32_t align, size_t from, size_t to,
                   bool *mask)
{
	if (s->kind != KVP_GROUP_SLIDING_WINDOW || align <= s->block_size)
		return false;
	size_t per_segment = align / s->block_size;
	size_t tail = cdiv(s->window - 1, s->block_size);
	if (tail >= per_segment)
		return false;
	for (size_t i = from; i < to; i++)
		mask[i - from] = i % per_segment >= per_segment - tail;
	return true;
}

void
kvp_grp_free(struct kvp_grp_blocks *b, struct kvp_pool *pool)
{
	for (size_t i = 0; i < b->n / 2; i++) {
		int32_t t = b->ids[i];
		b->ids[i] = b->ids[b->n - 1 - i];
		b->ids[b->n - 1 - i] = t;
	}
	/* The request took exactly these references (nulls are no-ops): cannot fail. */
	(void)kvp_pool_free_blocks(pool, b->ids, b->n);
	kvp_grp_blocks_reset(b);
}
