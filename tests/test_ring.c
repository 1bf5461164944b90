/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The replay ring (service/streams/ring.c): its count bound, its byte bound (the
 * oldest go first, the newest always stays), lost seqs, and a seeded run
 * against a plain model of what it must hold, with its byte total exact.
 */
#include "kvp_test.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/kvp_status.h"
#include "service/streams/ring.h"

static uint8_t *
batch(size_t len, uint8_t fill)
{
	uint8_t *b = malloc(len ? len : 1);
	assert_non_null(b);
	memset(b, fill, len);
	return b;
}

static void
test_ring_rejects_zero_bounds(void **state)
{
	struct kvpd_ring r;
	(void)state;
	assert_int_equal(kvpd_ring_init(&r, 0, 100), KVP_EINVAL);
	assert_int_equal(kvpd_ring_init(&r, 4, 0), KVP_EINVAL);
}

static void
test_ring_count_bound(void **state)
{
	struct kvpd_ring r;
	(void)state;
	assert_int_equal(kvpd_ring_init(&r, 4, 1 << 20), KVP_OK);
	assert_int_equal(kvpd_ring_oldest(&r), 0);
	assert_null(kvpd_ring_get(&r, 0));
	for (uint64_t s = 0; s < 10; s++)
		kvpd_ring_put(&r, s, batch(10, (uint8_t)s), 10);
	assert_int_equal(kvpd_ring_oldest(&r), 6);
	assert_null(kvpd_ring_get(&r, 5));
	for (uint64_t s = 6; s < 10; s++) {
		const struct kvpd_ring_slot *sl = kvpd_ring_get(&r, s);
		assert_non_null(sl);
		assert_int_equal(sl->len, 10);
		assert_int_equal(sl->bytes[0], (uint8_t)s);
	}
	assert_null(kvpd_ring_get(&r, 10));
	assert_int_equal(r.bytes, 40);
	assert_int_equal(r.dropped_for_bytes, 0);
	kvpd_ring_fini(&r);
}

static void
test_ring_byte_bound_keeps_the_newest(void **state)
{
	struct kvpd_ring r;
	(void)state;
	assert_int_equal(kvpd_ring_init(&r, 100, 1000), KVP_OK);
	for (uint64_t s = 0; s < 5; s++)
		kvpd_ring_put(&r, s, batch(300, 1), 300);
	/* 3 x 300 fit in 1000, a fourth does not: seqs 2, 3, 4 stay. */
	assert_int_equal(kvpd_ring_oldest(&r), 2);
	assert_int_equal(r.bytes, 900);
	assert_int_equal(r.dropped_for_bytes, 2);
	assert_null(kvpd_ring_get(&r, 1));
	assert_non_null(kvpd_ring_get(&r, 2));
	/* One batch larger than the bound: alone, but kept. */
	kvpd_ring_put(&r, 5, batch(5000, 2), 5000);
	assert_int_equal(kvpd_ring_oldest(&r), 5);
	assert_int_equal(r.bytes, 5000);
	assert_non_null(kvpd_ring_get(&r, 5));
	/* The next small one pushes it out. */
	kvpd_ring_put(&r, 6, batch(10, 3), 10);
	assert_int_equal(kvpd_ring_oldest(&r), 6);
	assert_int_equal(r.bytes, 10);
	kvpd_ring_fini(&r);
}

static void
test_ring_lost_seq_is_a_hole(void **state)
{
	struct kvpd_ring r;
	(void)state;
	assert_int_equal(kvpd_ring_init(&r, 8, 1 << 20), KVP_OK);
	kvpd_ring_put(&r, 0, batch(5, 0), 5);
	kvpd_ring_put(&r, 1, NULL, 123); /* lost: counts nothing */
	kvpd_ring_put(&r, 2, batch(5, 2), 5);
	assert_non_null(kvpd_ring_get(&r, 0));
	assert_null(kvpd_ring_get(&r, 1));
	assert_non_null(kvpd_ring_get(&r, 2));
	assert_int_equal(r.bytes, 10);
	/* A jump in seq leaves nothing stale counted. */
	kvpd_ring_put(&r, 100, batch(7, 9), 7);
	assert_int_equal(r.bytes, 7);
	assert_int_equal(kvpd_ring_oldest(&r), 93);
	assert_null(kvpd_ring_get(&r, 2));
	assert_non_null(kvpd_ring_get(&r, 100));
	kvpd_ring_fini(&r);
}

/* Seeded sizes against a model: the ring holds exactly the longest suffix that fits. */
static void
test_ring_matches_a_model(void **state)
{
	enum { CAP = 64, MAXB = 4096, N = 20000 };
	static size_t lens[N];
	uint64_t rng = 0x9e3779b97f4a7c15ull;
	struct kvpd_ring r;
	(void)state;
	assert_int_equal(kvpd_ring_init(&r, CAP, MAXB), KVP_OK);
	for (uint64_t s = 0; s < N; s++) {
		uint64_t x = kvp_test_rand(&rng);
		lens[s] = x % 16 == 0 ? 0 : (size_t)(x >> 8) % (x % 7 == 0 ? 6000 : 400);
		bool lost = x % 97 == 0;
		kvpd_ring_put(&r, s, lost ? NULL : batch(lens[s], (uint8_t)s), lens[s]);
		if (lost)
			lens[s] = SIZE_MAX;
		/* Model: walk back from s while the count and byte bounds allow. */
		size_t total = 0;
		uint64_t lo = s;
		for (uint64_t k = s + 1; k-- > 0 && s - k < CAP;) {
			size_t l = lens[k] == SIZE_MAX ? 0 : lens[k];
			if (k != s && total + l > MAXB)
				break;
			total += l;
			lo = k;
		}
		assert_int_equal(r.bytes, total);
		assert_int_equal(kvpd_ring_oldest(&r), lo);
		if (s % 1000 == 0)
			for (uint64_t k = lo; k <= s; k++) {
				const struct kvpd_ring_slot *sl = kvpd_ring_get(&r, k);
				if (lens[k] == SIZE_MAX) {
					assert_null(sl);
				} else {
					assert_non_null(sl);
					assert_int_equal(sl->len, lens[k]);
				}
			}
	}
	kvpd_ring_fini(&r);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ring_rejects_zero_bounds),
		cmocka_unit_test(test_ring_count_bound),
		cmocka_unit_test(test_ring_byte_bound_keeps_the_newest),
		cmocka_unit_test(test_ring_lost_seq_is_a_hole),
		cmocka_unit_test(test_ring_matches_a_model),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
