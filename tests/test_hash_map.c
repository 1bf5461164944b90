/* SPDX-License-Identifier: Apache-2.0 */
/* The prefix-cache map against vLLM's BlockHashToBlockMap (scenarios C3, C4). */
#include "kvp_test.h"

#include <stdlib.h>

#include "engine/hash_map.h"

/* k = text || 4-byte big-endian number, as vLLM's tests build them. */
static size_t
mkkey(uint8_t *k, const char *text, uint32_t num)
{
	size_t n = strlen(text);
	memcpy(k, text, n);
	k[n] = (uint8_t)(num >> 24);
	k[n + 1] = (uint8_t)(num >> 16);
	k[n + 2] = (uint8_t)(num >> 8);
	k[n + 3] = (uint8_t)num;
	return n + 4;
}

/* C3: vLLM's test_maybe_evict_cached_block at the map level. */
static void
test_hash_map_c3_shared_key_survives_until_last_block(void **state)
{
	struct kvp_map m;
	/* 8-byte keys in 36-byte buffers: -Os cannot see that the 36-byte path is not taken. */
	uint8_t k0[36], k1[36], k2[36];
	size_t l0 = mkkey(k0, "10", 1000), l1 = mkkey(k1, "20", 2000), l2 = mkkey(k2, "30", 3000);

	(void)state;
	assert_ok(kvp_map_init(&m, 4, 36));
	assert_ok(kvp_map_insert(&m, k0, l0, 0));
	assert_ok(kvp_map_insert(&m, k1, l1, 1));
	assert_ok(kvp_map_insert(&m, k2, l2, 2));
	assert_ok(kvp_map_insert(&m, k0, l0, 3));
	assert_int_equal(m.num_keys, 3);
	assert_int_equal(kvp_map_lookup(&m, k0, l0), 0);

	assert_int_equal(kvp_map_remove_id(&m, 1), 1);
	assert_int_equal(m.num_keys, 2);
	assert_int_equal(kvp_map_lookup(&m, k1, l1), -1);
	assert_int_equal(kvp_map_remove_id(&m, 0), 1);
	assert_int_equal(m.num_keys, 2);
	assert_int_equal(kvp_map_lookup(&m, k0, l0), 3);
	assert_int_equal(kvp_map_remove_id(&m, 2), 1);
	assert_int_equal(m.num_keys, 1);
	assert_int_equal(kvp_map_remove_id(&m, 3), 1);
	assert_int_equal(m.num_keys, 0);
	assert_int_equal(kvp_map_remove_id(&m, 3), 0);
	kvp_map_fini(&m);
}

/* C4, single entries. */
static void
test_hash_map_c4_pop_single_entry_semantics(void **state)
{
	struct kvp_map m;
	uint8_t k0[36], k1[36];
	size_t l0 = mkkey(k0, "k", 0), l1 = mkkey(k1, "k", 1);

	(void)state;
	assert_ok(kvp_map_init(&m, 128, 8));
	assert_ok(kvp_map_insert(&m, k0, l0, 0));
	assert_ok(kvp_map_insert(&m, k1, l1, 1));
	assert_int_equal(kvp_map_pop(&m, k0, l0, 100), 0);
	assert_int_equal(kvp_map_lookup(&m, k0, l0), 0);
	assert_int_equal(kvp_map_pop(&m, k0, l0, 0), 1);
	assert_int_equal(kvp_map_pop(&m, k0, l0, 1), 0);
	assert_int_equal(kvp_map_pop(&m, k1, l1, 1), 1);
	assert_int_equal(m.num_keys, 0);
	kvp_map_fini(&m);
}

/* C4, several blocks per key: lookup returns the first inserted survivor. */
static void
test_hash_map_c4_pop_multi_entry_fifo(void **state)
{
	struct kvp_map m;
	uint8_t k0[36], k1[36];
	size_t l0 = mkkey(k0, "k", 0), l1 = mkkey(k1, "k", 1);

	(void)state;
	assert_ok(kvp_map_init(&m, 16, 8));
	assert_ok(kvp_map_insert(&m, k0, l0, 0));
	assert_ok(kvp_map_insert(&m, k0, l0, 1));
	assert_ok(kvp_map_insert(&m, k1, l1, 10));
	assert_ok(kvp_map_insert(&m, k1, l1, 11));
	assert_int_equal(m.num_keys, 2);
	assert_int_equal(kvp_map_lookup(&m, k0, l0), 0);
	assert_int_equal(kvp_map_pop(&m, k0, l0, 0), 1);
	assert_int_equal(kvp_map_lookup(&m, k0, l0), 1);
	assert_int_equal(kvp_map_pop(&m, k0, l0, 1), 1);
	assert_int_equal(kvp_map_lookup(&m, k0, l0), -1);
	assert_int_equal(kvp_map_pop(&m, k0, l0, 2), 0);
	assert_int_equal(kvp_map_lookup(&m, k1, l1), 10);
	assert_int_equal(kvp_map_pop(&m, k1, l1, 10), 1);
	assert_int_equal(kvp_map_lookup(&m, k1, l1), 11);
	assert_int_equal(kvp_map_pop(&m, k1, l1, 11), 1);
	assert_int_equal(kvp_map_lookup(&m, k1, l1), -1);
	assert_int_equal(m.num_keys, 0);
	kvp_map_fini(&m);
}

static void
test_hash_map_bad_insert_is_rejected_unchanged(void **state)
{
	struct kvp_map m;
	uint8_t k[36], big[40] = {0};
	size_t l = mkkey(k, "k", 7);

	(void)state;
	assert_status(kvp_map_init(&m, 0, 8), KVP_EINVAL);
	assert_status(kvp_map_init(&m, 4, 0), KVP_EINVAL);
	assert_ok(kvp_map_init(&m, 4, 8));
	assert_status(kvp_map_insert(&m, k, 0, 1), KVP_EINVAL);
	assert_status(kvp_map_insert(&m, big, sizeof(big), 1), KVP_EINVAL);
	assert_status(kvp_map_insert(&m, k, l, 4), KVP_EINVAL);
	assert_status(kvp_map_insert(&m, k, l, -1), KVP_EINVAL);
	assert_ok(kvp_map_insert(&m, k, l, 1));
	assert_status(kvp_map_insert(&m, k, l, 1), KVP_ESTATE);
	assert_int_equal(m.num_keys, 1);
	assert_int_equal(kvp_map_lookup(&m, k, l), 1);
	assert_int_equal(kvp_map_next_same_key(&m, 1), -1);
	kvp_map_fini(&m);
	kvp_map_fini(&m); /* twice is safe */
}

/*
 * Many keys with colliding probe sequences, removed in random order: the
 * backward-shift deletion must keep every survivor findable. Seeded.
 */
static void
test_hash_map_random_churn_keeps_survivors_findable(void **state)
{
	enum { N = 2000 };
	struct kvp_map m;
	uint8_t keys[N][36];
	size_t lens[N];
	int in[N] = {0};
	unsigned seed = 12345;

	(void)state;
	printf("seed %u\n", seed);
	srand(seed);
	assert_ok(kvp_map_init(&m, N, 8));
	for (int i = 0; i < N; i++)
		lens[i] = mkkey(keys[i], "x", (uint32_t)(i % 700)); /* ~3 blocks per key */
	for (int round = 0; round < 20000; round++) {
		int id = rand() % N;
		if (in[id]) {
			assert_int_equal(kvp_map_pop(&m, keys[id], lens[id], id), 1);
			in[id] = 0;
		} else {
			assert_ok(kvp_map_insert(&m, keys[id], lens[id], id));
			in[id] = 1;
		}
		if (round % 997 == 0) {
			for (int j = 0; j < N; j++) {
				int32_t head = kvp_map_lookup(&m, keys[j], lens[j]);
				int found = 0;
				for (int32_t x = head; x >= 0; x = kvp_map_next_same_key(&m, x))
					found |= x == j;
				assert_int_equal(found, in[j]);
			}
		}
	}
	kvp_map_clear(&m);
	assert_int_equal(m.num_keys, 0);
	assert_int_equal(kvp_map_lookup(&m, keys[0], lens[0]), -1);
	kvp_map_fini(&m);
}

/*
 * The pool's no-copy paths (a 32-byte hash and a group given apart) agree
 * with the key-based ones: same hash, same lookups, and a key written in a
 * block's slot inserts like kvp_map_insert.
 */
static void
test_hash_map_split_key_paths_match_key_paths(void **state)
{
	struct kvp_map m;
	enum { N = 200 };
	uint8_t keys[N][36];

	(void)state;
	assert_ok(kvp_map_init(&m, N, 36));
	srand(7);
	for (int i = 0; i < N; i++) {
		for (int b = 0; b < 32; b++)
			keys[i][b] = (uint8_t)rand();
		mkkey(keys[i] + 32, "", (uint32_t)(i % 3)); /* the group: the last 4 bytes */
		if (i % 5 == 4) /* some keys shared by two blocks */
			memcpy(keys[i], keys[i - 1], 36);
		assert_int_equal(kvp_map__hash_hg(&m, keys[i], keys[i] + 32), kvp_map_hash(&m, keys[i], 36));
		if (i % 2) {
			assert_ok(kvp_map_insert(&m, keys[i], 36, i));
		} else {
			memcpy(kvp_map__slot_mut(&m, i), keys[i], 36);
			kvp_map__insert_slot(&m, i, 36, kvp_map_hash(&m, keys[i], 36));
		}
	}
	for (int i = 0; i < N; i++) {
		int32_t want = kvp_map_lookup(&m, keys[i], 36);
		assert_true(want >= 0 && want <= i);
		assert_int_equal(kvp_map__lookup_hg(&m, keys[i], keys[i] + 32), want);
		uint8_t other[4] = {0xff, 0xff, 0xff, 0xff}; /* no key has this group */
		assert_int_equal(kvp_map__lookup_hg(&m, keys[i], other), -1);
	}
	for (int i = 0; i < N; i += 2)
		assert_int_equal(kvp_map_remove_id(&m, i), 1);
	for (int i = 1; i < N; i += 2)
		assert_int_equal(kvp_map__lookup_hg(&m, keys[i], keys[i] + 32),
		                 kvp_map_lookup(&m, keys[i], 36));
	kvp_map_fini(&m);
}

/* The longest run of occupied buckets: what a probe may have to walk. */
static uint32_t
longest_run(const struct kvp_map *m)
{
	uint32_t best = 0, run = 0;
	/* Twice round, so a run that wraps past the last bucket is counted whole. */
	for (uint64_t i = 0; i < 2ull * ((uint64_t)m->mask + 1); i++) {
		run = m->buckets[i & m->mask] ? run + 1 : 0;
		best = run > best ? run : best;
	}
	return best;
}

/*
 * A peer chooses the block hashes it caches. Keys found (by search, as an
 * attacker who knew the hash would) to share one home bucket under map a's
 * seed pile into one run there, but scatter in map b, whose seed is its own:
 * without the seed, keys cannot be aimed.
 */
static void
test_hash_map_chosen_keys_do_not_collide_under_another_seed(void **state)
{
	struct kvp_map a, b;
	enum { N = 256 };
	static uint8_t keys[N][36];
	uint64_t tries = 0;

	(void)state;
	assert_ok(kvp_map_init(&a, 1024, 36));
	assert_ok(kvp_map_init(&b, 1024, 36));
	assert_true(memcmp(a.seed, b.seed, sizeof(a.seed)) != 0);
	assert_int_equal(a.mask, b.mask);
	for (int n = 0; n < N; tries++) {
		uint8_t *k = keys[n];
		memset(k, 0, 36);
		memcpy(k, &tries, sizeof(tries));
		if ((kvp_map_hash(&a, k, 36) & a.mask) == 0)
			n++;
	}
	for (int i = 0; i < N; i++) {
		assert_ok(kvp_map_insert(&a, keys[i], 36, i));
		assert_ok(kvp_map_insert(&b, keys[i], 36, i));
	}
	assert_true(longest_run(&a) >= N);
	assert_true(longest_run(&b) < 16); /* 256 keys in 4096 buckets */
	for (int i = 0; i < N; i++)
		assert_int_equal(kvp_map_lookup(&b, keys[i], 36), i);
	kvp_map_fini(&a);
	kvp_map_fini(&b);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hash_map_c3_shared_key_survives_until_last_block),
		cmocka_unit_test(test_hash_map_c4_pop_single_entry_semantics),
		cmocka_unit_test(test_hash_map_c4_pop_multi_entry_fifo),
		cmocka_unit_test(test_hash_map_bad_insert_is_rejected_unchanged),
		cmocka_unit_test(test_hash_map_random_churn_keeps_survivors_findable),
		cmocka_unit_test(test_hash_map_split_key_paths_match_key_paths),
		cmocka_unit_test(test_hash_map_chosen_keys_do_not_collide_under_another_seed),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
