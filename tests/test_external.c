/* SPDX-License-Identifier: Apache-2.0 */
/*
 * External (KV connector) computed tokens in allocate_slots, as vLLM's
 * SingleTypeKVCacheManager.allocate_new_computed_blocks and
 * get_num_blocks_to_allocate treat them: blocks for the connector's tokens
 * still in the window, nulls for the rest, counted against capacity, cached
 * like computed tokens.
 */
#include "mgr_util.h"

static void
add(struct env *e, uint64_t id, size_t ntok)
{
	int64_t tok[64];
	for (size_t i = 0; i < ntok; i++)
		tok[i] = (int64_t)(1000 + i);
	struct kvp_request_desc d = {.prompt = tok, .num_prompt = ntok};
	assert_ok(kvp_mgr_add_request(e->mgr, id, &d));
}

struct rows {
	int32_t ids[KVP_MAX_GROUPS][64];
	size_t n[KVP_MAX_GROUPS], ext[KVP_MAX_GROUPS];
};

static int
alloc_ext(struct env *e, uint64_t id, uint32_t n, uint32_t ext, bool delay, struct rows *f)
{
	int32_t *out[KVP_MAX_GROUPS];
	for (uint32_t g = 0; g < KVP_MAX_GROUPS; g++)
		out[g] = f->ids[g];
	struct kvp_alloc_args a = {.num_new_tokens = n, .num_external_computed_tokens = ext,
	                           .num_external_blocks = f->ext, .delay_cache_blocks = delay};
	return kvp_mgr_allocate_slots(e->mgr, id, &a, out, 64, f->n);
}

static uint32_t
stored_blocks(struct env *e)
{
	uint32_t n = 0;
	assert_ok(kvp_mgr_take_events(e->mgr, &e->ev));
	for (size_t i = 0; i < kvp_event_batch_count(&e->ev); i++) {
		struct kvp_event ev;
		assert_ok(kvp_event_batch_get(&e->ev, i, &ev));
		if (ev.type == KVP_EVENT_BLOCK_STORED)
			n += ev.num_hashes;
	}
	return n;
}

/* Full attention: the connector's 8 tokens get 2 blocks, then the 4 to compute 1; all cached. */
static void
test_external_tokens_get_blocks_and_are_cached(void **state)
{
	struct env e;
	struct rows f;
	size_t num_computed;

	(void)state;
	env_open(&e, 10, 4, "full:4", true);
	add(&e, 1, 16);
	assert_ok(alloc_ext(&e, 1, 4, 8, false, &f));
	assert_ids(f.ids[0], f.n[0], 1, 2, 3);
	assert_int_equal(f.ext[0], 2);
	assert_ok(kvp_mgr_request_info(e.mgr, 1, NULL, &num_computed, NULL));
	assert_int_equal(num_computed, 12);
	assert_int_equal(stored_blocks(&e), 3);
	/* A later step of the running request: external tokens get no blocks of their own. */
	assert_ok(alloc_ext(&e, 1, 4, 0, false, &f));
	assert_ids(f.ids[0], f.n[0], 4);
	assert_int_equal(f.ext[0], 0);
	assert_ok(kvp_mgr_free_request(e.mgr, 1));
	env_close(&e);
}

/* An asynchronous load: no token to compute, the connector's blocks only, not cached yet. */
static void
test_external_async_load_allocates_without_new_tokens(void **state)
{
	struct env e;
	struct rows f;

	(void)state;
	env_open(&e, 10, 4, "full:4", true);
	add(&e, 1, 13);
	assert_ok(alloc_ext(&e, 1, 0, 12, true, &f));
	assert_ids(f.ids[0], f.n[0], 1, 2, 3);
	assert_int_equal(f.ext[0], 3);
	assert_int_equal(stored_blocks(&e), 0);
	/* The load done, the last token is computed: the three blocks are cached then. */
	assert_ok(alloc_ext(&e, 1, 1, 0, false, &f));
	assert_ids(f.ids[0], f.n[0], 4);
	assert_int_equal(stored_blocks(&e), 3);
	/* No token and no external token: vLLM's ValueError. */
	assert_status(alloc_ext(&e, 1, 0, 0, false, &f), KVP_EINVAL);
	assert_ok(kvp_mgr_free_request(e.mgr, 1));
	env_close(&e);
}

/*
 * Sliding window 8, block 4: 12 external tokens skip 5 tokens (one block):
 * the table is [null, e1, e2] and the step's block follows; 3 blocks count
 * against capacity, so with 2 free the step is refused and nothing changes.
 */
static void
test_external_tokens_outside_the_window_are_null(void **state)
{
	struct env e;
	struct rows f;
	const int32_t *tbl;
	size_t n;
	int32_t held[7];

	(void)state;
	env_open(&e, 10, 4, "sliding_window:4:8", true);
	add(&e, 1, 16);
	assert_ok(kvp_pool_get_new_blocks(e.pool, 7, held)); /* leave 2 free */
	assert_status(alloc_ext(&e, 1, 4, 12, false, &f), KVP_ENOSPACE);
	assert_int_equal(kvp_pool_num_free(e.pool), 2);
	assert_ok(kvp_mgr_request_blocks(e.mgr, 1, 0, &tbl, &n));
	assert_int_equal(n, 0);
	assert_ok(kvp_pool_free_blocks(e.pool, held, 7));
	assert_ok(alloc_ext(&e, 1, 4, 12, false, &f));
	assert_int_equal(f.ext[0], 2);
	assert_int_equal(f.n[0], 3);
	assert_ok(kvp_mgr_request_blocks(e.mgr, 1, 0, &tbl, &n));
	assert_int_equal(n, 4);
	assert_int_equal(tbl[0], KVP_NULL_BLOCK);
	assert_true(tbl[1] > 0 && tbl[2] > 0 && tbl[3] > 0);
	assert_ok(kvp_mgr_free_request(e.mgr, 1));
	env_close(&e);
}

/* Refusals: more external tokens than the request has; a Mamba align group. */
static void
test_external_bad_calls_change_nothing(void **state)
{
	struct env e;
	struct rows f;

	(void)state;
	env_open(&e, 10, 4, "full:4", true);
	add(&e, 1, 8);
	assert_status(alloc_ext(&e, 1, 1, 9, false, &f), KVP_EINVAL);
	assert_int_equal(kvp_pool_num_free(e.pool), 9);
	assert_ok(kvp_mgr_free_request(e.mgr, 1));
	/* Blocks held, none cached yet (delayed): external tokens now would rebuild the
	 * table over them (vLLM asserts the table is empty). Refused; nothing changes. */
	add(&e, 2, 16);
	assert_ok(alloc_ext(&e, 2, 4, 0, true, &f));
	assert_int_equal(kvp_pool_num_free(e.pool), 8);
	assert_status(alloc_ext(&e, 2, 4, 4, false, &f), KVP_EINVAL);
	assert_int_equal(kvp_pool_num_free(e.pool), 8);
	assert_ok(kvp_mgr_free_request(e.mgr, 2));
	env_close(&e);

	env_open(&e, 10, 4, "full:4+mamba:4:align", true);
	add(&e, 1, 8);
	assert_status(alloc_ext(&e, 1, 4, 4, false, &f), KVP_ENOTSUP);
	assert_int_equal(kvp_pool_num_free(e.pool), 9);
	assert_ok(kvp_mgr_free_request(e.mgr, 1));
	env_close(&e);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_external_tokens_get_blocks_and_are_cached),
		cmocka_unit_test(test_external_async_load_allocates_without_new_tokens),
		cmocka_unit_test(test_external_tokens_outside_the_window_are_null),
		cmocka_unit_test(test_external_bad_calls_change_nothing),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
