/* SPDX-License-Identifier: Apache-2.0 */
/* The metrics collector against vLLM (scenarios G1, G2) with a fixed clock. */
#include "pool_util.h"

#include "engine/metrics.h"

struct fake_clock {
	uint64_t now_ns;
};

static uint64_t
fake_now(void *ctx)
{
	return ((struct fake_clock *)ctx)->now_ns;
}

#define SEC 1000000000ull

static struct kvp_metrics *
mkmetrics(struct fake_clock *c, double rate, uint32_t n)
{
	struct kvp_metrics_config cfg = {.sample_rate = rate, .num_blocks = n, .clock = fake_now,
	                                 .clock_ctx = c, .seed = 1};
	struct kvp_metrics *m = NULL;
	assert_ok(kvp_metrics_create(&cfg, &m));
	return m;
}

/* G1 */
static void
test_metrics_g1_sample_lifecycle(void **state)
{
	struct fake_clock c = {1 * SEC};
	struct kvp_metrics *m = mkmetrics(&c, 1.0, 8);
	struct kvp_eviction_sample s[4];

	(void)state;
	kvp_metrics_on_allocated(m, 3);
	c.now_ns = 2 * SEC;
	kvp_metrics_on_accessed(m, 3);
	c.now_ns = 3 * SEC;
	kvp_metrics_on_accessed(m, 3);
	c.now_ns = 4 * SEC;
	kvp_metrics_on_evicted(m, 3);
	assert_int_equal(kvp_metrics_drain(m, s, 4), 1);
	assert_true(s[0].lifetime_seconds == 3.0);
	assert_true(s[0].idle_seconds == 1.0);
	assert_int_equal(s[0].num_reuse_gaps, 1);
	assert_true(s[0].reuse_gaps_seconds[0] == 1.0);

	c.now_ns = 1 * SEC;
	kvp_metrics_on_allocated(m, 5);
	c.now_ns = 6 * SEC;
	kvp_metrics_on_evicted(m, 5);
	assert_int_equal(kvp_metrics_drain(m, s, 4), 1);
	assert_true(s[0].lifetime_seconds == 5.0);
	assert_true(s[0].idle_seconds == 5.0);
	assert_int_equal(s[0].num_reuse_gaps, 0);
	/* An untracked block gives no sample. */
	kvp_metrics_on_evicted(m, 6);
	assert_int_equal(kvp_metrics_pending(m), 0);
	kvp_metrics_destroy(m);
}

/* G1: the history keeps the last 4 accesses, so at most 3 gaps. */
static void
test_metrics_g1_history_keeps_last_four(void **state)
{
	struct fake_clock c = {0};
	struct kvp_metrics *m = mkmetrics(&c, 1.0, 2);
	struct kvp_eviction_sample s;

	(void)state;
	kvp_metrics_on_allocated(m, 1);
	const uint64_t at[] = {1, 2, 4, 7, 11, 16}; /* gaps 1 2 3 4 5 */
	for (size_t i = 0; i < N_ELEMS(at); i++) {
		c.now_ns = at[i] * SEC;
		kvp_metrics_on_accessed(m, 1);
	}
	c.now_ns = 20 * SEC;
	kvp_metrics_on_evicted(m, 1);
	assert_int_equal(kvp_metrics_drain(m, &s, 1), 1);
	assert_int_equal(s.num_reuse_gaps, 3);
	assert_true(s.reuse_gaps_seconds[0] == 3.0);
	assert_true(s.reuse_gaps_seconds[1] == 4.0);
	assert_true(s.reuse_gaps_seconds[2] == 5.0);
	assert_true(s.idle_seconds == 4.0);
	assert_true(s.lifetime_seconds == 20.0);
	kvp_metrics_destroy(m);
}

/* G1: sample_rate 0, -0.1, 1.5 are rejected (vLLM asserts). */
static void
test_metrics_g1_bad_rate_is_einval(void **state)
{
	struct fake_clock c = {0};
	struct kvp_metrics_config cfg = {.num_blocks = 4, .clock = fake_now, .clock_ctx = &c};
	struct kvp_metrics *m = NULL;
	const double bad[] = {0.0, -0.1, 1.5};

	(void)state;
	for (size_t i = 0; i < N_ELEMS(bad); i++) {
		cfg.sample_rate = bad[i];
		assert_status(kvp_metrics_create(&cfg, &m), KVP_EINVAL);
	}
	cfg.sample_rate = 0.5;
	cfg.clock = NULL;
	assert_status(kvp_metrics_create(&cfg, &m), KVP_EINVAL);
	assert_null(m);
	kvp_metrics_destroy(NULL);
}

/* G2: the pool's hooks; an uncached block popped by get_new_blocks is a sample. */
static void
test_metrics_g2_pool_hooks_sample_uncached_eviction(void **state)
{
	struct fake_clock c = {1 * SEC};
	struct kvp_metrics *m = mkmetrics(&c, 1.0, 4);
	struct kvp_pool_config cfg = {.num_blocks = 4, .hash_block_size = 4,
	                              .enable_caching = true, .metrics = m};
	struct kvp_pool *p;
	struct kvp_eviction_sample s[4];
	int32_t a[3];

	(void)state;
	assert_ok(kvp_pool_create(&cfg, &p));
	assert_ok(kvp_pool_get_new_blocks(p, 3, a));
	for (int i = 1; i <= 3; i++)
		assert_true(kvp_metrics_is_tracked(m, i));
	assert_false(kvp_metrics_is_tracked(m, 0));
	assert_ok(kvp_pool_free_blocks(p, a, 3));
	c.now_ns = 5 * SEC;
	assert_ok(kvp_pool_get_new_blocks(p, 1, a));
	assert_int_equal(a[0], 1);
	assert_int_equal(kvp_metrics_drain(m, s, 4), 1);
	assert_true(s[0].lifetime_seconds == 4.0);
	for (int i = 1; i <= 3; i++)
		assert_true(kvp_metrics_is_tracked(m, i));
	/* touch records accesses; reset forgets everything. */
	c.now_ns = 6 * SEC;
	assert_ok(kvp_pool_touch(p, (int32_t[]){2}, 1));
	assert_ok(kvp_pool_free_blocks(p, (int32_t[]){2, 1}, 2));
	assert_ok(kvp_pool_reset_prefix_cache(p));
	assert_false(kvp_metrics_is_tracked(m, 1));
	assert_int_equal(kvp_metrics_pending(m), 0);
	kvp_pool_destroy(p);
	kvp_metrics_destroy(m);
}

static double
always_high(void *ctx)
{
	(void)ctx;
	return 0.99;
}

/* Sampling uses the injected random source; pending samples are bounded. */
static void
test_metrics_sampling_and_pending_bound(void **state)
{
	struct fake_clock c = {0};
	struct kvp_metrics_config cfg = {.sample_rate = 0.5, .num_blocks = 4, .clock = fake_now,
	                                 .clock_ctx = &c, .random = always_high};
	struct kvp_metrics *m = NULL;

	(void)state;
	assert_ok(kvp_metrics_create(&cfg, &m));
	kvp_metrics_on_allocated(m, 1);
	assert_false(kvp_metrics_is_tracked(m, 1));
	kvp_metrics_destroy(m);

	cfg.sample_rate = 1.0;
	cfg.max_pending = 2;
	assert_ok(kvp_metrics_create(&cfg, &m));
	for (int i = 0; i < 3; i++) {
		kvp_metrics_on_allocated(m, 1);
		kvp_metrics_on_evicted(m, 1);
	}
	assert_int_equal(kvp_metrics_pending(m), 2);
	assert_int_equal(kvp_metrics_dropped(m), 1);
	kvp_metrics_destroy(m);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_metrics_g1_sample_lifecycle),
		cmocka_unit_test(test_metrics_g1_history_keeps_last_four),
		cmocka_unit_test(test_metrics_g1_bad_rate_is_einval),
		cmocka_unit_test(test_metrics_g2_pool_hooks_sample_uncached_eviction),
		cmocka_unit_test(test_metrics_sampling_and_pending_bound),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
