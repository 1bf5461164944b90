/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Keyed two-phase stores in the engine (pool.h, "Keyed stores"): reserve,
 * commit, abort, and what a reserved block's key may and may not be seen by.
 */
#include "pool_util.h"

#define KL (KVP_HASH_LEN + 4)

/* Key X/g: synth(X) || g big-endian. */
static void
key(uint8_t *dst, char c, uint32_t g)
{
	memcpy(dst, synth(c), KVP_HASH_LEN);
	dst[KVP_HASH_LEN] = (uint8_t)(g >> 24);
	dst[KVP_HASH_LEN + 1] = (uint8_t)(g >> 16);
	dst[KVP_HASH_LEN + 2] = (uint8_t)(g >> 8);
	dst[KVP_HASH_LEN + 3] = (uint8_t)g;
}

static void
keys(uint8_t *dst, const char *names, uint32_t g)
{
	for (size_t i = 0; names[i]; i++)
		key(dst + i * KL, names[i], g);
}

static int32_t
cached_id(struct kvp_pool *p, char c, uint32_t g)
{
	int32_t id = -1;
	return kvp_pool_get_cached_block(p, synth(c), KVP_HASH_LEN, &g, 1, &id) == KVP_OK ? id : -1;
}

/* A reserved key is invisible until commit; commit caches it, events it, frees it to the tail. */
static void
test_keyed_commit_makes_visible(void **state)
{
	(void)state;
	struct kvp_pool *p = mkpool_sem(8, 4, true, KVP_VLLM_0_33);
	struct kvp_event_batch ev;
	struct kvp_event e;
	uint8_t k[3 * KL];
	int32_t ids[3], q[8];
	uint32_t bs[2] = {16, 32};

	kvp_event_batch_init(&ev);
	keys(k, "ABC", 1);
	assert_ok(kvp_pool_reserve(p, k, KL, 3, ids, NULL, NULL));
	assert_int_equal(ids[0], 1);
	assert_int_equal(ids[1], 2);
	assert_int_equal(ids[2], 3);
	assert_int_equal(kvp_pool_num_pending(p), 3);
	assert_int_equal(kvp_pool_ref_cnt(p, 2), 1);
	assert_int_equal(cached_id(p, 'A', 1), -1);
	assert_int_equal(kvp_pool_pending_block(p, k + KL, KL), 2);
	assert_ok(kvp_pool_take_events(p, &ev));
	assert_int_equal(kvp_event_batch_count(&ev), 0);
	check(p);

	int32_t two[2] = {1, 3};
	assert_ok(kvp_pool_commit(p, two, 2, bs, 2));
	assert_int_equal(cached_id(p, 'A', 1), 1);
	assert_int_equal(cached_id(p, 'C', 1), 3);
	assert_int_equal(cached_id(p, 'B', 1), -1);
	assert_int_equal(kvp_pool_ref_cnt(p, 1), 0);
	assert_int_equal(kvp_pool_num_pending(p), 1);
	/* cached and free: at the tail, in the order committed */
	size_t nq = kvp_pool_free_queue(p, q, 8);
	assert_int_equal(nq, 6);
	assert_int_equal(q[4], 1);
	assert_int_equal(q[5], 3);
	assert_ok(kvp_pool_take_events(p, &ev));
	assert_int_equal(kvp_event_batch_count(&ev), 1);
	assert_ok(kvp_event_batch_get(&ev, 0, &e));
	assert_int_equal(e.type, KVP_EVENT_BLOCK_STORED);
	assert_int_equal(e.num_hashes, 2);
	assert_int_equal(e.hash_len, KVP_HASH_LEN);
	assert_memory_equal(e.hashes, synth('A'), KVP_HASH_LEN);
	assert_memory_equal(e.hashes + KVP_HASH_LEN, synth('C'), KVP_HASH_LEN);
	assert_null(e.parent);
	assert_int_equal(e.num_tokens, 0);
	assert_int_equal(e.block_size, 32);
	assert_true(e.has_group_idx);
	assert_int_equal(e.group_idx, 1);
	check(p);

	/* committing again, or a block never reserved: KVP_ESTATE, nothing changes */
	assert_status(kvp_pool_commit(p, two, 1, bs, 2), KVP_ESTATE);
	int32_t dup[2] = {2, 2};
	assert_status(kvp_pool_commit(p, dup, 2, bs, 2), KVP_EINVAL);
	int32_t out[1] = {99};
	assert_status(kvp_pool_commit(p, out, 1, bs, 2), KVP_ERANGE);
	assert_int_equal(kvp_pool_num_pending(p), 1);
	kvp_event_batch_fini(&ev);
	kvp_pool_destroy(p);
}

/* Cached, pending and repeated keys come back -1; a full pool refuses all. */
static void
test_keyed_reserve_already_stored(void **state)
{
	(void)state;
	struct kvp_pool *p = mkpool_sem(5, 4, false, KVP_VLLM_0_33);
	uint8_t k[4 * KL];
	int32_t ids[4];

	keys(k, "A", 0);
	assert_ok(kvp_pool_reserve(p, k, KL, 1, ids, NULL, NULL));
	assert_ok(kvp_pool_commit(p, ids, 1, NULL, 0));
	keys(k, "B", 0);
	assert_ok(kvp_pool_reserve(p, k, KL, 1, ids, NULL, NULL));
	/* A cached, B pending, C twice: one block, for the first C */
	keys(k, "ABCC", 0);
	assert_ok(kvp_pool_reserve(p, k, KL, 4, ids, NULL, NULL));
	assert_int_equal(ids[0], -1);
	assert_int_equal(ids[1], -1);
	assert_true(ids[2] > 0);
	assert_int_equal(ids[3], -1);
	/* another group is another key */
	keys(k, "A", 7);
	assert_ok(kvp_pool_reserve(p, k, KL, 1, ids, NULL, NULL));
	assert_true(ids[0] > 0);
	/* 4 usable blocks: B, C, A/7 held, A cached and free: D and E need 2, 1 is free */
	assert_int_equal(kvp_pool_num_free(p), 1);
	keys(k, "DE", 0);
	assert_status(kvp_pool_reserve(p, k, KL, 2, ids, NULL, NULL), KVP_ENOSPACE);
	assert_int_equal(ids[0], -1);
	assert_int_equal(kvp_pool_pending_block(p, k, KL), -1);
	assert_int_equal(kvp_pool_num_free(p), 1);
	check(p);
	/* bad lengths */
	assert_status(kvp_pool_reserve(p, k, 4, 1, ids, NULL, NULL), KVP_EINVAL);
	assert_status(kvp_pool_reserve(p, k, KL + KVP_HASH_LEN, 1, ids, NULL, NULL), KVP_EINVAL);
	assert_status(kvp_pool_reserve(NULL, k, KL, 1, ids, NULL, NULL), KVP_EINVAL);
	kvp_pool_destroy(p);

	struct kvp_pool_config off = {.num_blocks = 4, .hash_block_size = 4};
	assert_ok(kvp_pool_create(&off, &p));
	assert_status(kvp_pool_reserve(p, k, KL, 1, ids, NULL, NULL), KVP_ENOTSUP);
	kvp_pool_destroy(p);
}

/* Reserve evicts from the LRU head and reports the keys; abort frees to the head, no event. */
static void
test_keyed_evicts_and_aborts(void **state)
{
	(void)state;
	struct kvp_pool *p = mkpool_sem(4, 4, true, KVP_VLLM_0_33);
	struct kvp_event_batch ev;
	struct kvp_event e;
	uint8_t k[3 * KL], evicted[3 * KL];
	int32_t ids[3], q[4];
	size_t ne = 99;

	kvp_event_batch_init(&ev);
	keys(k, "ABC", 0);
	assert_ok(kvp_pool_reserve(p, k, KL, 3, ids, evicted, &ne));
	assert_int_equal(ne, 0);
	assert_ok(kvp_pool_commit(p, ids, 3, NULL, 0));
	assert_ok(kvp_pool_take_events(p, &ev));
	/* the pool is full of cached A, B, C (LRU order): two new keys evict A and B */
	keys(k, "DE", 0);
	assert_ok(kvp_pool_reserve(p, k, KL, 2, ids, evicted, &ne));
	assert_int_equal(ne, 2);
	uint8_t want[KL];
	key(want, 'A', 0);
	assert_memory_equal(evicted, want, KL);
	key(want, 'B', 0);
	assert_memory_equal(evicted + KL, want, KL);
	assert_int_equal(cached_id(p, 'A', 0), -1);
	assert_true(cached_id(p, 'C', 0) > 0);
	assert_ok(kvp_pool_take_events(p, &ev));
	assert_int_equal(kvp_event_batch_count(&ev), 2);
	assert_ok(kvp_event_batch_get(&ev, 0, &e));
	assert_int_equal(e.type, KVP_EVENT_BLOCK_REMOVED);

	/* abort: no event, the block first in line again (vLLM 0.33: unhashed to the head) */
	int32_t d = ids[0];
	assert_ok(kvp_pool_abort(p, &d, 1));
	assert_ok(kvp_pool_take_events(p, &ev));
	assert_int_equal(kvp_event_batch_count(&ev), 0);
	assert_int_equal(kvp_pool_free_queue(p, q, 4), 2);
	assert_int_equal(q[0], d);
	assert_int_equal(kvp_pool_pending_block(p, k, KL), -1);
	assert_status(kvp_pool_abort(p, &d, 1), KVP_ESTATE);
	check(p);

	/* a reserved block freed some other way (a lost session) takes its key along */
	int32_t e2 = ids[1];
	assert_ok(kvp_pool_free_blocks(p, &e2, 1));
	assert_int_equal(kvp_pool_num_pending(p), 0);
	assert_int_equal(kvp_pool_pending_block(p, k + KL, KL), -1);
	assert_status(kvp_pool_commit(p, &e2, 1, NULL, 0), KVP_ESTATE);
	check(p);
	kvp_event_batch_fini(&ev);
	kvp_pool_destroy(p);
}

/* A reserved block cannot be cached by the request path, and blocks a reset. */
static void
test_keyed_reserved_is_not_cacheable(void **state)
{
	(void)state;
	struct kvp_pool *p = mkpool_sem(4, 4, false, KVP_VLLM_0_33);
	uint8_t k[KL];
	int32_t id;
	struct req r;

	keys(k, "A", 0);
	assert_ok(kvp_pool_reserve(p, k, KL, 1, &id, NULL, NULL));
	req_init(&r, "B");
	assert_status(cache(p, &r, &id, 1, 0, 1, 4, 0), KVP_ESTATE);
	assert_status(kvp_pool_reset_prefix_cache(p), KVP_ESTATE);
	/* a second reference (a Touch) keeps the block after commit, cached */
	assert_ok(kvp_pool_touch(p, &id, 1));
	assert_ok(kvp_pool_commit(p, &id, 1, NULL, 0));
	assert_int_equal(kvp_pool_ref_cnt(p, id), 1);
	assert_int_equal(cached_id(p, 'A', 0), id);
	check(p);
	kvp_pool_destroy(p);
}

static void
on_unkey(void *ctx, int32_t id)
{
	int32_t *last = ctx;
	*last = id;
}

/*
 * adopt: free keyless blocks take keys back (a warm restart), cached and
 * free at the LRU's tail in the order given, with a BlockStored; a bad call
 * changes nothing; the unkey hook hears each key leave.
 */
static void
test_keyed_adopt_takes_blocks_back(void **state)
{
	(void)state;
	struct kvp_pool *p = mkpool_sem(8, 4, true, KVP_VLLM_0_33);
	struct kvp_event_batch ev;
	uint8_t k[3 * KL];
	int32_t q[8], last = 0;
	uint32_t bs[1] = {16};

	kvp_event_batch_init(&ev);
	kvp_pool_set_unkey_hook(p, on_unkey, &last);
	keys(k, "ABC", 0);
	int32_t bad[2] = {5, 5}, zero[1] = {0}, ok[3] = {6, 2, 4};
	assert_status(kvp_pool_adopt(p, k, KL, bad, 2, bs, 1), KVP_EINVAL);
	assert_status(kvp_pool_adopt(p, k, KL, zero, 1, bs, 1), KVP_ERANGE);
	assert_status(kvp_pool_adopt(p, k, 4, ok, 3, bs, 1), KVP_EINVAL); /* a group, no hash */
	uint8_t twice[2 * KL];
	keys(twice, "AA", 0);
	assert_status(kvp_pool_adopt(p, twice, KL, ok, 2, bs, 1), KVP_EINVAL);
	assert_int_equal(kvp_pool_num_cached_blocks(p), 0);
	assert_int_equal(kvp_pool_num_free(p), 7);
	check(p);

	assert_ok(kvp_pool_adopt(p, k, KL, ok, 3, bs, 1));
	assert_int_equal(cached_id(p, 'A', 0), 6);
	assert_int_equal(cached_id(p, 'B', 0), 2);
	assert_int_equal(cached_id(p, 'C', 0), 4);
	assert_int_equal(kvp_pool_num_free(p), 7);
	assert_int_equal(kvp_pool_num_pending(p), 0);
	size_t nq = kvp_pool_free_queue(p, q, 8);
	assert_int_equal(nq, 7);
	assert_int_equal(q[4], 6);
	assert_int_equal(q[5], 2);
	assert_int_equal(q[6], 4);
	assert_ok(kvp_pool_take_events(p, &ev));
	assert_int_equal(kvp_event_batch_count(&ev), 1);
	check(p);

	/* A key or block already cached: KVP_ESTATE, nothing changes. */
	int32_t one[1] = {1}, six[1] = {6};
	uint8_t d[KL];
	key(d, 'D', 0);
	assert_status(kvp_pool_adopt(p, k, KL, one, 1, bs, 1), KVP_ESTATE);
	assert_status(kvp_pool_adopt(p, d, KL, six, 1, bs, 1), KVP_ESTATE);
	assert_int_equal(cached_id(p, 'D', 0), -1);

	/* An eviction and a reset each tell the hook. */
	int32_t got[1];
	uint8_t e[KL];
	key(e, 'E', 0);
	assert_ok(kvp_pool_evict_blocks(p, six, 1));
	assert_int_equal(last, 6);
	assert_ok(kvp_pool_reserve(p, e, KL, 1, got, NULL, NULL));
	assert_ok(kvp_pool_abort(p, got, 1));
	assert_ok(kvp_pool_reset_prefix_cache(p));
	assert_int_equal(last, -1);
	check(p);
	kvp_event_batch_fini(&ev);
	kvp_pool_destroy(p);
}

/* Keys a tier below holds: events in their medium, in order, nothing else changes. */
static void
test_keyed_announce_tells_another_medium(void **state)
{
	(void)state;
	struct kvp_pool *p = mkpool_sem(8, 4, true, KVP_VLLM_0_33);
	struct kvp_event_batch ev;
	struct kvp_event e;
	uint8_t k[3 * KL];
	uint32_t bs[2] = {16, 32};

	kvp_event_batch_init(&ev);
	keys(k, "AB", 1);
	key(k + 2 * KL, 'C', 0);
	assert_status(kvp_pool_announce(p, true, k, KL, 3, "", bs, 2), KVP_EINVAL);
	assert_status(kvp_pool_announce(p, true, k, 4, 3, "STORAGE", bs, 2), KVP_EINVAL);
	assert_status(kvp_pool_announce(p, true, NULL, KL, 3, "STORAGE", bs, 2), KVP_EINVAL);
	assert_ok(kvp_pool_take_events(p, &ev));
	assert_int_equal(kvp_event_batch_count(&ev), 0);

	assert_ok(kvp_pool_announce(p, true, k, KL, 3, "STORAGE", bs, 2));
	assert_ok(kvp_pool_announce(p, false, k + KL, KL, 1, "STORAGE", bs, 2));
	assert_ok(kvp_pool_take_events(p, &ev));
	assert_int_equal(kvp_event_batch_count(&ev), 3); /* A and B (group 1), C (group 0), -B */
	assert_ok(kvp_event_batch_get(&ev, 0, &e));
	assert_int_equal(e.type, KVP_EVENT_BLOCK_STORED);
	assert_int_equal(e.num_hashes, 2);
	assert_int_equal(e.block_size, 32);
	assert_string_equal(e.medium, "STORAGE");
	assert_memory_equal(e.hashes + KVP_HASH_LEN, synth('B'), KVP_HASH_LEN);
	assert_ok(kvp_event_batch_get(&ev, 1, &e));
	assert_int_equal(e.num_hashes, 1);
	assert_int_equal(e.block_size, 16);
	assert_ok(kvp_event_batch_get(&ev, 2, &e));
	assert_int_equal(e.type, KVP_EVENT_BLOCK_REMOVED);
	assert_string_equal(e.medium, "STORAGE");
	assert_memory_equal(e.hashes, synth('B'), KVP_HASH_LEN);
	/* The pool itself holds none of them. */
	assert_int_equal(cached_id(p, 'A', 1), -1);
	assert_int_equal(kvp_pool_num_cached_blocks(p), 0);
	assert_int_equal(kvp_pool_num_free(p), 7);
	check(p);
	kvp_event_batch_fini(&ev);
	kvp_pool_destroy(p);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_keyed_commit_makes_visible),
		cmocka_unit_test(test_keyed_reserve_already_stored),
		cmocka_unit_test(test_keyed_evicts_and_aborts),
		cmocka_unit_test(test_keyed_reserved_is_not_cacheable),
		cmocka_unit_test(test_keyed_adopt_takes_blocks_back),
		cmocka_unit_test(test_keyed_announce_tells_another_medium),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
