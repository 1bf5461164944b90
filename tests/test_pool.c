/* SPDX-License-Identifier: Apache-2.0 */
/* BlockPool against vLLM: scenarios B1-B7, C1, C2, C5, C6, and the strict checks. */
#include "pool_util.h"

#include <math.h>

static void
rev(int32_t *ids, size_t n)
{
	for (size_t i = 0; i < n / 2; i++) {
		int32_t t = ids[i];
		ids[i] = ids[n - 1 - i];
		ids[n - 1 - i] = t;
	}
}

/* B1 */
static void
test_pool_b1_fresh_pool_is_in_id_order(void **state)
{
	struct kvp_pool *p = mkpool(10, 4, false);

	(void)state;
	assert_int_equal(kvp_pool_num_free(p), 9);
	assert_queue(p, 1, 2, 3, 4, 5, 6, 7, 8, 9);
	assert_true(kvp_pool_usage(p) == 0.0);
	assert_int_equal(kvp_pool_ref_cnt(p, KVP_NULL_BLOCK), 0);
	assert_pool_ok(p);
	kvp_pool_destroy(p);
}

/* B2, B3 */
static void
test_pool_b2_b3_allocate_free_reversed_and_atomic_overallocation(void **state)
{
	struct kvp_pool *p = mkpool(10, 4, false);
	int32_t a[8];

	(void)state;
	assert_ok(kvp_pool_get_new_blocks(p, 3, a));
	assert_ids(a, 3, 1, 2, 3);
	for (int i = 1; i <= 3; i++)
		assert_int_equal(kvp_pool_ref_cnt(p, i), 1);
	assert_int_equal(kvp_pool_num_free(p), 6);
	assert_true(kvp_pool_usage(p) == 1.0 - 6.0 / 9.0); /* 0.33333333333333337 */
	assert_true(kvp_pool_usage(p) == 0.33333333333333337);
	rev(a, 3);
	assert_ok(kvp_pool_free_blocks(p, a, 3));
	for (int i = 1; i <= 3; i++)
		assert_int_equal(kvp_pool_ref_cnt(p, i), 0);
	assert_queue(p, 4, 5, 6, 7, 8, 9, 3, 2, 1);
	assert_ok(kvp_pool_get_new_blocks(p, 2, a));
	assert_ids(a, 2, 4, 5);
	assert_queue(p, 6, 7, 8, 9, 3, 2, 1);
	assert_true(kvp_pool_usage(p) == 0.2222222222222222);

	/* B3: get(8) with 7 free fails and changes nothing; get(0) is []. */
	assert_status(kvp_pool_get_new_blocks(p, 8, a), KVP_ENOSPACE);
	assert_queue(p, 6, 7, 8, 9, 3, 2, 1);
	assert_ok(kvp_pool_get_new_blocks(p, 0, a));
	assert_ok(kvp_pool_get_new_blocks(p, 0, NULL));
	assert_int_equal(kvp_pool_num_free(p), 7);
	struct kvp_pool_stats st;
	kvp_pool_get_stats(p, &st);
	assert_int_equal(st.alloc_failures, 1);
	assert_int_equal(st.blocks_allocated, 5);
	assert_pool_ok(p);
	kvp_pool_destroy(p);
}

/* B3, degenerate pool */
static void
test_pool_b3_null_only_pool(void **state)
{
	struct kvp_pool *p = mkpool(1, 4, true);
	int32_t a[1];
	struct kvp_event_batch b;

	(void)state;
	assert_int_equal(kvp_pool_num_free(p), 0);
	assert_true(kvp_pool_usage(p) == 0.0);
	assert_ok(kvp_pool_reset_prefix_cache(p));
	assert_status(kvp_pool_get_new_blocks(p, 1, a), KVP_ENOSPACE);
	kvp_event_batch_init(&b);
	assert_ok(kvp_pool_take_events(p, &b));
	assert_int_equal(kvp_event_batch_count(&b), 1); /* the reset's AllBlocksCleared */
	kvp_event_batch_fini(&b);
	assert_pool_ok(p);
	kvp_pool_destroy(p);
}

/* B4 */
static void
test_pool_b4_lru_across_requests(void **state)
{
	struct kvp_pool *p = mkpool(8, 4, false);
	int32_t a[3], b[2];

	(void)state;
	assert_ok(kvp_pool_get_new_blocks(p, 3, a));
	assert_ids(a, 3, 1, 2, 3);
	assert_ok(kvp_pool_get_new_blocks(p, 2, b));
	assert_ids(b, 2, 4, 5);
	rev(b, 2);
	assert_ok(kvp_pool_free_blocks(p, b, 2));
	rev(a, 3);
	assert_ok(kvp_pool_free_blocks(p, a, 3));
	assert_queue(p, 6, 7, 5, 4, 3, 2, 1);
	kvp_pool_destroy(p);
}

/* B5 */
static void
test_pool_b5_touch_from_middle_then_free(void **state)
{
	struct kvp_pool *p = mkpool(10, 4, false);
	int32_t a[3], hit[1];
	struct req r;
	size_t klen;
	const uint8_t *key;

	(void)state;
	req_init(&r, "ABC");
	assert_ok(kvp_pool_get_new_blocks(p, 3, a));
	assert_ok(cache(p, &r, a, 3, 0, 3, 4, 0));
	rev(a, 3);
	assert_ok(kvp_pool_free_blocks(p, a, 3));
	assert_queue(p, 4, 5, 6, 7, 8, 9, 3, 2, 1);
	assert_ok(kvp_pool_get_cached_block(p, synth('B'), 32, (uint32_t[]){0}, 1, hit));
	assert_int_equal(hit[0], 2);
	assert_ok(kvp_pool_touch(p, hit, 1));
	assert_queue(p, 4, 5, 6, 7, 8, 9, 3, 1);
	assert_int_equal(kvp_pool_ref_cnt(p, 2), 1);
	assert_int_equal(kvp_pool_num_free(p), 8);
	assert_ok(kvp_pool_touch(p, hit, 1));
	assert_int_equal(kvp_pool_ref_cnt(p, 2), 2);
	assert_queue(p, 4, 5, 6, 7, 8, 9, 3, 1);
	assert_ok(kvp_pool_free_blocks(p, hit, 1));
	assert_int_equal(kvp_pool_ref_cnt(p, 2), 1);
	assert_queue(p, 4, 5, 6, 7, 8, 9, 3, 1);
	assert_ok(kvp_pool_free_blocks(p, hit, 1));
	assert_queue(p, 4, 5, 6, 7, 8, 9, 3, 1, 2);
	key = kvp_pool_block_key(p, 2, &klen);
	assert_non_null(key);
	assert_int_equal(klen, 36);
	assert_memory_equal(key, synth('B'), 32);
	assert_memory_equal(key + 32, "\0\0\0\0", 4);
	assert_pool_ok(p);
	kvp_pool_destroy(p);
}

/* B6: vLLM drifts the null block's ref count; we pin it at 0 (documented). */
static void
test_pool_b6_null_block_ref_is_pinned_and_double_free_rejected(void **state)
{
	struct kvp_pool *p = mkpool(4, 4, false);
	int32_t null2[2] = {0, 0}, b[1];

	(void)state;
	assert_ok(kvp_pool_touch(p, null2, 1));
	assert_int_equal(kvp_pool_ref_cnt(p, 0), 0);
	assert_queue(p, 1, 2, 3);
	assert_ok(kvp_pool_free_blocks(p, null2, 2));
	assert_int_equal(kvp_pool_ref_cnt(p, 0), 0);
	assert_queue(p, 1, 2, 3);

	assert_ok(kvp_pool_get_new_blocks(p, 1, b));
	assert_ok(kvp_pool_free_blocks(p, b, 1));
	assert_queue(p, 2, 3, 1);
	/* vLLM makes ref -1 silently; we refuse and change nothing. */
	assert_status(kvp_pool_free_blocks(p, b, 1), KVP_ESTATE);
	assert_int_equal(kvp_pool_ref_cnt(p, 1), 0);
	assert_queue(p, 2, 3, 1);
	assert_int_equal(kvp_pool_num_free(p), 3);
	assert_pool_ok(p);
	kvp_pool_destroy(p);
}

/* B7: caching disabled, events on: nothing is ever emitted. */
static void
test_pool_b7_caching_disabled_emits_nothing(void **state)
{
	struct kvp_pool_config cfg = {.num_blocks = 5, .hash_block_size = 4,
	                              .enable_caching = false, .enable_events = true,
	                              .semantics = KVP_VLLM_9AAF83EF5};
	struct kvp_pool *p;
	struct kvp_event_batch b;
	struct req r;
	int32_t a[2];

	(void)state;
	req_init(&r, "AB");
	assert_ok(kvp_pool_create(&cfg, &p));
	assert_ok(kvp_pool_get_new_blocks(p, 2, a));
	assert_ids(a, 2, 1, 2);
	assert_status(cache(p, &r, a, 2, 0, 2, 4, 0), KVP_ENOTSUP);
	rev(a, 2);
	assert_ok(kvp_pool_free_blocks(p, a, 2));
	assert_queue(p, 3, 4, 2, 1);
	kvp_event_batch_init(&b);
	assert_ok(kvp_pool_take_events(p, &b));
	assert_int_equal(kvp_event_batch_count(&b), 0);
	kvp_event_batch_fini(&b);
	assert_pool_ok(p);
	kvp_pool_destroy(p);
}

/* B7 second half: events off on a caching pool queue nothing. */
static void
test_pool_events_off_queue_nothing(void **state)
{
	struct kvp_pool *p = mkpool(6, 4, false);
	struct kvp_event_batch b;
	struct req r;
	int32_t a[5];

	(void)state;
	req_init(&r, "ABC");
	assert_ok(kvp_pool_get_new_blocks(p, 5, a));
	assert_ok(cache(p, &r, a, 5, 0, 3, 4, 0));
	rev(a, 5);
	assert_ok(kvp_pool_free_blocks(p, a, 5));
	assert_ok(kvp_pool_get_new_blocks(p, 5, a));
	kvp_event_batch_init(&b);
	assert_ok(kvp_pool_take_events(p, &b));
	assert_int_equal(kvp_event_batch_count(&b), 0);
	kvp_event_batch_fini(&b);
	kvp_pool_destroy(p);
}

/* C1 */
static void
test_pool_c1_lazy_eviction_one_removed_per_block(void **state)
{
	struct kvp_pool *p = mkpool(6, 4, true);
	struct kvp_event_batch b;
	struct kvp_event ev;
	struct req r;
	int32_t a[5];

	(void)state;
	req_init(&r, "ABC");
	kvp_event_batch_init(&b);
	assert_ok(kvp_pool_get_new_blocks(p, 5, a));
	assert_ids(a, 5, 1, 2, 3, 4, 5);
	assert_ok(cache(p, &r, a, 5, 0, 3, 4, 0));
	assert_ok(kvp_pool_take_events(p, &b));
	assert_int_equal(kvp_event_batch_count(&b), 1);
	assert_ok(kvp_event_batch_get(&b, 0, &ev));
	assert_int_equal(ev.type, KVP_EVENT_BLOCK_STORED);
	assert_int_equal(ev.num_hashes, 3);
	assert_int_equal(kvp_hash_event_id(ev.hashes, 32), 4702111234474983745ull);
	assert_int_equal(kvp_hash_event_id(ev.hashes + 32, 32), 4774451407313060418ull);
	assert_int_equal(kvp_hash_event_id(ev.hashes + 64, 32), 4846791580151137091ull);
	assert_null(ev.parent);
	assert_int_equal(ev.num_tokens, 12);
	for (int i = 0; i < 12; i++)
		assert_int_equal(ev.token_ids[i], i);
	assert_int_equal(ev.block_size, 4);
	assert_false(ev.has_lora_id);
	assert_string_equal(ev.medium, "GPU");
	assert_null(ev.lora_name);
	for (int i = 0; i < 3; i++) { /* [None, None, None] */
		assert_int_equal(ev.extra_key_offsets[i + 1] - ev.extra_key_offsets[i], 1);
		assert_int_equal(ev.extra_keys[ev.extra_key_offsets[i]], 0xf6);
	}
	assert_true(ev.has_group_idx);
	assert_int_equal(ev.group_idx, 0);
	assert_null(ev.spec_kind);
	assert_false(ev.has_sliding_window);

	rev(a, 5);
	assert_ok(kvp_pool_free_blocks(p, a, 5));
	assert_queue(p, 5, 4, 3, 2, 1);
	assert_ok(kvp_pool_get_new_blocks(p, 3, a));
	assert_ids(a, 3, 5, 4, 3);
	assert_ok(kvp_pool_take_events(p, &b));
	assert_int_equal(kvp_event_batch_count(&b), 1);
	assert_removed(&b, 0, 'C', 0);
	assert_queue(p, 2, 1);
	assert_int_equal(kvp_pool_num_cached_keys(p), 2);
	assert_ok(kvp_pool_get_new_blocks(p, 2, a));
	assert_ids(a, 2, 2, 1);
	assert_ok(kvp_pool_take_events(p, &b));
	assert_int_equal(kvp_event_batch_count(&b), 2);
	assert_removed(&b, 0, 'B', 0);
	assert_removed(&b, 1, 'A', 0);
	assert_int_equal(kvp_pool_num_cached_keys(p), 0);
	assert_pool_ok(p);
	kvp_event_batch_fini(&b);
	kvp_pool_destroy(p);
}

/* C2 */
static void
test_pool_c2_duplicate_hashes_are_not_deduplicated(void **state)
{
	struct kvp_pool *p = mkpool(10, 4, true);
	struct kvp_event_batch b;
	struct kvp_event ev;
	struct req r;
	int32_t a[7], hit[1];
	const uint32_t g0[] = {0};

	(void)state;
	req_init(&r, "D");
	kvp_event_batch_init(&b);
	assert_ok(kvp_pool_get_new_blocks(p, 2, a));
	assert_ids(a, 2, 1, 2);
	assert_ok(cache(p, &r, &a[0], 1, 0, 1, 4, 0));
	assert_ok(cache(p, &r, &a[1], 1, 0, 1, 4, 0));
	assert_int_equal(kvp_pool_num_cached_keys(p), 1);
	assert_int_equal(kvp_pool_num_cached_blocks(p), 2);
	assert_ok(kvp_pool_get_cached_block(p, synth('D'), 32, g0, 1, hit));
	assert_int_equal(hit[0], 1);
	assert_ok(kvp_pool_take_events(p, &b));
	assert_int_equal(kvp_event_batch_count(&b), 2);
	for (size_t i = 0; i < 2; i++) {
		assert_ok(kvp_event_batch_get(&b, i, &ev));
		assert_int_equal(ev.type, KVP_EVENT_BLOCK_STORED);
		assert_int_equal(ev.num_hashes, 1);
		assert_int_equal(kvp_hash_event_id(ev.hashes, 32), 4919131752989213764ull);
		assert_int_equal(ev.num_tokens, 4);
	}
	rev(a, 2);
	assert_ok(kvp_pool_free_blocks(p, a, 2));
	assert_queue(p, 3, 4, 5, 6, 7, 8, 9, 2, 1);
	assert_ok(kvp_pool_get_new_blocks(p, 7, a));
	assert_ids(a, 7, 3, 4, 5, 6, 7, 8, 9);
	assert_ok(kvp_pool_take_events(p, &b));
	assert_int_equal(kvp_event_batch_count(&b), 0);
	assert_ok(kvp_pool_get_new_blocks(p, 1, a));
	assert_ids(a, 1, 2);
	assert_ok(kvp_pool_take_events(p, &b));
	assert_int_equal(kvp_event_batch_count(&b), 1);
	assert_removed(&b, 0, 'D', 0);
	assert_ok(kvp_pool_get_cached_block(p, synth('D'), 32, g0, 1, hit));
	assert_int_equal(hit[0], 1);
	assert_ok(kvp_pool_get_new_blocks(p, 1, a));
	assert_ids(a, 1, 1);
	assert_ok(kvp_pool_take_events(p, &b));
	assert_removed(&b, 0, 'D', 0);
	assert_status(kvp_pool_get_cached_block(p, synth('D'), 32, g0, 1, hit), KVP_ENOTFOUND);
	assert_int_equal(kvp_pool_num_cached_keys(p), 0);
	assert_pool_ok(p);
	kvp_event_batch_fini(&b);
	kvp_pool_destroy(p);
}

/* C5 */
static void
test_pool_c5_evict_blocks_only_unhashes(void **state)
{
	struct kvp_pool *p = mkpool(10, 4, true);
	struct kvp_event_batch b;
	struct req r;
	int32_t a[9];
	size_t klen;

	(void)state;
	req_init(&r, "ABC");
	kvp_event_batch_init(&b);
	assert_ok(kvp_pool_get_new_blocks(p, 4, a));
	assert_ids(a, 4, 1, 2, 3, 4);
	assert_ok(cache(p, &r, a, 4, 0, 3, 4, 0));
	assert_ok(kvp_pool_take_events(p, &b));
	assert_ok(kvp_pool_free_blocks(p, (int32_t[]){1, 2}, 2));
	assert_queue(p, 5, 6, 7, 8, 9, 1, 2);
	assert_ok(kvp_pool_evict_blocks(p, (int32_t[]){4, 3, 2, 0, 3}, 5));
	assert_ok(kvp_pool_take_events(p, &b));
	assert_int_equal(kvp_event_batch_count(&b), 2);
	assert_removed(&b, 0, 'C', 0); /* in the order given, as vLLM iterates its set */
	assert_removed(&b, 1, 'B', 0);
	assert_non_null(kvp_pool_block_key(p, 1, &klen));
	assert_null(kvp_pool_block_key(p, 2, &klen));
	assert_null(kvp_pool_block_key(p, 3, &klen));
	assert_null(kvp_pool_block_key(p, 4, &klen));
	assert_queue(p, 5, 6, 7, 8, 9, 1, 2);
	assert_int_equal(kvp_pool_ref_cnt(p, 1), 0);
	assert_int_equal(kvp_pool_ref_cnt(p, 2), 0);
	assert_int_equal(kvp_pool_ref_cnt(p, 3), 1);
	assert_int_equal(kvp_pool_ref_cnt(p, 4), 1);
	assert_int_equal(kvp_pool_num_cached_keys(p), 1);
	/* vLLM asserts on id 10; we refuse the whole call before any change. */
	assert_status(kvp_pool_evict_blocks(p, (int32_t[]){1, 10}, 2), KVP_ERANGE);
	assert_non_null(kvp_pool_block_key(p, 1, &klen));
	assert_ok(kvp_pool_take_events(p, &b));
	assert_int_equal(kvp_event_batch_count(&b), 0);
	assert_ok(kvp_pool_free_blocks(p, (int32_t[]){4, 3}, 2));
	assert_queue(p, 5, 6, 7, 8, 9, 1, 2, 4, 3);
	assert_ok(kvp_pool_get_new_blocks(p, 9, a));
	assert_ids(a, 9, 5, 6, 7, 8, 9, 1, 2, 4, 3);
	assert_ok(kvp_pool_take_events(p, &b));
	assert_int_equal(kvp_event_batch_count(&b), 1);
	assert_removed(&b, 0, 'A', 0);
	assert_pool_ok(p);
	kvp_event_batch_fini(&b);
	kvp_pool_destroy(p);
}

/* C6 */
static void
test_pool_c6_reset_fails_while_in_use_then_clears_keeping_order(void **state)
{
	struct kvp_pool *p = mkpool(10, 4, true);
	struct kvp_event_batch b;
	struct kvp_event ev;
	struct req r;
	int32_t a[3];
	size_t klen;

	(void)state;
	req_init(&r, "ABC");
	kvp_event_batch_init(&b);
	assert_ok(kvp_pool_get_new_blocks(p, 3, a));
	assert_ok(cache(p, &r, a, 3, 0, 3, 4, 0));
	assert_ok(kvp_pool_take_events(p, &b));
	assert_status(kvp_pool_reset_prefix_cache(p), KVP_ESTATE);
	assert_int_equal(kvp_pool_num_cached_keys(p), 3);
	assert_ok(kvp_pool_take_events(p, &b));
	assert_int_equal(kvp_event_batch_count(&b), 0);
	rev(a, 3);
	assert_ok(kvp_pool_free_blocks(p, a, 3));
	assert_queue(p, 4, 5, 6, 7, 8, 9, 3, 2, 1);
	assert_ok(kvp_pool_reset_prefix_cache(p));
	assert_int_equal(kvp_pool_num_cached_keys(p), 0);
	assert_ok(kvp_pool_take_events(p, &b));
	assert_int_equal(kvp_event_batch_count(&b), 1);
	assert_ok(kvp_event_batch_get(&b, 0, &ev));
	assert_int_equal(ev.type, KVP_EVENT_ALL_CLEARED);
	for (int i = 0; i < 10; i++)
		assert_null(kvp_pool_block_key(p, i, &klen));
	assert_queue(p, 4, 5, 6, 7, 8, 9, 3, 2, 1);
	assert_pool_ok(p);
	kvp_event_batch_fini(&b);
	kvp_pool_destroy(p);
}

/* Stored events: parent chain, mask, null skip, token range (spec 4.2). */
static void
test_pool_cache_chunked_parent_mask_and_null_skip(void **state)
{
	struct kvp_pool *p = mkpool(10, 4, true);
	struct kvp_event_batch b;
	struct kvp_event ev;
	struct req r;
	int32_t a[3], blocks[4];
	const bool mask[] = {true, false};

	(void)state;
	req_init(&r, "ABCD");
	kvp_event_batch_init(&b);
	assert_ok(kvp_pool_get_new_blocks(p, 3, a));
	blocks[0] = a[0];
	blocks[1] = KVP_NULL_BLOCK;
	blocks[2] = a[1];
	blocks[3] = a[2];
	/* [0, 2): block 0 stored, the null block skipped; tokens of both. */
	assert_ok(cache(p, &r, blocks, 4, 0, 2, 4, 3));
	/* [2, 4) with mask [T, F]: parent = hash[1] although block 1 is null. */
	struct kvp_cache_args ca = {
		.block_hashes = r.hashes, .num_block_hashes = r.n, .token_ids = r.tokens,
		.num_tokens = 14, /* clamps the range [8, 16) to [8, 14) */
		.num_cached_blocks = 2, .num_full_blocks = 4, .block_size = 4,
		.group_id = 3, .block_mask = mask,
	};
	assert_ok(kvp_pool_cache_full_blocks(p, blocks, 4, &ca));
	assert_ok(kvp_pool_take_events(p, &b));
	assert_int_equal(kvp_event_batch_count(&b), 2);
	assert_ok(kvp_event_batch_get(&b, 0, &ev));
	assert_int_equal(ev.num_hashes, 1);
	assert_memory_equal(ev.hashes, synth('A'), 32);
	assert_null(ev.parent);
	assert_int_equal(ev.num_tokens, 8);
	assert_int_equal(ev.group_idx, 3);
	assert_ok(kvp_event_batch_get(&b, 1, &ev));
	assert_int_equal(ev.num_hashes, 1);
	assert_memory_equal(ev.hashes, synth('C'), 32);
	assert_non_null(ev.parent);
	assert_memory_equal(ev.parent, synth('B'), 32);
	assert_int_equal(ev.num_tokens, 6);
	assert_int_equal(ev.token_ids[0], 8);
	/* A window of the tokens that starts at first_token gives the same range. */
	assert_ok(kvp_pool_free_blocks(p, &a[2], 1));
	assert_ok(kvp_pool_touch(p, &a[2], 1));
	struct kvp_cache_args win = ca;
	win.token_ids = r.tokens + 12;
	win.num_tokens = 4;
	win.first_token = 12;
	win.num_cached_blocks = 3;
	win.block_mask = NULL;
	assert_ok(kvp_pool_cache_full_blocks(p, blocks, 4, &win));
	assert_ok(kvp_pool_take_events(p, &b));
	assert_int_equal(kvp_event_batch_count(&b), 1);
	assert_ok(kvp_event_batch_get(&b, 0, &ev));
	assert_int_equal(ev.num_hashes, 1);
	assert_int_equal(ev.num_tokens, 4);
	assert_int_equal(ev.token_ids[0], 12);
	assert_memory_equal(ev.parent, synth('C'), 32);
	assert_int_equal(kvp_pool_num_cached_blocks(p), 3);
	assert_non_null(kvp_pool_block_key(p, a[2], &(size_t){0}));

	/* All blocks skipped: still exactly one (empty) Stored event. */
	assert_ok(cache(p, &r, (int32_t[]){0, 0}, 2, 0, 2, 4, 0));
	assert_ok(kvp_pool_take_events(p, &b));
	assert_int_equal(kvp_event_batch_count(&b), 1);
	assert_ok(kvp_event_batch_get(&b, 0, &ev));
	assert_int_equal(ev.num_hashes, 0);
	assert_int_equal(ev.num_tokens, 8);
	/* num_cached >= num_full: no change, no event. */
	assert_ok(cache(p, &r, a, 3, 2, 2, 4, 0));
	assert_ok(kvp_pool_take_events(p, &b));
	assert_int_equal(kvp_event_batch_count(&b), 0);
	assert_pool_ok(p);
	kvp_event_batch_fini(&b);
	kvp_pool_destroy(p);
}

/* Coarse blocks at 9aaf83ef5 (spec 5.6, H7): key = two fine hashes || group. */
static void
test_pool_9aaf83ef5_coarse_block_concatenates_fine_hashes(void **state)
{
	struct kvp_pool_config cfg = {.num_blocks = 4, .hash_block_size = 4, .max_hash_len = 64,
	                              .enable_caching = true, .enable_events = true,
	                              .semantics = KVP_VLLM_9AAF83EF5};
	struct kvp_pool *p;
	struct kvp_event_batch b;
	struct kvp_event ev;
	struct req r;
	int32_t a[2], hit[1];
	uint8_t want[68];
	const uint8_t *key;
	size_t klen;

	(void)state;
	req_init(&r, "ABCD");
	kvp_event_batch_init(&b);
	assert_ok(kvp_pool_create(&cfg, &p));
	assert_ok(kvp_pool_get_new_blocks(p, 2, a));
	assert_status(cache(p, &r, a, 2, 0, 2, 6, 1), KVP_EINVAL); /* 6 % 4 != 0 */
	assert_status(cache(p, &r, a, 2, 0, 2, 12, 1), KVP_EINVAL); /* 96 B > 64 */
	assert_ok(cache(p, &r, a, 2, 0, 2, 8, 1));
	key = kvp_pool_block_key(p, a[1], &klen);
	memcpy(want, synth('C'), 32);
	memcpy(want + 32, synth('D'), 32);
	memcpy(want + 64, "\0\0\0\1", 4);
	assert_int_equal(klen, 68);
	assert_memory_equal(key, want, 68);
	assert_ok(kvp_pool_get_cached_block(p, want, 64, (uint32_t[]){1}, 1, hit));
	assert_int_equal(hit[0], a[1]);
	assert_status(kvp_pool_get_cached_block(p, want, 64, (uint32_t[]){0}, 1, hit),
	              KVP_ENOTFOUND);
	assert_ok(kvp_pool_take_events(p, &b));
	assert_ok(kvp_event_batch_get(&b, 0, &ev));
	assert_int_equal(ev.hash_len, 64);
	assert_int_equal(ev.num_hashes, 2);
	assert_int_equal(ev.block_size, 8);
	assert_int_equal(ev.num_tokens, 16);
	assert_int_equal(kvp_hash_event_id(ev.hashes + 64, 64), kvp_hash_event_id(synth('D'), 32));
	/* Chunked: the parent is the previous coarse hash. */
	assert_ok(kvp_pool_free_blocks(p, a, 2));
	assert_ok(kvp_pool_reset_prefix_cache(p));
	assert_ok(kvp_pool_touch(p, a, 2));
	assert_ok(cache(p, &r, a, 2, 1, 2, 8, 1));
	assert_ok(kvp_pool_take_events(p, &b));
	assert_ok(kvp_event_batch_get(&b, 1, &ev));
	assert_non_null(ev.parent);
	assert_memory_equal(ev.parent, r.hashes, 64);
	assert_pool_ok(p);
	kvp_event_batch_fini(&b);
	kvp_pool_destroy(p);
}

/*
 * vLLM 0.33 (#42656): a freed block with no hash goes to the queue's head,
 * to be reused first. vLLM's test_prefill frees a request of five blocks
 * whose first three are cached, in reverse, and ends with this queue.
 */
static void
test_pool_v033_free_puts_unhashed_blocks_first(void **state)
{
	struct kvp_pool *p = mkpool_sem(11, 4, true, KVP_VLLM_0_33);
	struct req r;
	int32_t a[5];

	(void)state;
	req_init(&r, "ABC");
	assert_ok(kvp_pool_get_new_blocks(p, 5, a));
	assert_ids(a, 5, 1, 2, 3, 4, 5);
	assert_ok(cache(p, &r, a, 5, 0, 3, 4, 0));
	rev(a, 5);
	assert_ok(kvp_pool_free_blocks(p, a, 5));
	assert_queue(p, 5, 4, 6, 7, 8, 9, 10, 3, 2, 1);
	/* The next allocation takes the unhashed ones; no hash is evicted. */
	assert_ok(kvp_pool_get_new_blocks(p, 2, a));
	assert_ids(a, 2, 5, 4);
	assert_int_equal(kvp_pool_num_cached_blocks(p), 3);
	/* Freed into an empty queue too: the unhashed first, then the hashed. */
	int32_t all[8];
	assert_ok(kvp_pool_get_new_blocks(p, 8, all));
	assert_int_equal(kvp_pool_num_free(p), 0);
	int32_t back[] = {3, 6, 2, 7}, cached[] = {6, 2};
	assert_ok(cache(p, &r, cached, 2, 0, 2, 4, 0)); /* 3's hash went when it was taken */
	assert_ok(kvp_pool_free_blocks(p, back, 4));
	assert_queue(p, 3, 7, 6, 2);
	assert_pool_ok(p);
	kvp_pool_destroy(p);
}

/* vLLM 0.33 with caching off: every freed block is reused first (LIFO). */
static void
test_pool_v033_caching_off_free_is_lifo(void **state)
{
	struct kvp_pool_config cfg = {.num_blocks = 5, .hash_block_size = 4};
	struct kvp_pool *p;
	int32_t a[2];

	(void)state;
	assert_ok(kvp_pool_create(&cfg, &p));
	assert_ok(kvp_pool_get_new_blocks(p, 2, a));
	rev(a, 2);
	assert_ok(kvp_pool_free_blocks(p, a, 2));
	assert_queue(p, 2, 1, 3, 4);
	assert_pool_ok(p);
	kvp_pool_destroy(p);
}

/*
 * vLLM 0.33 (#45939): a coarse block is keyed by its last fine hash, which
 * chains over the whole prefix; its events carry those hashes. No
 * max_hash_len is needed for any block size.
 */
static void
test_pool_v033_coarse_block_keyed_by_last_fine_hash(void **state)
{
	struct kvp_pool *p = mkpool_sem(6, 4, true, KVP_VLLM_0_33);
	struct kvp_event_batch b;
	struct kvp_event ev;
	struct req r;
	int32_t a[2], c[1], hit[1];
	uint8_t want[36];
	const uint8_t *key;
	size_t klen;

	(void)state;
	req_init(&r, "ABCDEF");
	kvp_event_batch_init(&b);
	assert_ok(kvp_pool_get_new_blocks(p, 2, a));
	assert_ok(cache(p, &r, a, 2, 0, 1, 8, 1));
	assert_ok(cache(p, &r, a, 2, 1, 2, 8, 1));
	key = kvp_pool_block_key(p, a[1], &klen);
	memcpy(want, synth('D'), 32);
	memcpy(want + 32, "\0\0\0\1", 4);
	assert_int_equal(klen, 36);
	assert_memory_equal(key, want, 36);
	assert_ok(kvp_pool_get_cached_block(p, synth('D'), 32, (uint32_t[]){1}, 1, hit));
	assert_int_equal(hit[0], a[1]);
	assert_ok(kvp_pool_get_cached_block(p, synth('B'), 32, (uint32_t[]){1}, 1, hit));
	assert_int_equal(hit[0], a[0]);
	assert_status(kvp_pool_get_cached_block(p, synth('C'), 32, (uint32_t[]){1}, 1, hit),
	              KVP_ENOTFOUND);
	assert_ok(kvp_pool_take_events(p, &b));
	assert_int_equal(kvp_event_batch_count(&b), 2);
	assert_ok(kvp_event_batch_get(&b, 1, &ev));
	assert_int_equal(ev.hash_len, 32);
	assert_int_equal(ev.num_hashes, 1);
	assert_memory_equal(ev.hashes, synth('D'), 32);
	assert_non_null(ev.parent);
	assert_memory_equal(ev.parent, synth('B'), 32);
	assert_int_equal(ev.num_tokens, 8);
	/* Three hash blocks a block, with no max_hash_len: keyed by the third. */
	assert_ok(kvp_pool_get_new_blocks(p, 1, c));
	assert_ok(cache(p, &r, c, 1, 0, 1, 12, 0));
	key = kvp_pool_block_key(p, c[0], &klen);
	assert_int_equal(klen, 36);
	assert_memory_equal(key, synth('C'), 32);
	size_t hl;
	assert_ptr_equal(kvp_pool_coarse_hash(p, r.hashes, 3, 1, &hl), r.hashes + 5 * 32);
	assert_int_equal(hl, 32);
	assert_int_equal(kvp_pool_semantics(p), KVP_VLLM_0_33);
	assert_pool_ok(p);
	kvp_event_batch_fini(&b);
	kvp_pool_destroy(p);
}

/* Names of the semantics parse back; anything else is refused. */
static void
test_pool_semantics_names_round_trip_and_bad_ones_are_refused(void **state)
{
	enum kvp_vllm_semantics s = KVP_VLLM_9AAF83EF5;
	struct kvp_pool_config cfg = {.num_blocks = 4, .hash_block_size = 4,
	                              .semantics = (enum kvp_vllm_semantics)7};
	struct kvp_pool *p = NULL;

	(void)state;
	assert_ok(kvp_vllm_semantics_parse("0.33", &s));
	assert_int_equal(s, KVP_VLLM_0_33);
	assert_ok(kvp_vllm_semantics_parse("9aaf83ef5", &s));
	assert_int_equal(s, KVP_VLLM_9AAF83EF5);
	assert_status(kvp_vllm_semantics_parse("0.32", &s), KVP_EINVAL);
	assert_status(kvp_vllm_semantics_parse(NULL, &s), KVP_EINVAL);
	assert_int_equal(s, KVP_VLLM_9AAF83EF5);
	assert_null(kvp_vllm_semantics_name((enum kvp_vllm_semantics)7));
	assert_status(kvp_pool_create(&cfg, &p), KVP_EINVAL);
	assert_null(p);
}

/* Multi-group lookup is all or nothing (spec 4.1). */
static void
test_pool_get_cached_block_multi_group_all_or_nothing(void **state)
{
	struct kvp_pool *p = mkpool(10, 4, false);
	struct req r;
	int32_t a[2], hit[3] = {-7, -7, -7};

	(void)state;
	req_init(&r, "A");
	assert_ok(kvp_pool_get_new_blocks(p, 2, a));
	assert_ok(cache(p, &r, &a[0], 1, 0, 1, 4, 0));
	assert_ok(cache(p, &r, &a[1], 1, 0, 1, 4, 2));
	assert_status(kvp_pool_get_cached_block(p, synth('A'), 32, (uint32_t[]){0, 1, 2}, 3, hit),
	              KVP_ENOTFOUND);
	assert_ids(hit, 3, -7, -7, -7);
	assert_ok(kvp_pool_get_cached_block(p, synth('A'), 32, (uint32_t[]){2, 0}, 2, hit));
	assert_ids(hit, 2, a[1], a[0]);
	assert_status(kvp_pool_get_cached_block(p, synth('A'), 0, (uint32_t[]){0}, 1, hit),
	              KVP_EINVAL);
	assert_status(kvp_pool_get_cached_block(p, synth('A'), 33, (uint32_t[]){0}, 1, hit),
	              KVP_EINVAL);
	kvp_pool_destroy(p);
}

/* Strictness: every rejected call leaves the pool exactly as it was. */
static void
test_pool_misuse_is_rejected_and_changes_nothing(void **state)
{
	struct kvp_pool *p = mkpool(8, 4, true);
	struct kvp_event_batch b;
	struct req r;
	int32_t a[3];

	(void)state;
	req_init(&r, "ABC");
	kvp_event_batch_init(&b);
	assert_ok(kvp_pool_get_new_blocks(p, 3, a)); /* 1 2 3 */
	assert_ok(cache(p, &r, a, 3, 0, 1, 4, 0));
	assert_ok(kvp_pool_take_events(p, &b));

	/* free: out of range, duplicate, ref 0 (the valid prefix must not apply) */
	assert_status(kvp_pool_free_blocks(p, (int32_t[]){1, 8}, 2), KVP_ERANGE);
	assert_status(kvp_pool_free_blocks(p, (int32_t[]){1, -1}, 2), KVP_ERANGE);
	assert_status(kvp_pool_free_blocks(p, (int32_t[]){2, 1, 2}, 3), KVP_EINVAL);
	assert_status(kvp_pool_free_blocks(p, (int32_t[]){1, 4}, 2), KVP_ESTATE);
	assert_status(kvp_pool_free_blocks(p, NULL, 1), KVP_EINVAL);
	assert_int_equal(kvp_pool_ref_cnt(p, 1), 1);
	assert_int_equal(kvp_pool_ref_cnt(p, 2), 1);
	assert_queue(p, 4, 5, 6, 7);
	/* touch: out of range anywhere in the list */
	assert_status(kvp_pool_touch(p, (int32_t[]){4, 99}, 2), KVP_ERANGE);
	assert_queue(p, 4, 5, 6, 7);
	/* cache: already hashed, named twice, ref 0, range, short hash list */
	assert_status(cache(p, &r, a, 3, 0, 2, 4, 0), KVP_ESTATE);
	assert_status(cache(p, &r, (int32_t[]){2, 2}, 2, 0, 2, 4, 0), KVP_EINVAL);
	assert_status(cache(p, &r, (int32_t[]){4}, 1, 0, 1, 4, 0), KVP_ESTATE);
	assert_status(cache(p, &r, (int32_t[]){9}, 1, 0, 1, 4, 0), KVP_ERANGE);
	assert_status(cache(p, &r, a, 3, 0, 4, 4, 0), KVP_EINVAL);
	assert_status(cache(p, &r, a, 2, 0, 3, 4, 0), KVP_EINVAL);
	assert_int_equal(kvp_pool_num_cached_blocks(p), 1);
	/* evict: range */
	assert_status(kvp_pool_evict_blocks(p, (int32_t[]){1, 8}, 2), KVP_ERANGE);
	assert_int_equal(kvp_pool_num_cached_blocks(p), 1);
	/* reset while in use */
	assert_status(kvp_pool_reset_prefix_cache(p), KVP_ESTATE);
	assert_int_equal(kvp_pool_num_cached_blocks(p), 1);
	assert_ok(kvp_pool_take_events(p, &b));
	assert_int_equal(kvp_event_batch_count(&b), 0);
	assert_pool_ok(p);

	/* Config errors. */
	struct kvp_pool *q = NULL;
	struct kvp_pool_config bad = {.num_blocks = 0, .hash_block_size = 4};
	assert_status(kvp_pool_create(&bad, &q), KVP_EINVAL);
	bad.num_blocks = 4;
	bad.hash_block_size = 0;
	assert_status(kvp_pool_create(&bad, &q), KVP_EINVAL);
	bad.hash_block_size = 4;
	bad.max_hash_len = 33;
	assert_status(kvp_pool_create(&bad, &q), KVP_EINVAL);
	bad.hash_len = 16; /* xxhash: 16-byte fine hashes, coarse keys of up to 32 of them */
	bad.max_hash_len = 24;
	assert_status(kvp_pool_create(&bad, &q), KVP_EINVAL);
	bad.max_hash_len = 33 * 16;
	assert_status(kvp_pool_create(&bad, &q), KVP_EINVAL);
	bad.hash_len = 24;
	bad.max_hash_len = 0;
	assert_status(kvp_pool_create(&bad, &q), KVP_EINVAL);
	assert_null(q);
	bad.hash_len = 16;
	bad.max_hash_len = 32 * 16;
	assert_ok(kvp_pool_create(&bad, &q));
	assert_int_equal(kvp_pool_hash_len(q), 16);
	kvp_pool_destroy(q);
	q = NULL;
	assert_status(kvp_pool_create(NULL, &q), KVP_EINVAL);
	kvp_pool_destroy(NULL);
	kvp_event_batch_fini(&b);
	kvp_pool_destroy(p);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_pool_b1_fresh_pool_is_in_id_order),
		cmocka_unit_test(test_pool_b2_b3_allocate_free_reversed_and_atomic_overallocation),
		cmocka_unit_test(test_pool_b3_null_only_pool),
		cmocka_unit_test(test_pool_b4_lru_across_requests),
		cmocka_unit_test(test_pool_b5_touch_from_middle_then_free),
		cmocka_unit_test(test_pool_b6_null_block_ref_is_pinned_and_double_free_rejected),
		cmocka_unit_test(test_pool_b7_caching_disabled_emits_nothing),
		cmocka_unit_test(test_pool_events_off_queue_nothing),
		cmocka_unit_test(test_pool_c1_lazy_eviction_one_removed_per_block),
		cmocka_unit_test(test_pool_c2_duplicate_hashes_are_not_deduplicated),
		cmocka_unit_test(test_pool_c5_evict_blocks_only_unhashes),
		cmocka_unit_test(test_pool_c6_reset_fails_while_in_use_then_clears_keeping_order),
		cmocka_unit_test(test_pool_cache_chunked_parent_mask_and_null_skip),
		cmocka_unit_test(test_pool_9aaf83ef5_coarse_block_concatenates_fine_hashes),
		cmocka_unit_test(test_pool_v033_free_puts_unhashed_blocks_first),
		cmocka_unit_test(test_pool_v033_caching_off_free_is_lifo),
		cmocka_unit_test(test_pool_v033_coarse_block_keyed_by_last_fine_hash),
		cmocka_unit_test(test_pool_semantics_names_round_trip_and_bad_ones_are_refused),
		cmocka_unit_test(test_pool_get_cached_block_multi_group_all_or_nothing),
		cmocka_unit_test(test_pool_misuse_is_rejected_and_changes_nothing),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
