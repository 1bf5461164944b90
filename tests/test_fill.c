/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The cluster-fill table (service/rpc/fill.h) on a clock the test moves: no
 * pending answer before an agent calls or after it stops; a missed key
 * pending until its wait ends, then a miss for cluster_miss_ms, then asked
 * again; keys taken once, oldest first; absent keys missing for their
 * time; a full table answering misses, counted; bad sizes refused.
 */
#include "kvp_test.h"

#include <string.h>

#include "common/kvp_status.h"
#include "service/rpc/fill.h"

#define KL 36
#define WAIT 200
#define MISS 1000

static void
key(uint8_t *k, uint32_t i)
{
	for (int j = 0; j < KL; j++)
		k[j] = (uint8_t)(i * 131u + (uint32_t)j * 7u + 1u);
}

static void
test_fill_no_agent_no_pending(void **state)
{
	struct kvpd_fill f;
	uint8_t k[KL], out[4 * KL];
	uint32_t waiting;
	(void)state;
	assert_int_equal(kvpd_fill_init(&f, KL, 8, WAIT, MISS), KVP_OK);
	key(k, 1);
	assert_int_equal(kvpd_fill_ask(&f, k, 1000), KVPD_FILL_MISS); /* no agent yet */
	assert_int_equal(kvpd_fill_agent(&f, NULL, 0, out, 4, &waiting, 1000), 0);
	assert_int_equal(kvpd_fill_ask(&f, k, 1001), KVPD_FILL_PENDING);
	/* The agent is gone 2 s after its last call: lookups miss at once. */
	key(k, 2);
	assert_int_equal(kvpd_fill_ask(&f, k, 1000 + KVPD_FILL_AGENT_MS + 1), KVPD_FILL_MISS);
	assert_int_equal(f.pending, 1);
	kvpd_fill_fini(&f);
	assert_int_equal(kvpd_fill_ask(&f, k, 1), KVPD_FILL_MISS); /* no table */
}

static void
test_fill_wanted_taken_once_in_order(void **state)
{
	struct kvpd_fill f;
	uint8_t k[3][KL], out[4 * KL];
	uint32_t waiting = 99;
	(void)state;
	assert_int_equal(kvpd_fill_init(&f, KL, 8, WAIT, MISS), KVP_OK);
	kvpd_fill_agent(&f, NULL, 0, NULL, 0, NULL, 10);
	for (uint32_t i = 0; i < 3; i++) {
		key(k[i], i);
		assert_int_equal(kvpd_fill_ask(&f, k[i], 20 + i), KVPD_FILL_PENDING);
	}
	assert_int_equal(kvpd_fill_ask(&f, k[0], 30), KVPD_FILL_PENDING); /* asked again: one want */
	assert_int_equal(kvpd_fill_agent(&f, NULL, 0, out, 2, &waiting, 40), 2);
	assert_memory_equal(out, k[0], KL);
	assert_memory_equal(out + KL, k[1], KL);
	assert_int_equal(waiting, 1);
	assert_int_equal(kvpd_fill_agent(&f, NULL, 0, out, 4, &waiting, 41), 1);
	assert_memory_equal(out, k[2], KL);
	assert_int_equal(waiting, 0);
	assert_int_equal(kvpd_fill_agent(&f, NULL, 0, out, 4, &waiting, 42), 0);
	/* Taken keys stay pending until their wait ends, then miss for MISS ms. */
	assert_int_equal(kvpd_fill_ask(&f, k[0], 20 + WAIT - 1), KVPD_FILL_PENDING);
	assert_int_equal(kvpd_fill_ask(&f, k[0], 20 + WAIT), KVPD_FILL_MISS);
	kvpd_fill_agent(&f, NULL, 0, NULL, 0, NULL, 20 + WAIT + MISS - 1);
	assert_int_equal(kvpd_fill_ask(&f, k[0], 20 + WAIT + MISS - 1), KVPD_FILL_MISS);
	assert_int_equal(kvpd_fill_ask(&f, k[0], 20 + WAIT + MISS), KVPD_FILL_PENDING);
	kvpd_fill_fini(&f);
}

static void
test_fill_absent_misses_for_its_time(void **state)
{
	struct kvpd_fill f;
	uint8_t k[2][KL], out[4 * KL];
	(void)state;
	assert_int_equal(kvpd_fill_init(&f, KL, 8, WAIT, MISS), KVP_OK);
	key(k[0], 7);
	key(k[1], 8);
	kvpd_fill_agent(&f, NULL, 0, NULL, 0, NULL, 100);
	assert_int_equal(kvpd_fill_ask(&f, k[0], 100), KVPD_FILL_PENDING);
	/* One absent key asked about, one never asked (an agent that knows early). */
	assert_int_equal(kvpd_fill_agent(&f, k[0], 2, out, 4, NULL, 110), 0);
	assert_int_equal(kvpd_fill_ask(&f, k[0], 111), KVPD_FILL_MISS);
	assert_int_equal(kvpd_fill_ask(&f, k[1], 111), KVPD_FILL_MISS);
	kvpd_fill_agent(&f, NULL, 0, NULL, 0, NULL, 110 + MISS);
	assert_int_equal(kvpd_fill_ask(&f, k[0], 110 + MISS), KVPD_FILL_PENDING);
	kvpd_fill_fini(&f);
}

static void
test_fill_full_table_misses_and_counts(void **state)
{
	struct kvpd_fill f;
	uint8_t k[KL];
	(void)state;
	assert_int_equal(kvpd_fill_init(&f, KL, 2, WAIT, MISS), KVP_OK);
	kvpd_fill_agent(&f, NULL, 0, NULL, 0, NULL, 5);
	for (uint32_t i = 0; i < 2; i++) {
		key(k, i);
		assert_int_equal(kvpd_fill_ask(&f, k, 5), KVPD_FILL_PENDING);
	}
	key(k, 2);
	assert_int_equal(kvpd_fill_ask(&f, k, 6), KVPD_FILL_MISS);
	assert_int_equal(f.dropped, 1);
	/* Room again once the first keys' wait and miss time are over. */
	kvpd_fill_agent(&f, NULL, 0, NULL, 0, NULL, 5 + WAIT + MISS);
	assert_int_equal(kvpd_fill_ask(&f, k, 5 + WAIT + MISS), KVPD_FILL_PENDING);
	kvpd_fill_fini(&f);
}

static void
test_fill_refuses_bad_sizes(void **state)
{
	struct kvpd_fill f;
	(void)state;
	assert_int_equal(kvpd_fill_init(&f, 4, 8, WAIT, MISS), KVP_EINVAL);
	assert_int_equal(kvpd_fill_init(&f, KL, 0, WAIT, MISS), KVP_EINVAL);
	assert_int_equal(kvpd_fill_init(&f, KL, (1u << 20) + 1, WAIT, MISS), KVP_EINVAL);
	assert_int_equal(kvpd_fill_init(NULL, KL, 8, WAIT, MISS), KVP_EINVAL);
	assert_int_equal(kvpd_fill_agent(&f, NULL, 0, NULL, 4, NULL, 1), 0); /* no table */
	kvpd_fill_fini(&f);
	kvpd_fill_fini(NULL);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fill_no_agent_no_pending),
		cmocka_unit_test(test_fill_wanted_taken_once_in_order),
		cmocka_unit_test(test_fill_absent_misses_for_its_time),
		cmocka_unit_test(test_fill_full_table_misses_and_counts),
		cmocka_unit_test(test_fill_refuses_bad_sizes),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
