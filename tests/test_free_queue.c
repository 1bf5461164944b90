/* SPDX-License-Identifier: Apache-2.0 */
/* The free queue against vLLM's FreeKVCacheBlockQueue (scenarios A1, A2). */
#include "kvp_test.h"

#include "engine/free_queue.h"

static size_t
queue_ids(const struct kvp_queue *q, int32_t *out)
{
	size_t n = 0;
	for (int32_t id = kvp_queue_first(q); id >= 0; id = kvp_queue_next(q, id))
		out[n++] = id;
	return n;
}

/* A1 */
static void
test_free_queue_a1_basic_ops_match_vllm(void **state)
{
	struct kvp_block b[5 + 2];
	struct kvp_queue q;
	const int32_t order[] = {0, 1, 2, 3, 4};
	int32_t ids[8];
	size_t n;

	(void)state;
	memset(b, 0, sizeof(b));
	kvp_queue_init(&q, b, 5, order, 5);
	assert_int_equal(q.num_free, 5);
	assert_int_equal(kvp_queue_first(&q), 0);
	assert_int_equal(b[q.tail].prev, 4);

	assert_int_equal(kvp_queue_popleft(&q), 0);
	assert_int_equal(q.num_free, 4);
	assert_ok(kvp_queue_remove(&q, 2));
	n = queue_ids(&q, ids);
	assert_ids(ids, n, 1, 3, 4);
	assert_int_equal(q.num_free, 3);
	assert_ok(kvp_queue_append(&q, 2));
	n = queue_ids(&q, ids);
	assert_ids(ids, n, 1, 3, 4, 2);
	assert_int_equal(q.num_free, 4);
	for (int i = 0; i < 4; i++)
		assert_true(kvp_queue_popleft(&q) >= 0);
	assert_int_equal(q.num_free, 0);
	assert_int_equal(b[q.head].next, q.tail);
	assert_int_equal(b[q.tail].prev, q.head);
	/* vLLM raises ValueError("No free blocks available"). */
	assert_int_equal(kvp_queue_popleft(&q), -1);
	assert_int_equal(q.num_free, 0);
}

/* A2 */
static void
test_free_queue_a2_popleft_n_append_n_match_vllm(void **state)
{
	struct kvp_block b[6 + 2];
	struct kvp_queue q;
	const int32_t order[] = {1, 3, 5, 4, 0, 2};
	int32_t out[8] = {0}, ids[8] = {0};
	size_t n;

	(void)state;
	memset(b, 0, sizeof(b));
	kvp_queue_init(&q, b, 6, order, 6);
	assert_ok(kvp_queue_popleft_n(&q, 0, out));
	assert_int_equal(q.num_free, 6);
	assert_ok(kvp_queue_popleft_n(&q, 1, out));
	assert_ids(out, 1, 1);
	assert_ok(kvp_queue_popleft_n(&q, 2, out));
	assert_ids(out, 2, 3, 5);
	assert_ok(kvp_queue_popleft_n(&q, 3, out));
	assert_ids(out, 3, 4, 0, 2);
	assert_int_equal(q.num_free, 0);
	for (int i = 0; i < 6; i++) {
		assert_int_equal(b[i].prev, KVP_QUEUE_UNLINKED);
		assert_int_equal(b[i].next, KVP_QUEUE_UNLINKED);
	}

	kvp_queue_append_n(&q, NULL, 0);
	assert_int_equal(q.num_free, 0);
	kvp_queue_append_n(&q, (int32_t[]){0}, 1);
	n = queue_ids(&q, ids);
	assert_ids(ids, n, 0);
	kvp_queue_append_n(&q, (int32_t[]){4, 5}, 2);
	n = queue_ids(&q, ids);
	assert_ids(ids, n, 0, 4, 5);
	kvp_queue_append_n(&q, (int32_t[]){1, 2, 3}, 3);
	n = queue_ids(&q, ids);
	assert_ids(ids, n, 0, 4, 5, 1, 2, 3);
	assert_int_equal(q.num_free, 6);

	assert_ok(kvp_queue_remove(&q, 5));
	n = queue_ids(&q, ids);
	assert_ids(ids, n, 0, 4, 1, 2, 3);
	assert_ok(kvp_queue_append(&q, 5));
	n = queue_ids(&q, ids);
	assert_ids(ids, n, 0, 4, 1, 2, 3, 5);
}

static void
test_free_queue_popleft_n_over_count_is_nospace_unchanged(void **state)
{
	struct kvp_block b[3 + 2];
	struct kvp_queue q;
	int32_t out[4], ids[4];

	(void)state;
	kvp_queue_init(&q, b, 3, (int32_t[]){2, 0, 1}, 3);
	assert_status(kvp_queue_popleft_n(&q, 4, out), KVP_ENOSPACE);
	size_t n = queue_ids(&q, ids);
	assert_ids(ids, n, 2, 0, 1);
}

/* The allocation pop: popleft_n's order and links, each block given one holder. */
static void
test_free_queue_take_n_pops_in_order_with_one_holder(void **state)
{
	struct kvp_block b[6 + 2];
	struct kvp_queue q;
	int32_t out[5], ids[6];

	(void)state;
	memset(b, 0, sizeof(b));
	kvp_queue_init(&q, b, 6, (int32_t[]){4, 1, 5, 2, 3}, 5);
	kvp_queue__take_n(&q, 3, out); /* odd counts cross the unrolled loop's groups */
	assert_ids(out, 3, 4, 1, 5);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(b[out[i]].ref_cnt, 1);
		assert_false(kvp_queue_contains(&q, out[i]));
	}
	assert_int_equal(q.num_free, 2);
	size_t n = queue_ids(&q, ids);
	assert_ids(ids, n, 2, 3);
	assert_int_equal(b[2].ref_cnt, 0);
	kvp_queue__take_n(&q, 2, out);
	assert_ids(out, 2, 2, 3);
	assert_int_equal(q.num_free, 0);
	assert_int_equal(kvp_queue_first(&q), -1);
}

/* A2, invalid removal: vLLM raises RuntimeError; we return a status. */
static void
test_free_queue_remove_unlinked_is_notfound(void **state)
{
	struct kvp_block b[3 + 2];
	struct kvp_queue q;

	(void)state;
	kvp_queue_init(&q, b, 3, (int32_t[]){0, 1}, 2);
	assert_status(kvp_queue_remove(&q, 2), KVP_ENOTFOUND);
	assert_int_equal(kvp_queue_popleft(&q), 0);
	assert_status(kvp_queue_remove(&q, 0), KVP_ENOTFOUND);
	assert_int_equal(q.num_free, 1);
	assert_status(kvp_queue_append(&q, 1), KVP_ESTATE);
	assert_int_equal(q.num_free, 1);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_free_queue_a1_basic_ops_match_vllm),
		cmocka_unit_test(test_free_queue_a2_popleft_n_append_n_match_vllm),
		cmocka_unit_test(test_free_queue_popleft_n_over_count_is_nospace_unchanged),
		cmocka_unit_test(test_free_queue_remove_unlinked_is_notfound),
		cmocka_unit_test(test_free_queue_take_n_pops_in_order_with_one_holder),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
