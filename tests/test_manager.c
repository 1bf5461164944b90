/* SPDX-License-Identifier: Apache-2.0 */
/* The request-level manager against vLLM's KVCacheManager (spec section 5). */
#include "mgr_util.h"

/* Full-attention groups of these block sizes (the manager's block_sizes form). */
static void
env_open_sizes(struct env *e, uint32_t n, uint32_t hash_bs, const uint32_t *bs, uint32_t ngroups,
               uint32_t max_hash_len)
{
	/* The scenarios these tests pin were written against vLLM 9aaf83ef5. */
	struct kvp_pool_config pc = {.num_blocks = n, .hash_block_size = hash_bs,
	                             .max_hash_len = max_hash_len, .enable_caching = true,
	                             .enable_events = true, .semantics = KVP_VLLM_9AAF83EF5};
	struct kvp_mgr_config mc = {.num_groups = ngroups, .block_sizes = bs,
	                            .max_model_len = 8192, .max_requests = 16};
	assert_ok(kvp_pool_create(&pc, &e->pool));
	assert_ok(kvp_hasher_create("0", &e->hasher));
	assert_ok(kvp_hasher_set_keys_form(e->hasher, KVP_KEYS_PLAIN)); /* 9aaf83ef5's keys */
	assert_ok(kvp_mgr_create(e->pool, e->hasher, &mc, &e->mgr));
	kvp_event_batch_init(&e->ev);
	e->ngroups = ngroups;
}

static void
add(struct env *e, uint64_t id, size_t ntok)
{
	int64_t tok[256];
	for (size_t i = 0; i < ntok; i++)
		tok[i] = (int64_t)i;
	struct kvp_request_desc d = {.prompt = tok, .num_prompt = ntok};
	assert_ok(kvp_mgr_add_request(e->mgr, id, &d));
}

/* lookup(req) then alloc(req, n, hit, blocks) with one group. */
static uint32_t
lookup1(struct env *e, uint64_t id, int32_t *hits)
{
	uint32_t hit = 0;
	int32_t *const out[] = {hits};
	assert_ok(kvp_mgr_get_computed_blocks(e->mgr, id, out, 64, &hit));
	return hit;
}

static int
alloc1(struct env *e, uint64_t id, uint32_t n, uint32_t hit, const int32_t *hits,
       int32_t *fresh, size_t *count)
{
	const int32_t *const comp[] = {hits};
	int32_t *const out[] = {fresh};
	struct kvp_alloc_args a = {.num_new_tokens = n, .num_new_computed_tokens = hit,
	                           .computed_blocks = hit ? comp : NULL};
	return kvp_mgr_allocate_slots(e->mgr, id, &a, out, 64, count);
}

/* Prefill, reuse with the last-token cap, duplicates, and 13 vs 12 tokens. */
static void
test_manager_prefix_hit_capped_at_num_tokens_minus_one(void **state)
{
	struct env e;
	const uint32_t bs[] = {4};
	int32_t hits[64], fresh[64];
	size_t n;
	struct kvp_event ev;
	const int32_t *blocks;

	(void)state;
	env_open_sizes(&e, 10, 4, bs, 1, 0);
	add(&e, 1, 12);
	assert_int_equal(lookup1(&e, 1, hits), 0);
	assert_ok(alloc1(&e, 1, 12, 0, NULL, fresh, &n));
	assert_ids(fresh, n, 1, 2, 3);
	assert_ok(kvp_mgr_take_events(e.mgr, &e.ev));
	assert_int_equal(kvp_event_batch_count(&e.ev), 1);
	assert_ok(kvp_event_batch_get(&e.ev, 0, &ev));
	assert_int_equal(ev.type, KVP_EVENT_BLOCK_STORED);
	assert_int_equal(ev.num_hashes, 3);
	assert_null(ev.parent);
	assert_int_equal(ev.num_tokens, 12);
	assert_string_equal(ev.spec_kind, "full_attention");
	assert_ok(kvp_mgr_free_request(e.mgr, 1));
	assert_queue(e.pool, 4, 5, 6, 7, 8, 9, 3, 2, 1);

	/* Fully cached 12-token prompt: only 2 blocks hit (the last token recomputes). */
	add(&e, 2, 12);
	assert_int_equal(lookup1(&e, 2, hits), 8);
	assert_ids(hits, 2, 1, 2);
	assert_ok(alloc1(&e, 2, 4, 8, hits, fresh, &n));
	assert_ids(fresh, n, 4);
	assert_queue(e.pool, 5, 6, 7, 8, 9, 3);
	assert_ok(kvp_mgr_request_blocks(e.mgr, 2, 0, &blocks, &n));
	assert_ids(blocks, n, 1, 2, 4);
	assert_ok(kvp_mgr_take_events(e.mgr, &e.ev));
	assert_int_equal(kvp_event_batch_count(&e.ev), 1);
	assert_ok(kvp_event_batch_get(&e.ev, 0, &ev));
	assert_int_equal(ev.num_hashes, 1); /* block 4 duplicates block 3's hash */
	assert_non_null(ev.parent);
	assert_int_equal(ev.num_tokens, 4);
	assert_int_equal(ev.token_ids[0], 8);
	assert_int_equal(kvp_pool_num_cached_keys(e.pool), 3);
	assert_int_equal(kvp_pool_num_cached_blocks(e.pool), 4);

	/* 13 tokens: 3 blocks hit; the third is the first inserted, block 3. */
	add(&e, 3, 13);
	assert_int_equal(lookup1(&e, 3, hits), 12);
	assert_ids(hits, 3, 1, 2, 3);

	struct kvp_mgr_stats st;
	kvp_mgr_get_stats(e.mgr, &st);
	assert_int_equal(st.requests, 3);
	assert_int_equal(st.queries, 12 + 12 + 13);
	assert_int_equal(st.hits, 0 + 8 + 12);
	assert_int_equal(st.active_requests, 2);
	env_close(&e);
}

/* Evictable hits count against capacity; failure changes nothing. */
static void
test_manager_allocate_failure_is_atomic(void **state)
{
	struct env e;
	const uint32_t bs[] = {4};
	int32_t hits[64], fresh[64];
	size_t n;

	(void)state;
	env_open_sizes(&e, 5, 4, bs, 1, 0);
	add(&e, 1, 8);
	assert_ok(alloc1(&e, 1, 8, 0, NULL, fresh, &n));
	assert_ids(fresh, n, 1, 2);
	assert_ok(kvp_mgr_free_request(e.mgr, 1));
	assert_queue(e.pool, 3, 4, 2, 1);
	assert_ok(kvp_mgr_take_events(e.mgr, &e.ev));

	add(&e, 2, 17);
	assert_int_equal(lookup1(&e, 2, hits), 8);
	/* needs 5 - 2 = 3 new + 2 evictable hits = 5 > 4 free */
	assert_status(alloc1(&e, 2, 9, 8, hits, fresh, &n), KVP_ENOSPACE);
	assert_int_equal(kvp_pool_ref_cnt(e.pool, 1), 0);
	assert_int_equal(kvp_pool_ref_cnt(e.pool, 2), 0);
	assert_queue(e.pool, 3, 4, 2, 1);
	assert_ok(kvp_mgr_take_events(e.mgr, &e.ev));
	assert_int_equal(kvp_event_batch_count(&e.ev), 0);
	/* Schedule fewer tokens: 2 hits + 1 new = 3 fits. */
	assert_ok(alloc1(&e, 2, 4, 8, hits, fresh, &n));
	assert_ids(fresh, n, 3);
	assert_int_equal(kvp_pool_ref_cnt(e.pool, 1), 1);
	assert_queue(e.pool, 4);
	struct kvp_mgr_stats st;
	kvp_mgr_get_stats(e.mgr, &st);
	assert_int_equal(st.alloc_failures, 1);
	env_close(&e);
}

/*
 * full_sequence_must_fit (vLLM's admission gate): a chunk that fits is
 * refused when the whole request would not, before anything changes; a
 * request that fits whole gets only its chunk's blocks.
 */
static void
test_manager_full_sequence_must_fit_gates_admission(void **state)
{
	struct env e;
	const uint32_t bs[] = {4};
	int32_t fresh[64];
	int32_t *const out[] = {fresh};
	size_t n;
	struct kvp_mgr_stats st;

	(void)state;
	env_open_sizes(&e, 5, 4, bs, 1, 0); /* 4 usable blocks */
	add(&e, 1, 24);               /* 6 blocks whole */
	struct kvp_alloc_args a = {.num_new_tokens = 8, .full_sequence_must_fit = true};
	assert_status(kvp_mgr_allocate_slots(e.mgr, 1, &a, out, 64, &n), KVP_ENOSPACE);
	assert_int_equal(kvp_pool_num_free(e.pool), 4);
	assert_queue(e.pool, 1, 2, 3, 4);
	kvp_mgr_get_stats(e.mgr, &st);
	assert_int_equal(st.alloc_failures, 1);
	/* Without the gate the same chunk fits (vLLM's chunked prefill). */
	a.full_sequence_must_fit = false;
	assert_ok(kvp_mgr_allocate_slots(e.mgr, 1, &a, out, 64, &n));
	assert_ids(fresh, n, 1, 2);
	assert_ok(kvp_mgr_free_request(e.mgr, 1));

	add(&e, 2, 16); /* 4 blocks whole: fits; the chunk gets 2 */
	a.full_sequence_must_fit = true;
	assert_ok(kvp_mgr_allocate_slots(e.mgr, 2, &a, out, 64, &n));
	assert_int_equal(n, 2);
	/* The next chunk: 2 more blocks needed of 2 free, the whole still fits. */
	assert_ok(kvp_mgr_allocate_slots(e.mgr, 2, &a, out, 64, &n));
	assert_int_equal(n, 2);
	assert_int_equal(kvp_pool_num_free(e.pool), 0);
	kvp_mgr_get_stats(e.mgr, &st);
	assert_int_equal(st.alloc_failures, 1);
	env_close(&e);
}

/* Decode: tokens appended one at a time; a block that fills is cached, chained. */
static void
test_manager_decode_caches_filled_block_with_parent(void **state)
{
	struct env e;
	const uint32_t bs[] = {4};
	int32_t fresh[64];
	size_t n, ntok, ncomp, nh;
	struct kvp_event ev;
	const int32_t *blocks;

	(void)state;
	env_open_sizes(&e, 10, 4, bs, 1, 0);
	add(&e, 7, 6);
	assert_ok(alloc1(&e, 7, 6, 0, NULL, fresh, &n));
	assert_ids(fresh, n, 1, 2);
	assert_ok(kvp_mgr_take_events(e.mgr, &e.ev));
	assert_int_equal(kvp_event_batch_count(&e.ev), 1); /* block 1 only */
	for (int64_t t = 6; t < 10; t++) {
		assert_ok(kvp_mgr_append_tokens(e.mgr, 7, &t, 1));
		assert_ok(alloc1(&e, 7, 1, 0, NULL, fresh, &n));
	}
	assert_ok(kvp_mgr_request_info(e.mgr, 7, &ntok, &ncomp, &nh));
	assert_int_equal(ntok, 10);
	assert_int_equal(ncomp, 10);
	assert_int_equal(nh, 2);
	assert_ok(kvp_mgr_request_blocks(e.mgr, 7, 0, &blocks, &n));
	assert_ids(blocks, n, 1, 2, 3);
	assert_ok(kvp_mgr_take_events(e.mgr, &e.ev));
	assert_int_equal(kvp_event_batch_count(&e.ev), 1); /* block 2 filled at token 8 */
	assert_ok(kvp_event_batch_get(&e.ev, 0, &ev));
	assert_int_equal(ev.num_hashes, 1);
	assert_non_null(ev.parent);
	assert_int_equal(ev.num_tokens, 4);
	assert_int_equal(ev.token_ids[0], 4);
	/* Preempt: blocks freed tail first, request kept, computed reset. */
	assert_ok(kvp_mgr_preempt(e.mgr, 7));
	assert_queue(e.pool, 4, 5, 6, 7, 8, 9, 3, 2, 1);
	assert_ok(kvp_mgr_request_info(e.mgr, 7, &ntok, &ncomp, &nh));
	assert_int_equal(ncomp, 0);
	int32_t hits[8];
	assert_int_equal(lookup1(&e, 7, hits), 8);
	struct kvp_mgr_stats st;
	kvp_mgr_get_stats(e.mgr, &st);
	assert_int_equal(st.preempted_requests, 1);
	assert_int_equal(st.preempted_hits, 8);
	env_close(&e);
}

/* Three groups from a fresh pool take consecutive chunks; hits are all or nothing. */
static void
test_manager_multi_group_chunks_and_all_or_nothing(void **state)
{
	struct env e;
	const uint32_t bs[] = {4, 4, 4};
	int32_t g0[8], g1[8], g2[8];
	int32_t *const out[] = {g0, g1, g2};
	size_t counts[3];
	uint32_t hit;
	struct kvp_alloc_args a = {.num_new_tokens = 16};

	(void)state;
	env_open_sizes(&e, 20, 4, bs, 3, 0);
	add(&e, 1, 16);
	assert_ok(kvp_mgr_allocate_slots(e.mgr, 1, &a, out, 8, counts));
	assert_ids(g0, counts[0], 1, 2, 3, 4);
	assert_ids(g1, counts[1], 5, 6, 7, 8);
	assert_ids(g2, counts[2], 9, 10, 11, 12);
	assert_ok(kvp_mgr_take_events(e.mgr, &e.ev));
	assert_int_equal(kvp_event_batch_count(&e.ev), 3); /* one Stored per group */
	assert_ok(kvp_mgr_free_request(e.mgr, 1));

	add(&e, 2, 17);
	assert_ok(kvp_mgr_get_computed_blocks(e.mgr, 2, out, 8, &hit));
	assert_int_equal(hit, 16);
	assert_ids(g1, 4, 5, 6, 7, 8);
	/* Drop group 1's third block: every group's hit shrinks to 8 tokens. */
	assert_ok(kvp_pool_evict_blocks(e.pool, (int32_t[]){7}, 1));
	assert_ok(kvp_mgr_get_computed_blocks(e.mgr, 2, out, 8, &hit));
	assert_int_equal(hit, 8);
	assert_ids(g0, 2, 1, 2);
	assert_ids(g2, 2, 9, 10);
	env_close(&e);
}

/* Block sizes 4 and 8 (hash block 4): hits agree on the LCM (8). */
static void
test_manager_hybrid_block_sizes_align_to_lcm(void **state)
{
	struct env e;
	const uint32_t bs[] = {4, 8};
	int32_t g0[8], g1[8];
	int32_t *const out[] = {g0, g1};
	size_t counts[2];
	uint32_t hit;
	struct kvp_alloc_args a = {.num_new_tokens = 17};

	(void)state;
	env_open_sizes(&e, 20, 4, bs, 2, 64);
	add(&e, 1, 17);
	assert_ok(kvp_mgr_allocate_slots(e.mgr, 1, &a, out, 8, counts));
	assert_int_equal(counts[0], 5);
	assert_int_equal(counts[1], 3);
	/* cached up to 16 tokens: 4 blocks of group 0, 2 of group 1 */
	assert_int_equal(kvp_pool_num_cached_blocks(e.pool), 6);
	assert_ok(kvp_mgr_free_request(e.mgr, 1));
	add(&e, 2, 20);
	assert_ok(kvp_mgr_get_computed_blocks(e.mgr, 2, out, 8, &hit));
	assert_int_equal(hit, 16);
	int32_t g1b1 = g1[1];
	assert_ok(kvp_pool_evict_blocks(e.pool, &g1b1, 1));
	assert_ok(kvp_mgr_get_computed_blocks(e.mgr, 2, out, 8, &hit));
	assert_int_equal(hit, 8);
	/* 3 fine-block hits in group 0 would be 12 tokens, not a multiple of 8. */
	env_close(&e);
}

/* A remote caller's hits are checked; misuse is refused with nothing changed. */
static void
test_manager_bad_calls_are_rejected(void **state)
{
	struct env e;
	const uint32_t bs[] = {4};
	int32_t hits[64], fresh[64];
	size_t n;

	(void)state;
	env_open_sizes(&e, 10, 4, bs, 1, 0);
	add(&e, 1, 8);
	assert_ok(alloc1(&e, 1, 8, 0, NULL, fresh, &n));
	assert_ok(kvp_mgr_free_request(e.mgr, 1));
	add(&e, 2, 9);
	assert_int_equal(lookup1(&e, 2, hits), 8);
	assert_ok(kvp_pool_evict_blocks(e.pool, &hits[1], 1));
	assert_status(alloc1(&e, 2, 1, 8, hits, fresh, &n), KVP_ESTATE);
	assert_status(alloc1(&e, 2, 1, 6, hits, fresh, &n), KVP_EINVAL); /* not block aligned */
	assert_status(alloc1(&e, 2, 0, 0, NULL, fresh, &n), KVP_EINVAL);
	assert_status(alloc1(&e, 99, 1, 0, NULL, fresh, &n), KVP_ENOTFOUND);
	hits[0] = 77;
	assert_status(alloc1(&e, 2, 1, 4, hits, fresh, &n), KVP_ERANGE);
	assert_int_equal(kvp_pool_num_free(e.pool), 9);
	/* Hits for a request that already holds blocks. */
	assert_ok(alloc1(&e, 2, 4, 0, NULL, fresh, &n));
	assert_int_equal(lookup1(&e, 2, hits), 4);
	assert_status(alloc1(&e, 2, 1, 4, hits, fresh, &n), KVP_EINVAL);

	int64_t t[1] = {5};
	struct kvp_request_desc d = {.prompt = t, .num_prompt = 1};
	assert_status(kvp_mgr_add_request(e.mgr, 2, &d), KVP_ESTATE);
	d.num_prompt = 0;
	assert_status(kvp_mgr_add_request(e.mgr, 3, &d), KVP_EINVAL);
	d.num_prompt = 9000;
	assert_status(kvp_mgr_add_request(e.mgr, 3, &d), KVP_EINVAL);
	assert_status(kvp_mgr_append_tokens(e.mgr, 3, t, 1), KVP_ENOTFOUND);
	assert_status(kvp_mgr_free_request(e.mgr, 3), KVP_ENOTFOUND);
	assert_status(kvp_mgr_preempt(e.mgr, 3), KVP_ENOTFOUND);
	d.num_prompt = 1;
	for (uint64_t id = 100; id < 115; id++)
		assert_ok(kvp_mgr_add_request(e.mgr, id, &d));
	assert_status(kvp_mgr_add_request(e.mgr, 115, &d), KVP_EBUSY);
	for (uint64_t id = 100; id < 115; id++)
		assert_ok(kvp_mgr_free_request(e.mgr, id));

	const uint32_t badbs[] = {6};
	struct kvp_mgr_config mc = {.num_groups = 1, .block_sizes = badbs, .max_model_len = 64};
	struct kvp_mgr *m2 = NULL;
	assert_status(kvp_mgr_create(e.pool, e.hasher, &mc, &m2), KVP_EINVAL);
	const uint32_t big[] = {8}; /* coarse hash of 64 B > the pool's 32 */
	mc.block_sizes = big;
	assert_status(kvp_mgr_create(e.pool, e.hasher, &mc, &m2), KVP_EINVAL);
	mc.num_groups = 0;
	assert_status(kvp_mgr_create(e.pool, e.hasher, &mc, &m2), KVP_EINVAL);
	assert_null(m2);
	env_close(&e);
}

/* LoRA, salt and mm reach the hashes and the Stored event; session_id only the event. */
static void
test_manager_lora_salt_mm_reach_hash_and_event(void **state)
{
	struct env e;
	const uint32_t bs[] = {4};
	int32_t fresh[8];
	size_t n;
	struct kvp_event ev;
	const struct kvp_mm_feature mm[] = {{"img", 2, 3}};
	const struct kvp_request_keys k = {.lora_name = "L", .mm = mm, .num_mm = 1,
	                                   .cache_salt = "S", .session_id = "chat-1"};
	int64_t tok[8];
	uint8_t want[32];

	(void)state;
	for (int i = 0; i < 8; i++)
		tok[i] = i;
	env_open_sizes(&e, 10, 4, bs, 1, 0);
	struct kvp_request_desc d = {.prompt = tok, .num_prompt = 8, .keys = &k,
	                             .has_lora_id = true, .lora_id = 7};
	assert_ok(kvp_mgr_add_request(e.mgr, 1, &d));
	assert_ok(alloc1(&e, 1, 8, 0, NULL, fresh, &n));
	assert_ok(kvp_mgr_take_events(e.mgr, &e.ev));
	assert_ok(kvp_event_batch_get(&e.ev, 0, &ev));
	assert_int_equal(ev.num_hashes, 2);
	kvp_test_unhex("2e22a72f505692bd4873ca3d4e0b019404e5cbaa6a9cb18cafba1662ecb8b859", want, 32);
	assert_memory_equal(ev.hashes, want, 32); /* H5 */
	assert_true(ev.has_lora_id);
	assert_int_equal(ev.lora_id, 7);
	assert_string_equal(ev.lora_name, "L");
	assert_string_equal(ev.session_id, "chat-1");
	uint8_t e0[64], e1[64];
	size_t l0 = kvp_test_unhex("83614c8263696d67026153", e0, sizeof(e0));
	size_t l1 = kvp_test_unhex("82614c8263696d6721", e1, sizeof(e1));
	assert_int_equal(ev.extra_key_offsets[1], l0);
	assert_memory_equal(ev.extra_keys, e0, l0);
	assert_int_equal(ev.extra_key_offsets[2] - ev.extra_key_offsets[1], l1);
	assert_memory_equal(ev.extra_keys + l0, e1, l1);
	env_close(&e);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_manager_prefix_hit_capped_at_num_tokens_minus_one),
		cmocka_unit_test(test_manager_allocate_failure_is_atomic),
		cmocka_unit_test(test_manager_full_sequence_must_fit_gates_admission),
		cmocka_unit_test(test_manager_decode_caches_filled_block_with_parent),
		cmocka_unit_test(test_manager_multi_group_chunks_and_all_or_nothing),
		cmocka_unit_test(test_manager_hybrid_block_sizes_align_to_lcm),
		cmocka_unit_test(test_manager_bad_calls_are_rejected),
		cmocka_unit_test(test_manager_lora_salt_mm_reach_hash_and_event),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
