/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The request manager where vLLM 0.33 differs from 9aaf83ef5, worked out
 * from vLLM 0.33's kv_cache_manager.py and single_type_kv_cache_manager.py
 * (and checked against the installed vLLM by
 * clients/python/tests/vllm033/test_differential.py): skipped blocks freed
 * on the processed-token basis (tokens in flight), and the prompt's partial
 * tail entry in a full-attention group of blocks coarser than the hash's;
 * and a cross-attention group (encoder-decoder models), which 9aaf83ef5's
 * manager had too but kvpool did not.
 */
#include <stdlib.h>
#include <string.h>

#include "mgr_util.h"

#include "common/group_spec.h"
#include "engine/manager.h"

static void
step(struct env *e, uint64_t id, uint32_t n, uint32_t in_flight)
{
	int32_t rows[KVP_MAX_GROUPS][64], *out[KVP_MAX_GROUPS];
	size_t counts[KVP_MAX_GROUPS];
	for (uint32_t g = 0; g < KVP_MAX_GROUPS; g++)
		out[g] = rows[g];
	struct kvp_alloc_args a = {.num_new_tokens = n, .num_in_flight_tokens = in_flight};
	assert_ok(kvp_mgr_allocate_slots(e->mgr, id, &a, out, 64, counts));
}

static void
decode(struct env *e, uint64_t id, int64_t tok, uint32_t in_flight)
{
	assert_ok(kvp_mgr_append_tokens(e->mgr, id, &tok, 1));
	step(e, id, 1, in_flight);
}

/*
 * Async scheduling: a decode scheduled while the prefill is in flight frees
 * nothing (the prefill still reads the window's old blocks); the next one,
 * with nothing in flight, frees what left the window (vLLM 0.33's
 * test_swa_free_waits_for_in_flight_step, on the manager).
 */
static void
test_mgr033_window_waits_for_tokens_in_flight(void **state)
{
	struct env e;
	int64_t tok[32];
	size_t n, free0;
	const int32_t *tbl;

	(void)state;
	for (int i = 0; i < 32; i++)
		tok[i] = i;
	for (int in_flight = 1; in_flight >= 0; in_flight--) {
		env_open_as(&e, 30, 4, "sliding_window:4:8", true, KVP_VLLM_0_33);
		add_tokens(&e, 1, tok, 16);
		step(&e, 1, 16, 0);
		free0 = kvp_pool_num_free(e.pool);
		decode(&e, 1, 16, in_flight ? 16 : 0); /* 16 computed; 16 in flight, or none */
		tbl = table(&e, 1, 0, &n);
		if (in_flight) {
			assert_ids(tbl, n, 1, 2, 3, 4, 5);
			assert_int_equal(kvp_pool_num_free(e.pool), free0 - 1);
		} else {
			assert_ids(tbl, n, 0, 0, 3, 4, 5); /* 16 - 8 + 1 tokens out: 2 blocks */
		}
		decode(&e, 1, 17, 0); /* the prefill landed: 17 processed */
		tbl = table(&e, 1, 0, &n);
		assert_ids(tbl, n, 0, 0, 3, 4, 5);
		assert_int_equal(kvp_pool_num_free(e.pool), free0 + 1);
		/* More in flight than computed frees nothing, and is no error. */
		decode(&e, 1, 18, 1000);
		assert_ok(kvp_mgr_free_request(e.mgr, 1));
		env_close(&e);
	}
}

/* Group 0's BlockStored events: their block sizes, in order, into bs[]. */
static size_t
group0_stored(struct env *e, uint32_t *bs, int64_t *first_tok, size_t cap)
{
	struct kvp_event ev;
	size_t k = 0;

	assert_ok(kvp_mgr_take_events(e->mgr, &e->ev));
	for (size_t i = 0; i < e->ev.count; i++) {
		assert_ok(kvp_event_batch_get(&e->ev, i, &ev));
		if (ev.type != KVP_EVENT_BLOCK_STORED || !ev.has_group_idx || ev.group_idx != 0)
			continue;
		if (k < cap) {
			bs[k] = ev.block_size;
			first_tok[k] = ev.num_tokens ? ev.token_ids[0] : -1;
		}
		k++;
	}
	kvp_event_batch_clear(&e->ev);
	return k;
}

/*
 * Full attention in blocks of 32 beside a sliding window of 16 (hash blocks
 * of 16): a 50-token prompt's last hash boundary below its final token is
 * 48, inside group 0's second block. Once 64 tokens are cached, vLLM 0.33
 * caches that block and then a partial entry for tokens [0, 48): one more
 * BlockStored, of block size 16, naming tokens 32-47. A 9aaf83ef5 pool has
 * no partial entries.
 */
static void
test_mgr033_coarse_full_group_caches_the_prompts_partial_tail(void **state)
{
	enum kvp_vllm_semantics sems[] = {KVP_VLLM_0_33, KVP_VLLM_9AAF83EF5};
	int64_t tok[80], first[8];
	uint32_t bs[8];

	(void)state;
	for (int i = 0; i < 80; i++)
		tok[i] = 1000 + i;
	for (size_t s = 0; s < N_ELEMS(sems); s++) {
		struct env e;
		env_open_as(&e, 40, 16, "full:32+sliding_window:16:32", true, sems[s]);
		add_tokens(&e, 1, tok, 50);
		step(&e, 1, 50, 0);
		assert_int_equal(group0_stored(&e, bs, first, 8), 1); /* block 0, 32 tokens */
		assert_int_equal(bs[0], 32);
		for (int t = 50; t < 63; t++)
			decode(&e, 1, tok[t], 0);
		assert_int_equal(group0_stored(&e, bs, first, 8), 0); /* 63 computed: nothing */
		decode(&e, 1, tok[63], 0);                            /* 64 */
		if (sems[s] == KVP_VLLM_0_33) {
			assert_int_equal(group0_stored(&e, bs, first, 8), 2);
			assert_int_equal(bs[0], 32);
			assert_int_equal(first[0], 1032);
			assert_int_equal(bs[1], 16);
			assert_int_equal(first[1], 1032); /* the entry's last hash block: 32-47 */
		} else {
			assert_int_equal(group0_stored(&e, bs, first, 8), 1);
		}
		decode(&e, 1, tok[64], 0); /* already there: no second event */
		assert_int_equal(group0_stored(&e, bs, first, 8), 0);
		assert_ok(kvp_mgr_free_request(e.mgr, 1));
		env_close(&e);
	}
}

/*
 * An encoder-decoder model (vLLM's CrossAttentionManager): the cross group
 * gets blocks for the encoder's tokens once, the self-attention group for
 * the decoder's; never with prefix caching, never with external tokens.
 */
static void
test_mgr033_cross_attention_allocates_the_encoders_blocks_once(void **state)
{
	struct kvp_group_spec g[KVP_MAX_GROUPS];
	size_t ng = 0, n;
	char err[160];
	int64_t tok[40];
	struct env e;
	int32_t rows[KVP_MAX_GROUPS][64], *out[KVP_MAX_GROUPS];
	size_t counts[KVP_MAX_GROUPS];

	(void)state;
	assert_ok(kvp_group_specs_parse("full:16+cross_attention:16", g, KVP_MAX_GROUPS, &ng, err,
	                                sizeof(err)));
	assert_status(kvp_group_specs_validate(g, ng, 16, true, err, sizeof(err)), KVP_EINVAL);
	assert_non_null(strstr(err, "caching=off"));
	assert_ok(kvp_group_specs_validate(g, ng, 16, false, err, sizeof(err)));
	assert_status(kvp_group_specs_parse("cross_attention:16:4", g, KVP_MAX_GROUPS, &ng, err,
	                                    sizeof(err)), KVP_EINVAL);

	for (int i = 0; i < 40; i++)
		tok[i] = i;
	for (uint32_t k = 0; k < KVP_MAX_GROUPS; k++)
		out[k] = rows[k];
	env_open_as(&e, 12, 16, "full:16+cross_attention:16", false, KVP_VLLM_0_33);
	add_tokens(&e, 1, tok, 20);
	/* More encoder blocks than the pool has: refused, nothing taken. */
	struct kvp_alloc_args a = {.num_new_tokens = 20, .num_encoder_tokens = 16 * 12};
	assert_status(kvp_mgr_allocate_slots(e.mgr, 1, &a, out, 64, counts), KVP_ENOSPACE);
	assert_int_equal(kvp_pool_num_free(e.pool), 11);
	a.num_encoder_tokens = 40;
	assert_ok(kvp_mgr_allocate_slots(e.mgr, 1, &a, out, 64, counts));
	assert_ids(rows[0], counts[0], 1, 2);
	assert_ids(rows[1], counts[1], 3, 4, 5);
	/* Decode: the encoder's blocks stay, none added (with or without its count). */
	decode(&e, 1, 20, 0);
	a = (struct kvp_alloc_args){.num_new_tokens = 1, .num_encoder_tokens = 40};
	assert_ok(kvp_mgr_append_tokens(e.mgr, 1, &(int64_t){21}, 1));
	assert_ok(kvp_mgr_allocate_slots(e.mgr, 1, &a, out, 64, counts));
	assert_int_equal(counts[1], 0);
	const int32_t *tbl = table(&e, 1, 1, &n);
	assert_ids(tbl, n, 3, 4, 5);
	/* External tokens beside a cross group: not supported, nothing changed. */
	add_tokens(&e, 2, tok, 40);
	a = (struct kvp_alloc_args){.num_new_tokens = 8, .num_external_computed_tokens = 16};
	assert_status(kvp_mgr_allocate_slots(e.mgr, 2, &a, out, 64, counts), KVP_ENOTSUP);
	assert_int_equal(kvp_pool_num_free(e.pool), 11 - 5);
	assert_ok(kvp_mgr_free_request(e.mgr, 1));
	assert_ok(kvp_mgr_free_request(e.mgr, 2));
	env_close(&e);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_mgr033_window_waits_for_tokens_in_flight),
		cmocka_unit_test(test_mgr033_coarse_full_group_caches_the_prompts_partial_tail),
		cmocka_unit_test(test_mgr033_cross_attention_allocates_the_encoders_blocks_once),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
