/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Hybrid pools: group specs, the per-kind managers (vLLM's
 * tests/v1/core/test_single_type_kv_cache_manager.py cases) and the hybrid
 * coordinator (test_prefix_caching.py's test_prefill_hybrid_model), plus
 * sliding-window, chunked-local and Mamba steps worked out from vLLM's code.
 */
#include <stdlib.h>
#include <string.h>

#include "mgr_util.h"

#include "engine/group_mgr.h"
#include "engine/manager.h"

/* ---- group specs ---- */

static void
test_hybrid_group_spec_text_round_trips(void **state)
{
	struct kvp_group_spec g[KVP_MAX_GROUPS];
	size_t n = 0;
	char buf[256], err[160];

	(void)state;
	assert_ok(kvp_group_specs_parse("full:16+sliding_window:16:128+chunked_local_attention:16:"
	                                "8192+mamba:64:all", g, KVP_MAX_GROUPS, &n, err,
	                                sizeof(err)));
	assert_int_equal(n, 4);
	assert_int_equal(g[1].kind, KVP_GROUP_SLIDING_WINDOW);
	assert_int_equal(g[1].window, 128);
	assert_int_equal(g[2].kind, KVP_GROUP_CHUNKED_LOCAL);
	assert_int_equal(g[3].mamba_mode, KVP_MAMBA_ALL);
	assert_ok(kvp_group_specs_format(g, n, buf, sizeof(buf)));
	assert_string_equal(buf, "full:16+sliding_window:16:128+chunked_local:16:8192+mamba:64:all");
	assert_string_equal(kvp_group_kind_name(g[2].kind), "chunked_local_attention");
	assert_int_equal(kvp_group_specs_lcm(g, n), 64);
	/* Auto Mamba mode: align with caching, none without (vLLM's defaults). */
	assert_ok(kvp_group_specs_parse("mamba:16", g, KVP_MAX_GROUPS, &n, err, sizeof(err)));
	kvp_group_specs_resolve(g, n, false);
	assert_int_equal(g[0].mamba_mode, KVP_MAMBA_NONE);
}

static void
test_hybrid_group_spec_bad_text_is_refused(void **state)
{
	static const char *const bad[] = {
		"", "full", "full:0", "full:16:3", "sliding_window:16", "sliding_window:16:0",
		"chunked_local:16:x", "mamba:16:fast", "swa:16:4", "full:16+", "+full:16",
		"full:16+full:16+full:16+full:16+full:16+full:16+full:16+full:16+full:16",
		"full:99999999999999999999",
	};
	struct kvp_group_spec g[KVP_MAX_GROUPS] = {{0}};
	size_t n = 77;
	char err[160];

	(void)state;
	for (size_t i = 0; i < N_ELEMS(bad); i++) {
		err[0] = '\0';
		if (kvp_group_specs_parse(bad[i], g, KVP_MAX_GROUPS, &n, err, sizeof(err)) != KVP_EINVAL)
			fail_msg("accepted '%s'", bad[i]);
		assert_true(err[0] != '\0');
		assert_int_equal(n, 77); /* nothing written */
	}
}

static void
test_hybrid_group_spec_validate_as_vllm_asserts(void **state)
{
	struct kvp_group_spec g[2] = {
		{.kind = KVP_GROUP_FULL, .block_size = 16},
		{.kind = KVP_GROUP_SLIDING_WINDOW, .block_size = 24, .window = 64},
	};
	char err[200];

	(void)state;
	assert_ok(kvp_group_specs_validate(g, 2, 8, true, err, sizeof(err)));
	/* 24 is not a multiple of the hash block size 16. */
	assert_status(kvp_group_specs_validate(g, 2, 16, true, err, sizeof(err)), KVP_EINVAL);
	assert_non_null(strstr(err, "multiple"));
	assert_ok(kvp_group_specs_validate(g, 2, 16, false, err, sizeof(err)));
	g[1].window = 0;
	assert_status(kvp_group_specs_validate(g, 2, 8, true, err, sizeof(err)), KVP_EINVAL);
	/* Chunked local: its block size must be the LCM with caching on. */
	g[1] = (struct kvp_group_spec){.kind = KVP_GROUP_CHUNKED_LOCAL, .block_size = 8,
	                               .window = 64};
	assert_status(kvp_group_specs_validate(g, 2, 8, true, err, sizeof(err)), KVP_EINVAL);
	assert_ok(kvp_group_specs_validate(g, 2, 8, false, err, sizeof(err)));
	assert_status(kvp_group_specs_validate(g, 0, 8, true, err, sizeof(err)), KVP_EINVAL);
}

/* ---- single-type managers, with a mocked cache (vLLM's test cases) ---- */

struct mock {
	const bool *cached;
	size_t n;
};

static bool
mock_probe(void *ctx, size_t i)
{
	const struct mock *m = ctx;
	return i < m->n && m->cached[i];
}

static struct kvp_grp_hit
mock_search(const struct kvp_group_spec *s, const bool *cached, size_t n, size_t max_len)
{
	struct mock m = {cached, n};
	return kvp_grp_search(s, max_len, s->block_size, mock_probe, &m);
}

#define T true
#define F false

static void
test_hybrid_sliding_window_possible_cached_prefix(void **state)
{
	const struct kvp_group_spec s = {.kind = KVP_GROUP_SLIDING_WINDOW, .block_size = 2,
	                                 .window = 4};
	static const struct {
		bool c[12];
		size_t n, want;
	} cases[] = {
		{{F, F, F, F, F, F, F, F, F, F}, 10, 0}, {{T}, 1, 1}, {{T, F}, 2, 1},
		{{T, T}, 2, 2}, {{T, T, F}, 3, 2}, {{T, T, T}, 3, 3}, {{T, T, T, F}, 4, 3},
		{{T, T, F, T, F, F, T, T, F, T, T, T}, 12, 12},
		{{T, T, F, T, F, F, T, T, F, F, F}, 11, 8},
		{{T, T, F, T, F, F, T, T, F, F, F, T}, 12, 8},
	};

	(void)state;
	for (size_t i = 0; i < N_ELEMS(cases); i++) {
		struct kvp_grp_hit h = mock_search(&s, cases[i].c, cases[i].n, cases[i].n * 2);
		if (h.len != cases[i].want)
			fail_msg("case %zu: hit %zu blocks, want %zu", i, h.len, cases[i].want);
		/* All but the window's last two blocks are null. */
		assert_true(h.first >= (h.len > 2 ? h.len - 2 : 0));
	}
}

static void
test_hybrid_chunked_local_possible_cached_prefix(void **state)
{
	const struct kvp_group_spec s = {.kind = KVP_GROUP_CHUNKED_LOCAL, .block_size = 2,
	                                 .window = 4};
	static const struct {
		bool c[10];
		size_t n, tail, want;
	} cases[] = {
		{{T}, 1, 0, 1}, {{T}, 1, 1, 1}, {{T, F}, 2, 0, 2}, {{T, F}, 2, 1, 2},
		{{T, T}, 2, 0, 2}, {{T, T, F}, 3, 0, 2}, {{T, T, F}, 3, 1, 2}, {{T, T, T}, 3, 1, 3},
		{{T, T, T, F}, 4, 0, 4}, {{T, T, T, F}, 4, 1, 4},
		{{F, F, F, F, F, F, F, F, T}, 9, 1, 9}, {{T, T, T, T, T, T, T, T, F}, 9, 1, 8},
		{{F, F, F, F, F, F, F, F, T, T}, 10, 1, 10}, {{T, T, T, T, T, T, T, T, F, F}, 10, 0, 10},
		{{F, F, F, F, F, F, F, F, F, T}, 10, 1, 10},
	};

	(void)state;
	for (size_t i = 0; i < N_ELEMS(cases); i++) {
		struct kvp_grp_hit h = mock_search(&s, cases[i].c, cases[i].n,
		                                   cases[i].n * 2 + cases[i].tail);
		if (h.len != cases[i].want)
			fail_msg("case %zu: hit %zu blocks, want %zu", i, h.len, cases[i].want);
		assert_true(h.first >= (h.len - 1) / 2);
	}
}

/* A table of 11 blocks the request holds (ids 1..11 from a fresh pool). */
static struct kvp_pool *
held_table(struct kvp_grp_blocks *b)
{
	struct kvp_pool *p = mkpool(20, 2, false);
	memset(b, 0, sizeof(*b));
	kvp_grp_blocks_reset(b);
	assert_ok(kvp_grp_reserve(b, 11));
	assert_ok(kvp_pool_get_new_blocks(p, 11, b->ids));
	b->n = 11;
	return p;
}

static void
test_hybrid_sliding_window_remove_skipped_blocks(void **state)
{
	const struct kvp_group_spec s = {.kind = KVP_GROUP_SLIDING_WINDOW, .block_size = 2,
	                                 .window = 4};
	struct kvp_grp_blocks b;
	struct kvp_pool *p = held_table(&b);

	(void)state;
	kvp_grp_remove_skipped(&s, &b, p, 0);
	kvp_grp_remove_skipped(&s, &b, p, 4); /* token 0 out, block 1 still holds token 1 */
	assert_ids(b.ids, 4, 1, 2, 3, 4);
	kvp_grp_remove_skipped(&s, &b, p, 5);
	assert_ids(b.ids, 4, 0, 2, 3, 4);
	kvp_grp_remove_skipped(&s, &b, p, 6);
	assert_ids(b.ids, 4, 0, 2, 3, 4);
	kvp_grp_remove_skipped(&s, &b, p, 7);
	assert_ids(b.ids, 4, 0, 0, 3, 4);
	/* Blocks 4 and 3 leave together, the deeper first. */
	kvp_grp_remove_skipped(&s, &b, p, 11);
	assert_ids(b.ids, 6, 0, 0, 0, 0, 5, 6);
	assert_queue(p, 12, 13, 14, 15, 16, 17, 18, 19, 1, 2, 4, 3);
	assert_pool_ok(p);
	kvp_grp_free(&b, p);
	free(b.ids);
	kvp_pool_destroy(p);
}

static void
test_hybrid_chunked_local_remove_skipped_blocks(void **state)
{
	const struct kvp_group_spec s = {.kind = KVP_GROUP_CHUNKED_LOCAL, .block_size = 2,
	                                 .window = 4};
	struct kvp_grp_blocks b;
	struct kvp_pool *p = held_table(&b);

	(void)state;
	kvp_grp_remove_skipped(&s, &b, p, 0);
	assert_ids(b.ids, 3, 1, 2, 3);
	kvp_grp_remove_skipped(&s, &b, p, 4);
	assert_ids(b.ids, 3, 0, 0, 3);
	kvp_grp_remove_skipped(&s, &b, p, 6);
	assert_ids(b.ids, 3, 0, 0, 3);
	kvp_grp_remove_skipped(&s, &b, p, 12);
	assert_ids(b.ids, 7, 0, 0, 0, 0, 0, 0, 7);
	assert_queue(p, 12, 13, 14, 15, 16, 17, 18, 19, 2, 1, 6, 5, 4, 3);
	kvp_grp_free(&b, p);
	free(b.ids);
	kvp_pool_destroy(p);
}

/* vLLM's test_get_num_blocks_to_allocate, for both windowed kinds. */
static void
test_hybrid_num_blocks_to_allocate_skips_null_hits(void **state)
{
	struct kvp_group_spec s = {.kind = KVP_GROUP_SLIDING_WINDOW, .block_size = 2, .window = 4};
	struct kvp_pool *p = mkpool(100, 2, false);
	struct kvp_grp_blocks b;
	struct kvp_grp_plan plan;
	int32_t held[10], hits1[10], hits2[10];

	(void)state;
	memset(&b, 0, sizeof(b));
	kvp_grp_blocks_reset(&b);
	/* The hit blocks are held elsewhere (ref 1): none is evictable. */
	assert_ok(kvp_pool_get_new_blocks(p, 10, held));
	for (int i = 0; i < 10; i++) {
		hits1[i] = held[i];
		hits2[i] = i < 5 ? KVP_NULL_BLOCK : held[i - 5];
	}
	/* Held elsewhere (ref 1): only the 10 new blocks count. */
	kvp_grp_plan(&s, &b, p, hits1, 10, 0, 0, 40, 40, &plan);
	assert_int_equal(plan.to_allocate, 10);
	kvp_grp_plan(&s, &b, p, hits2, 10, 0, 0, 40, 40, &plan);
	assert_int_equal(plan.to_allocate, 10);
	/* Free cached hits (ref 0, as in vLLM's test) leave the queue when touched. */
	assert_ok(kvp_pool_free_blocks(p, held, 10));
	for (int k = 0; k < 2; k++) {
		kvp_grp_plan(&s, &b, p, hits1, 10, 0, 0, 40, 40, &plan);
		assert_int_equal(plan.to_allocate, 20);
		kvp_grp_plan(&s, &b, p, hits2, 10, 0, 0, 40, 40, &plan);
		assert_int_equal(plan.to_allocate, 15);
		s = (struct kvp_group_spec){.kind = KVP_GROUP_CHUNKED_LOCAL, .block_size = 2,
		                            .window = 4};
	}
	kvp_pool_destroy(p);
}

/* ---- the manager with hybrid groups ---- */

/* Per-group output rows. */
struct rows {
	int32_t ids[KVP_MAX_GROUPS][64];
	size_t n[KVP_MAX_GROUPS];
};

static uint32_t
lookup(struct env *e, uint64_t id, struct rows *h)
{
	int32_t *out[KVP_MAX_GROUPS];
	uint32_t hit = 0;
	for (uint32_t g = 0; g < KVP_MAX_GROUPS; g++)
		out[g] = h->ids[g];
	assert_ok(kvp_mgr_get_computed_blocks(e->mgr, id, out, 64, &hit));
	return hit;
}

static int
alloc(struct env *e, uint64_t id, uint32_t n, uint32_t hit, const struct rows *h,
      struct rows *fresh)
{
	const int32_t *comp[KVP_MAX_GROUPS];
	int32_t *out[KVP_MAX_GROUPS];
	for (uint32_t g = 0; g < KVP_MAX_GROUPS; g++) {
		comp[g] = h ? h->ids[g] : NULL;
		out[g] = fresh->ids[g];
	}
	struct kvp_alloc_args a = {.num_new_tokens = n, .num_new_computed_tokens = hit,
	                           .computed_blocks = hit ? comp : NULL};
	return kvp_mgr_allocate_slots(e->mgr, id, &a, out, 64, fresh->n);
}

static void
append1(struct env *e, uint64_t id, int64_t tok)
{
	assert_ok(kvp_mgr_append_tokens(e->mgr, id, &tok, 1));
}

/* test_prefill_hybrid_model's pool: 1 full + 2 sliding-window (window 32) groups. */
static void
hybrid_prefill(struct env *e, int64_t *all)
{
	struct rows h, f;

	env_open(e, 21, 16, "full:16+sliding_window:16:32+sliding_window:16:32", true);
	for (int i = 0; i < 48; i++)
		all[i] = i / 16;
	for (int i = 48; i < 55; i++)
		all[i] = 3;
	add_tokens(e, 0, all, 55);
	assert_int_equal(lookup(e, 0, &h), 0);
	assert_ok(alloc(e, 0, 55, 0, NULL, &f));
	assert_ids(f.ids[0], f.n[0], 1, 2, 3, 4);
	assert_ids(f.ids[1], f.n[1], 5, 6, 7, 8);
	assert_ids(f.ids[2], f.n[2], 9, 10, 11, 12);
	for (int32_t id = 1; id <= 12; id++)
		assert_int_equal(kvp_pool_block_key(e->pool, id, &(size_t){0}) != NULL, id % 4 != 0);

	add_tokens(e, 1, all, 53);
	assert_int_equal(lookup(e, 1, &h), 48);
	assert_ids(h.ids[0], 3, 1, 2, 3);
	assert_ids(h.ids[1], 3, 0, 6, 7);
	assert_ids(h.ids[2], 3, 0, 10, 11);
	assert_ok(alloc(e, 1, 5, 48, &h, &f));
	assert_ids(f.ids[0], f.n[0], 13);
	assert_ids(f.ids[1], f.n[1], 14);
	assert_ids(f.ids[2], f.n[2], 15);
	for (int g = 0; g < 3; g++)
		for (int i = 0; i < 3; i++)
			if (h.ids[g][i] != 0)
				assert_int_equal(kvp_pool_ref_cnt(e->pool, h.ids[g][i]), 2);
	assert_ok(kvp_mgr_free_request(e->mgr, 0));
	assert_ok(kvp_mgr_free_request(e->mgr, 1));
}

static void
test_hybrid_prefill_hybrid_model_and_partial_hits(void **state)
{
	/* Blocks to evict (block i of group g is 4g + i + 1) and the hit, in blocks. */
	static const struct {
		int32_t evict[3];
		size_t n, want;
	} cases[] = {
		{{5, 9}, 2, 3},      /* outside the window: no effect */
		{{1}, 1, 0},         /* full attention's first block: total miss */
		{{3, 7, 11}, 3, 2},  /* the last block of every group */
		{{3}, 1, 2}, {{7}, 1, 2}, {{11}, 1, 2},
		{{3, 5, 9}, 3, 0},   /* full hits 2 blocks, the window 1: they agree on 0 */
	};
	int64_t all[55];

	(void)state;
	for (size_t c = 0; c < N_ELEMS(cases); c++) {
		struct env e;
		struct rows h;
		hybrid_prefill(&e, all);
		assert_ok(kvp_pool_evict_blocks(e.pool, cases[c].evict, cases[c].n));
		add_tokens(&e, 2, all, 53);
		uint32_t hit = lookup(&e, 2, &h);
		if (hit != cases[c].want * 16)
			fail_msg("case %zu: hit %u tokens, want %zu", c, hit, cases[c].want * 16);
		env_close(&e);
	}
}

/* A sliding window moving with decode: which blocks turn null, and when. */
static void
test_hybrid_sliding_window_frees_as_it_moves(void **state)
{
	const int32_t *tbl;
	struct env e;
	struct rows f, h;
	int64_t tok[32];
	size_t n;

	(void)state;
	env_open(&e, 30, 4, "sliding_window:4:8", true);
	for (int i = 0; i < 32; i++)
		tok[i] = i;
	add_tokens(&e, 1, tok, 10);
	assert_ok(alloc(&e, 1, 10, 0, NULL, &f));
	assert_ids(f.ids[0], f.n[0], 1, 2, 3);
	append1(&e, 1, 10); /* 11 tokens; 10 computed: tokens 0-2 out, block 1 keeps 3 */
	assert_ok(alloc(&e, 1, 1, 0, NULL, &f));
	tbl = table(&e, 1, 0, &n);
	assert_ids(tbl, n, 1, 2, 3);
	append1(&e, 1, 11); /* 11 computed: block 1 leaves the window */
	assert_ok(alloc(&e, 1, 1, 0, NULL, &f));
	assert_int_equal(f.n[0], 0);
	tbl = table(&e, 1, 0, &n);
	assert_ids(tbl, n, 0, 2, 3);
	assert_int_equal(kvp_pool_ref_cnt(e.pool, 1), 0);
	for (int64_t t = 12; t < 17; t++) {
		append1(&e, 1, t);
		assert_ok(alloc(&e, 1, 1, 0, NULL, &f));
	}
	/* 16 computed, 17 tokens: blocks 1 and 2 are gone, 4 and 5 were added. */
	tbl = table(&e, 1, 0, &n);
	assert_ids(tbl, n, 0, 0, 3, 4, 5);
	assert_int_equal(kvp_pool_num_free(e.pool), 29 - 3);

	/* The window's last two cached blocks are a hit; earlier blocks are null. */
	int64_t other[19];
	memcpy(other, tok, 16 * sizeof(int64_t));
	other[16] = 100, other[17] = 101, other[18] = 102;
	add_tokens(&e, 2, other, 19);
	assert_int_equal(lookup(&e, 2, &h), 16);
	assert_ids(h.ids[0], 4, 0, 0, 3, 4);
	assert_ok(alloc(&e, 2, 3, 16, &h, &f));
	assert_ids(f.ids[0], f.n[0], 6);
	tbl = table(&e, 2, 0, &n);
	assert_ids(tbl, n, 0, 0, 3, 4, 6);
	assert_int_equal(kvp_pool_ref_cnt(e.pool, 3), 2);
	/* An event names the group's kind and window. */
	assert_ok(kvp_mgr_take_events(e.mgr, &e.ev));
	struct kvp_event ev;
	assert_ok(kvp_event_batch_get(&e.ev, 0, &ev));
	assert_int_equal(ev.type, KVP_EVENT_BLOCK_STORED);
	assert_string_equal(ev.spec_kind, "sliding_window");
	assert_true(ev.has_sliding_window);
	assert_int_equal(ev.sliding_window, 8);
	env_close(&e);
}

/* Chunked local: blocks before the current chunk are freed and count as a hit. */
static void
test_hybrid_chunked_local_frees_past_chunks(void **state)
{
	const int32_t *tbl;
	struct env e;
	struct rows f, h;
	int64_t tok[16];
	size_t n;

	(void)state;
	env_open(&e, 30, 4, "chunked_local:4:8", true);
	for (int i = 0; i < 16; i++)
		tok[i] = i;
	add_tokens(&e, 1, tok, 10);
	assert_ok(alloc(&e, 1, 10, 0, NULL, &f));
	assert_ids(f.ids[0], f.n[0], 1, 2, 3);
	append1(&e, 1, 10);
	assert_ok(alloc(&e, 1, 1, 0, NULL, &f)); /* 10 computed: chunk 0 (blocks 1, 2) is done */
	tbl = table(&e, 1, 0, &n);
	assert_ids(tbl, n, 0, 0, 3);
	int32_t q[40];
	size_t nq = kvp_pool_free_queue(e.pool, q, 40);
	assert_ids(q + nq - 2, 2, 2, 1);

	int64_t other[11];
	memcpy(other, tok, 10 * sizeof(int64_t));
	other[10] = 77;
	add_tokens(&e, 2, other, 11);
	assert_int_equal(lookup(&e, 2, &h), 8); /* chunk 0 needs nothing cached */
	assert_ids(h.ids[0], 2, 0, 0);
	assert_ok(alloc(&e, 2, 3, 8, &h, &f));
	assert_int_equal(f.n[0], 1);
	tbl = table(&e, 2, 0, &n);
	assert_ids(tbl, n, 0, 0, f.ids[0][0]);
	env_close(&e);
}

/* Mamba align: one running state block per step; the one two steps old is freed. */
static void
test_hybrid_mamba_align_keeps_one_state(void **state)
{
	const int32_t *tbl;
	struct env e;
	struct rows f, h;
	int64_t tok[16];
	size_t n;
	struct kvp_event ev;

	(void)state;
	env_open(&e, 30, 4, "mamba:4", true);
	for (int i = 0; i < 16; i++)
		tok[i] = i;
	add_tokens(&e, 1, tok, 10);
	assert_ok(alloc(&e, 1, 10, 0, NULL, &f));
	assert_ids(f.ids[0], f.n[0], 0, 0, 1);
	assert_ok(kvp_mgr_take_events(e.mgr, &e.ev));
	assert_int_equal(kvp_event_batch_count(&e.ev), 1); /* one BlockStored, nothing stored */
	assert_ok(kvp_event_batch_get(&e.ev, 0, &ev));
	assert_int_equal(ev.num_hashes, 0);
	assert_int_equal(ev.num_tokens, 8);
	assert_string_equal(ev.spec_kind, "mamba");
	append1(&e, 1, 10);
	assert_ok(alloc(&e, 1, 1, 0, NULL, &f));
	assert_int_equal(f.n[0], 0);
	append1(&e, 1, 11);
	assert_ok(alloc(&e, 1, 1, 0, NULL, &f)); /* 12 tokens: block 1 holds the state at 12 */
	assert_non_null(kvp_pool_block_key(e.pool, 1, &n));
	append1(&e, 1, 12);
	assert_ok(alloc(&e, 1, 1, 0, NULL, &f));
	assert_ids(f.ids[0], f.n[0], 2);
	append1(&e, 1, 13);
	assert_ok(alloc(&e, 1, 1, 0, NULL, &f)); /* 13 computed: block 1 is freed, still cached */
	tbl = table(&e, 1, 0, &n);
	assert_ids(tbl, n, 0, 0, 0, 2);
	assert_int_equal(kvp_pool_ref_cnt(e.pool, 1), 0);

	int64_t other[14];
	memcpy(other, tok, 12 * sizeof(int64_t));
	other[12] = 50, other[13] = 51;
	add_tokens(&e, 2, other, 14);
	assert_int_equal(lookup(&e, 2, &h), 12);
	assert_ids(h.ids[0], 3, 0, 0, 1);
	assert_ok(alloc(&e, 2, 2, 12, &h, &f));
	assert_ids(f.ids[0], f.n[0], 3);
	tbl = table(&e, 2, 0, &n);
	assert_ids(tbl, n, 0, 0, 1, 3);
	assert_int_equal(kvp_pool_ref_cnt(e.pool, 1), 1);
	env_close(&e);
}

/* Caching off: nothing hashed, cached or hit; allocation order as vLLM's. */
static void
test_hybrid_caching_off_hashes_nothing(void **state)
{
	struct env e;
	struct rows f, h;
	int64_t tok[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
	size_t nh = 9;

	(void)state;
	env_open(&e, 12, 4, "full:4+mamba:16", false);
	add_tokens(&e, 1, tok, 10);
	assert_ok(alloc(&e, 1, 10, 0, NULL, &f));
	assert_ids(f.ids[0], f.n[0], 1, 2, 3);
	assert_ids(f.ids[1], f.n[1], 4);
	assert_ok(kvp_mgr_request_info(e.mgr, 1, NULL, NULL, &nh));
	assert_int_equal(nh, 0);
	add_tokens(&e, 2, tok, 10);
	assert_int_equal(lookup(&e, 2, &h), 0);
	assert_ok(alloc(&e, 2, 10, 0, NULL, &f));
	assert_ids(f.ids[0], f.n[0], 5, 6, 7);
	assert_ok(kvp_mgr_free_request(e.mgr, 1));
	assert_queue(e.pool, 9, 10, 11, 3, 2, 1, 4);
	assert_int_equal(kvp_pool_num_cached_blocks(e.pool), 0);
	assert_ok(kvp_mgr_take_events(e.mgr, &e.ev));
	assert_int_equal(kvp_event_batch_count(&e.ev), 0);
	env_close(&e);
}

/* Full 8 + sliding window 4 (window 5): under the LCM 8 only odd window blocks are cached. */
static void
test_hybrid_sliding_window_cache_mask_under_lcm(void **state)
{
	struct env e;
	struct rows f, h;
	int64_t tok[20];
	struct kvp_event ev;

	(void)state;
	env_open(&e, 30, 4, "full:8+sliding_window:4:5", true);
	for (int i = 0; i < 20; i++)
		tok[i] = i;
	add_tokens(&e, 1, tok, 17);
	assert_ok(alloc(&e, 1, 17, 0, NULL, &f));
	assert_ids(f.ids[0], f.n[0], 1, 2, 3);
	assert_ids(f.ids[1], f.n[1], 4, 5, 6, 7, 8);
	assert_int_equal(kvp_pool_num_cached_blocks(e.pool), 4);
	assert_null(kvp_pool_block_key(e.pool, 4, &(size_t){0}));
	assert_non_null(kvp_pool_block_key(e.pool, 5, &(size_t){0}));
	assert_null(kvp_pool_block_key(e.pool, 6, &(size_t){0}));
	assert_non_null(kvp_pool_block_key(e.pool, 7, &(size_t){0}));
	assert_ok(kvp_mgr_take_events(e.mgr, &e.ev));
	assert_int_equal(kvp_event_batch_count(&e.ev), 2);
	assert_ok(kvp_event_batch_get(&e.ev, 1, &ev));
	assert_int_equal(ev.num_hashes, 2);   /* masked blocks left out */
	assert_int_equal(ev.num_tokens, 16);  /* the whole range's tokens */
	assert_int_equal(ev.block_size, 4);
	add_tokens(&e, 2, tok, 20);
	assert_int_equal(lookup(&e, 2, &h), 16);
	assert_ids(h.ids[0], 2, 1, 2);
	assert_ids(h.ids[1], 4, 0, 0, 0, 7);
	env_close(&e);
}

/* A Qwen3-Next-like pool (full + Mamba, caching on) fixes on the Mamba state. */
static void
test_hybrid_full_and_mamba_agree_on_state(void **state)
{
	struct env e;
	struct rows f, h;
	int64_t tok[40];
	size_t n;

	(void)state;
	env_open(&e, 40, 4, "full:4+mamba:8", true);
	for (int i = 0; i < 40; i++)
		tok[i] = i;
	add_tokens(&e, 1, tok, 20);
	assert_ok(alloc(&e, 1, 20, 0, NULL, &f));
	assert_ids(f.ids[0], f.n[0], 1, 2, 3, 4, 5);
	assert_ids(f.ids[1], f.n[1], 0, 0, 6);
	assert_ok(kvp_mgr_free_request(e.mgr, 1));
	/* Full hits 4 blocks (16 tokens) but no Mamba state at 16 or 8 was cached: a miss. */
	add_tokens(&e, 2, tok, 30);
	assert_int_equal(lookup(&e, 2, &h), 0);
	assert_ok(kvp_mgr_free_request(e.mgr, 2));
	/* 24 tokens computed leave the state at 24 cached (block 13): both agree on 24. */
	add_tokens(&e, 3, tok, 24);
	assert_ok(alloc(&e, 3, 24, 0, NULL, &f));
	assert_ids(f.ids[0], f.n[0], 7, 8, 9, 10, 11, 12);
	assert_ids(f.ids[1], f.n[1], 0, 0, 13);
	assert_ok(kvp_mgr_free_request(e.mgr, 3));
	add_tokens(&e, 4, tok, 30);
	assert_int_equal(lookup(&e, 4, &h), 24);
	assert_ids(h.ids[0], 6, 1, 2, 3, 4, 11, 12);
	assert_ids(h.ids[1], 3, 0, 0, 13);
	(void)n;
	env_close(&e);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hybrid_group_spec_text_round_trips),
		cmocka_unit_test(test_hybrid_group_spec_bad_text_is_refused),
		cmocka_unit_test(test_hybrid_group_spec_validate_as_vllm_asserts),
		cmocka_unit_test(test_hybrid_sliding_window_possible_cached_prefix),
		cmocka_unit_test(test_hybrid_chunked_local_possible_cached_prefix),
		cmocka_unit_test(test_hybrid_sliding_window_remove_skipped_blocks),
		cmocka_unit_test(test_hybrid_chunked_local_remove_skipped_blocks),
		cmocka_unit_test(test_hybrid_num_blocks_to_allocate_skips_null_hits),
		cmocka_unit_test(test_hybrid_prefill_hybrid_model_and_partial_hits),
		cmocka_unit_test(test_hybrid_sliding_window_frees_as_it_moves),
		cmocka_unit_test(test_hybrid_chunked_local_frees_past_chunks),
		cmocka_unit_test(test_hybrid_mamba_align_keeps_one_state),
		cmocka_unit_test(test_hybrid_caching_off_hashes_nothing),
		cmocka_unit_test(test_hybrid_sliding_window_cache_mask_under_lcm),
		cmocka_unit_test(test_hybrid_full_and_mamba_agree_on_state),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
