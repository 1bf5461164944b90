/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vLLM 0.33's partial prefix-cache entries in the engine (pool.h, "Partial
 * entries"): cache_partial_block as a primary and as an extra key, promotion
 * by cache_full_blocks, replacement, eviction and reset of every key, the
 * move of a block's keys, the bound on extra keys, and refusals that change
 * nothing. vLLM's own tests of the same calls run against kvpoold in
 * test_vllm_own_tests (tests/v1/core/prefix_cache/).
 */
#include "pool_util.h"

#define HBS 4
#define KL (KVP_HASH_LEN + 4)

/* The block cached under hash X, group g, or -1. */
static int32_t
hit(struct kvp_pool *p, char c, uint32_t g)
{
	int32_t id = -1;
	return kvp_pool_get_cached_block(p, synth(c), KVP_HASH_LEN, &g, 1, &id) == KVP_OK ? id : -1;
}

static int
partial(struct kvp_pool *p, const struct req *r, int32_t id, uint32_t ntok, uint32_t bs,
        bool replace, bool *stored)
{
	struct kvp_cache_args a = {
		.block_hashes = r->hashes, .num_block_hashes = r->n,
		.token_ids = r->tokens, .num_tokens = 256, .block_size = bs,
	};
	return kvp_pool_cache_partial_block(p, id, ntok, replace, &a, stored);
}

/* Takes the queued events into ev and returns how many. */
static size_t
take(struct kvp_pool *p, struct kvp_event_batch *ev)
{
	assert_ok(kvp_pool_take_events(p, ev));
	return kvp_event_batch_count(ev);
}

static void
assert_event(const struct kvp_event_batch *ev, size_t i, enum kvp_event_type t, char hash)
{
	struct kvp_event e;
	assert_ok(kvp_event_batch_get(ev, i, &e));
	assert_int_equal(e.type, t);
	assert_int_equal(e.num_hashes, 1);
	assert_memory_equal(e.hashes, synth(hash), KVP_HASH_LEN);
}

/* An unhashed block takes the partial key as its primary; the event is vLLM's shape. */
static void
test_partial_becomes_primary(void **state)
{
	(void)state;
	struct kvp_pool *p = mkpool_sem(8, HBS, true, KVP_VLLM_0_33);
	struct kvp_event_batch ev;
	struct kvp_event e;
	struct req r;
	int32_t id;
	bool stored = false;

	kvp_event_batch_init(&ev);
	req_init(&r, "ABCD");
	assert_ok(kvp_pool_get_new_blocks(p, 1, &id));
	/* a 16-token block (4 hash blocks) reachable at 12 tokens: the key is C */
	assert_ok(partial(p, &r, id, 12, 4 * HBS, false, &stored));
	assert_true(stored);
	assert_int_equal(hit(p, 'C', 0), id);
	assert_int_equal(kvp_pool_block_hash_tokens(p, id), 12);
	assert_int_equal(kvp_pool_num_partial_keys(p), 0);
	assert_int_equal(take(p, &ev), 1);
	assert_ok(kvp_event_batch_get(&ev, 0, &e));
	assert_int_equal(e.type, KVP_EVENT_BLOCK_STORED);
	assert_memory_equal(e.hashes, synth('C'), KVP_HASH_LEN);
	assert_non_null(e.parent);
	assert_memory_equal(e.parent, synth('B'), KVP_HASH_LEN);
	assert_int_equal(e.block_size, HBS);
	assert_int_equal(e.num_tokens, HBS);
	assert_int_equal(e.token_ids[0], 8); /* tokens [8, 12) */
	/* again: already under the key, nothing new */
	assert_ok(partial(p, &r, id, 12, 4 * HBS, false, &stored));
	assert_false(stored);
	assert_int_equal(take(p, &ev), 0);
	check(p);
	kvp_event_batch_fini(&ev);
	kvp_pool_destroy(p);
}

/* A hashed block covering more tokens gets an extra key; eviction drops both keys. */
static void
test_extra_key_and_eviction(void **state)
{
	(void)state;
	struct kvp_pool *p = mkpool_sem(3, HBS, true, KVP_VLLM_0_33);
	struct kvp_event_batch ev;
	struct req r;
	int32_t id, other[2];
	bool stored;

	kvp_event_batch_init(&ev);
	req_init(&r, "ABCD");
	assert_ok(kvp_pool_get_new_blocks(p, 1, &id));
	/* one 16-token block: keyed by its last fine hash, D */
	assert_ok(cache(p, &r, &id, 1, 0, 1, 4 * HBS, 0));
	assert_int_equal(kvp_pool_block_hash_tokens(p, id), 16);
	assert_ok(partial(p, &r, id, 8, 4 * HBS, false, &stored));
	assert_true(stored);
	assert_int_equal(hit(p, 'D', 0), id);
	assert_int_equal(hit(p, 'B', 0), id);
	assert_int_equal(kvp_pool_num_cached_keys(p), 2);
	assert_int_equal(kvp_pool_num_partial_keys(p), 1);
	size_t len;
	assert_non_null(kvp_pool_block_key_at(p, id, 1, &len));
	assert_null(kvp_pool_block_key_at(p, id, 2, &len));
	check(p);
	(void)take(p, &ev);
	/* freed, then reused: both keys go, primary first */
	assert_ok(kvp_pool_free_blocks(p, &id, 1));
	assert_ok(kvp_pool_get_new_blocks(p, 2, other));
	assert_int_equal(take(p, &ev), 2);
	assert_event(&ev, 0, KVP_EVENT_BLOCK_REMOVED, 'D');
	assert_event(&ev, 1, KVP_EVENT_BLOCK_REMOVED, 'B');
	assert_int_equal(hit(p, 'B', 0), -1);
	assert_int_equal(kvp_pool_num_cached_keys(p), 0);
	assert_int_equal(kvp_pool_num_partial_keys(p), 0);
	check(p);
	kvp_event_batch_fini(&ev);
	kvp_pool_destroy(p);
}

/* cache_full_blocks promotes a partial primary: its keys go, the full key comes in. */
static void
test_promotion_by_cache_full_blocks(void **state)
{
	(void)state;
	struct kvp_pool *p = mkpool_sem(4, HBS, true, KVP_VLLM_0_33);
	struct kvp_event_batch ev;
	struct req r;
	int32_t id;

	kvp_event_batch_init(&ev);
	req_init(&r, "ABCD");
	assert_ok(kvp_pool_get_new_blocks(p, 1, &id));
	assert_ok(partial(p, &r, id, 8, 4 * HBS, false, NULL));
	(void)take(p, &ev);
	assert_ok(cache(p, &r, &id, 1, 0, 1, 4 * HBS, 0));
	assert_int_equal(take(p, &ev), 2);
	assert_event(&ev, 0, KVP_EVENT_BLOCK_REMOVED, 'B');
	assert_ok(kvp_event_batch_get(&ev, 1, &(struct kvp_event){0}));
	assert_int_equal(hit(p, 'B', 0), -1);
	assert_int_equal(hit(p, 'D', 0), id);
	assert_int_equal(kvp_pool_block_hash_tokens(p, id), 16);
	/* a full block cannot be cached again */
	assert_int_equal(cache(p, &r, &id, 1, 0, 1, 4 * HBS, 0), KVP_ESTATE);
	check(p);
	kvp_event_batch_fini(&ev);
	kvp_pool_destroy(p);
}

/* replace drops every key (events) before the new one; a longer partial replaces a shorter one. */
static void
test_replace_and_longer_partial(void **state)
{
	(void)state;
	struct kvp_pool *p = mkpool_sem(4, HBS, true, KVP_VLLM_0_33);
	struct kvp_event_batch ev;
	struct req r;
	int32_t id;
	bool stored;

	kvp_event_batch_init(&ev);
	req_init(&r, "ABCD");
	assert_ok(kvp_pool_get_new_blocks(p, 1, &id));
	assert_ok(partial(p, &r, id, 4, 4 * HBS, false, NULL));
	(void)take(p, &ev);
	/* a longer boundary: the block's content now reaches further, A goes */
	assert_ok(partial(p, &r, id, 12, 4 * HBS, false, &stored));
	assert_true(stored);
	assert_int_equal(take(p, &ev), 2);
	assert_event(&ev, 0, KVP_EVENT_BLOCK_REMOVED, 'A');
	assert_int_equal(hit(p, 'A', 0), -1);
	assert_int_equal(hit(p, 'C', 0), id);
	/* replace, same key: removed and stored again */
	assert_ok(partial(p, &r, id, 12, 4 * HBS, true, &stored));
	assert_true(stored);
	assert_int_equal(take(p, &ev), 2);
	assert_event(&ev, 0, KVP_EVENT_BLOCK_REMOVED, 'C');
	assert_event(&ev, 1, KVP_EVENT_BLOCK_STORED, 'C');
	check(p);
	kvp_event_batch_fini(&ev);
	kvp_pool_destroy(p);
}

/* move_block_hashes: every key now names dst, silently; dst with a key is refused. */
static void
test_move_block_hashes(void **state)
{
	(void)state;
	struct kvp_pool *p = mkpool_sem(4, HBS, true, KVP_VLLM_0_33);
	struct kvp_event_batch ev;
	struct req r;
	int32_t ids[3];

	kvp_event_batch_init(&ev);
	req_init(&r, "ABCD");
	assert_ok(kvp_pool_get_new_blocks(p, 3, ids));
	assert_ok(cache(p, &r, ids, 1, 0, 1, 4 * HBS, 0));
	assert_ok(partial(p, &r, ids[0], 8, 4 * HBS, false, NULL));
	(void)take(p, &ev);
	assert_ok(kvp_pool_move_block_hashes(p, ids[0], ids[1]));
	assert_int_equal(take(p, &ev), 0);
	assert_int_equal(hit(p, 'D', 0), ids[1]);
	assert_int_equal(hit(p, 'B', 0), ids[1]);
	assert_int_equal(kvp_pool_block_hash_tokens(p, ids[1]), 16);
	size_t len;
	assert_null(kvp_pool_block_key_at(p, ids[0], 0, &len));
	check(p);
	/* refusals: dst hashed, dst null, out of range; src without keys is a no-op */
	assert_ok(partial(p, &r, ids[2], 4, 4 * HBS, false, NULL));
	assert_int_equal(kvp_pool_move_block_hashes(p, ids[1], ids[2]), KVP_ESTATE);
	assert_int_equal(kvp_pool_move_block_hashes(p, ids[1], KVP_NULL_BLOCK), KVP_EINVAL);
	assert_int_equal(kvp_pool_move_block_hashes(p, ids[1], 9), KVP_ERANGE);
	assert_ok(kvp_pool_move_block_hashes(p, ids[0], ids[2]));
	assert_int_equal(hit(p, 'B', 0), ids[1]);
	check(p);
	kvp_event_batch_fini(&ev);
	kvp_pool_destroy(p);
}

/* Refusals change nothing; the extra keys are bounded by the pool's size; reset clears them. */
static void
test_refusals_bound_and_reset(void **state)
{
	(void)state;
	struct kvp_pool *p = mkpool_sem(3, HBS, true, KVP_VLLM_0_33);
	struct kvp_pool *old = mkpool_sem(3, HBS, true, KVP_VLLM_9AAF83EF5);
	struct kvp_event_batch ev;
	struct req r;
	int32_t ids[2], free_id = 2;

	kvp_event_batch_init(&ev);
	req_init(&r, "ABCDEFGH");
	assert_ok(kvp_pool_get_new_blocks(p, 1, ids));
	assert_int_equal(partial(p, &r, ids[0], 6, 8 * HBS, false, NULL), KVP_EINVAL);
	assert_int_equal(partial(p, &r, ids[0], 0, 8 * HBS, false, NULL), KVP_EINVAL);
	assert_int_equal(partial(p, &r, ids[0], 36, 8 * HBS, false, NULL), KVP_EINVAL);
	assert_int_equal(partial(p, &r, ids[0], 4, 6, false, NULL), KVP_EINVAL);
	assert_int_equal(partial(p, &r, free_id, 4, 8 * HBS, false, NULL), KVP_ESTATE);
	assert_int_equal(partial(p, &r, 3, 4, 8 * HBS, false, NULL), KVP_ERANGE);
	assert_ok(partial(p, &r, KVP_NULL_BLOCK, 4, 8 * HBS, false, NULL));
	assert_int_equal(take(p, &ev), 0);
	assert_int_equal(kvp_pool_num_cached_keys(p), 0);
	assert_ok(kvp_pool_get_new_blocks(old, 1, ids + 1));
	assert_int_equal(partial(old, &r, ids[1], 4, 8 * HBS, false, NULL), KVP_ENOTSUP);

	/* a 32-token block keyed by H, then extras at 4..: three fit a 3-block pool */
	assert_ok(cache(p, &r, ids, 1, 0, 1, 8 * HBS, 0));
	for (uint32_t t = 4; t <= 12; t += 4)
		assert_ok(partial(p, &r, ids[0], t, 8 * HBS, false, NULL));
	assert_int_equal(kvp_pool_num_partial_keys(p), 3);
	(void)take(p, &ev);
	assert_int_equal(partial(p, &r, ids[0], 16, 8 * HBS, false, NULL), KVP_ENOSPACE);
	assert_int_equal(take(p, &ev), 0);
	assert_int_equal(hit(p, 'D', 0), -1);
	assert_int_equal(hit(p, 'C', 0), ids[0]);
	check(p);
	assert_ok(kvp_pool_free_blocks(p, ids, 1));
	assert_ok(kvp_pool_reset_prefix_cache(p));
	assert_int_equal(kvp_pool_num_partial_keys(p), 0);
	assert_int_equal(kvp_pool_num_cached_keys(p), 0);
	assert_int_equal(hit(p, 'A', 0), -1);
	check(p);
	kvp_event_batch_fini(&ev);
	kvp_pool_destroy(old);
	kvp_pool_destroy(p);
}

/* The map's growth on the first partial key keeps every key cached before it. */
static void
test_growth_keeps_keys(void **state)
{
	(void)state;
	enum { N = 200 };
	struct kvp_pool *p = mkpool_sem(N + 1, 1, false, KVP_VLLM_0_33);
	static uint8_t hashes[N * KVP_HASH_LEN];
	int32_t ids[N];
	int64_t toks[N];

	for (int i = 0; i < N; i++) {
		memset(hashes + i * KVP_HASH_LEN, 0, KVP_HASH_LEN);
		memcpy(hashes + i * KVP_HASH_LEN, &i, sizeof(i));
		toks[i] = i;
	}
	struct kvp_cache_args a = {
		.block_hashes = hashes, .num_block_hashes = N, .token_ids = toks, .num_tokens = N,
		.num_cached_blocks = 0, .num_full_blocks = N, .block_size = 1,
	};
	assert_ok(kvp_pool_get_new_blocks(p, N, ids));
	assert_ok(kvp_pool_cache_full_blocks(p, ids, N, &a));
	/* the last block (N tokens) also reachable at 1 token: an extra key, after ids[0] */
	assert_ok(kvp_pool_cache_partial_block(p, ids[N - 1], 1, false, &a, NULL));
	assert_int_equal(kvp_pool_num_partial_keys(p), 1);
	size_t len = 0;
	const uint8_t *k = kvp_pool_block_key_at(p, ids[N - 1], 1, &len);
	assert_non_null(k);
	assert_int_equal(len, KL);
	assert_memory_equal(k, hashes, KVP_HASH_LEN);
	uint32_t g = 0;
	for (int i = 0; i < N; i++) {
		int32_t id = -1;
		assert_ok(kvp_pool_get_cached_block(p, hashes + i * KVP_HASH_LEN, KVP_HASH_LEN, &g, 1,
		                                    &id));
		assert_int_equal(id, ids[i]);
	}
	/* the first entry under hash 0 goes: the extra one answers */
	assert_ok(kvp_pool_evict_blocks(p, ids, 1));
	int32_t id = -1;
	assert_ok(kvp_pool_get_cached_block(p, hashes, KVP_HASH_LEN, &g, 1, &id));
	assert_int_equal(id, ids[N - 1]);
	check(p);
	kvp_pool_destroy(p);
}

/*
 * report_cached (emit_cached_block_events): one BlockStored of the leading
 * blocks still cached, parent None, the session id; nothing else changes.
 */
static void
test_report_cached(void **state)
{
	(void)state;
	struct kvp_pool *p = mkpool_sem(8, HBS, true, KVP_VLLM_0_33);
	struct kvp_event_batch ev;
	struct kvp_event e;
	struct req r;
	int32_t ids[3];
	uint32_t n = 99;
	const struct kvp_request_keys keys = {.session_id = "chat-3"};

	kvp_event_batch_init(&ev);
	req_init(&r, "ABC");
	assert_ok(kvp_pool_get_new_blocks(p, 3, ids));
	assert_ok(cache(p, &r, ids, 3, 0, 3, HBS, 0));
	assert_ok(kvp_pool_free_blocks(p, ids, 3));
	assert_ok(kvp_pool_evict_blocks(p, &ids[1], 1)); /* B went: still reported, as vLLM does */
	(void)take(p, &ev);
	struct kvp_cache_args a = {
		.block_hashes = r.hashes, .num_block_hashes = r.n, .token_ids = r.tokens,
		.num_tokens = 256, .keys = &keys, .num_full_blocks = 3, .block_size = HBS,
	};
	assert_ok(kvp_pool_report_cached(p, &a, &n));
	assert_int_equal(n, 3);
	assert_int_equal(take(p, &ev), 1);
	assert_ok(kvp_event_batch_get(&ev, 0, &e));
	assert_int_equal(e.type, KVP_EVENT_BLOCK_STORED);
	assert_int_equal(e.num_hashes, 3);
	assert_memory_equal(e.hashes, synth('A'), KVP_HASH_LEN);
	assert_memory_equal(e.hashes + 2 * KVP_HASH_LEN, synth('C'), KVP_HASH_LEN);
	assert_null(e.parent);
	assert_int_equal(e.num_tokens, 3 * HBS);
	assert_string_equal(e.session_id, "chat-3");
	assert_queue(p, 4, 5, 6, 7, 1, 2, 3); /* as free_blocks left it */
	/* Refusals change nothing: a range start, a short hash list, a bad block size. */
	a.num_cached_blocks = 1;
	assert_int_equal(kvp_pool_report_cached(p, &a, &n), KVP_EINVAL);
	a.num_cached_blocks = 0;
	a.num_full_blocks = 4;
	assert_int_equal(kvp_pool_report_cached(p, &a, &n), KVP_EINVAL);
	a.num_full_blocks = 1;
	a.block_size = HBS + 1;
	assert_int_equal(kvp_pool_report_cached(p, &a, &n), KVP_EINVAL);
	assert_int_equal(take(p, &ev), 0);
	kvp_event_batch_fini(&ev);
	check(p);
	kvp_pool_destroy(p);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_partial_becomes_primary),
		cmocka_unit_test(test_extra_key_and_eviction),
		cmocka_unit_test(test_promotion_by_cache_full_blocks),
		cmocka_unit_test(test_replace_and_longer_partial),
		cmocka_unit_test(test_move_block_hashes),
		cmocka_unit_test(test_refusals_bound_and_reset),
		cmocka_unit_test(test_growth_keeps_keys),
		cmocka_unit_test(test_report_cached),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
