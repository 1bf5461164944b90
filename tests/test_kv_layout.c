/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Index math of the executor: scenarios G3 (slot mapping, kernel block
 * split, context parallelism) and G4 (element placement), sizing, shapes.
 */
#include "kvp_test.h"

#include "gpu/executor.h"

static void
assert_slots(const int64_t *got, const int64_t *want, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (got[i] != want[i])
			fail_msg("slot %zu: got %lld, want %lld", i, (long long)got[i],
			         (long long)want[i]);
}

/* G3: block_size 4, rows [[5,9],[2]], query_start_loc [0,7,9], max 12 tokens. */
static void
g3_slot_mapping(void **state)
{
	(void)state;
	const int32_t table[2][2] = {{5, 9}, {2, 0}};
	const uint32_t row_len[2] = {2, 1};
	const int32_t qsl[3] = {0, 7, 9};
	const int64_t pos[9] = {0, 1, 2, 3, 4, 5, 6, 2, 3};
	struct kvp_slot_args a = {.block_table = &table[0][0], .row_stride = 2, .row_len = row_len,
	                          .num_reqs = 2, .query_start_loc = qsl, .positions = pos,
	                          .block_size = 4};
	int64_t out[12];
	const int64_t want[12] = {20, 21, 22, 23, 36, 37, 38, 10, 11, -1, -1, -1};

	assert_ok(kvp_compute_slot_mapping(&a, out, 12));
	assert_slots(out, want, 12);

	/* Without CP the formula is table[r][p/B]*B + p%B, for any position the row covers. */
	for (int64_t p = 0; p < 8; p++) {
		struct kvp_cp none = {0};
		assert_int_equal(kvp_slot_of(table[0], 4, p, &none), table[0][p / 4] * 4 + p % 4);
	}
}

static void
g3_kernel_block_split(void **state)
{
	(void)state;
	int32_t out[8];
	uint32_t m;
	const int32_t a[3] = {0, 1, 2}, b[2] = {7, 3};

	assert_ok(kvp_map_to_kernel_blocks(a, 3, 2, out, 8));
	assert_ids(out, 6, 0, 1, 2, 3, 4, 5);
	assert_ok(kvp_map_to_kernel_blocks(b, 2, 4, out, 8));
	assert_ids(out, 8, 28, 29, 30, 31, 12, 13, 14, 15);

	/* Manager bs 32, kernel bs 16: row [7,3] -> [14,15,6,7]; position 40 -> slot 104. */
	assert_ok(kvp_kernel_block_ratio(32, 16, &m));
	assert_int_equal(m, 2);
	assert_ok(kvp_map_to_kernel_blocks(b, 2, m, out, 8));
	assert_ids(out, 4, 14, 15, 6, 7);
	struct kvp_cp none = {0};
	assert_int_equal(kvp_slot_of(out, 16, 40, &none), 104);
	assert_int_equal(kvp_slot_of(b, 32, 40, &none), 3 * 32 + 8);

	/* Not a multiple: refused; too small an output: refused, nothing written. */
	assert_status(kvp_kernel_block_ratio(32, 12, &m), KVP_EINVAL);
	out[0] = 99;
	assert_status(kvp_map_to_kernel_blocks(b, 2, 4, out, 7), KVP_EINVAL);
	assert_int_equal(out[0], 99);
	const int32_t big[1] = {INT32_MAX / 2};
	assert_status(kvp_map_to_kernel_blocks(big, 1, 4, out, 8), KVP_ERANGE);
}

/* G3 with DCP = 2: row [5,9], positions 0..6, max 8 tokens. */
static void
g3_dcp(void **state)
{
	(void)state;
	const int32_t row[2] = {5, 9};
	const int32_t qsl[2] = {0, 7};
	const int64_t pos[7] = {0, 1, 2, 3, 4, 5, 6};
	const int64_t want[2][2][8] = {
		{{20, -1, 21, -1, 22, -1, 23, -1}, {-1, 20, -1, 21, -1, 22, -1, -1}},
		{{20, 21, -1, -1, 22, 23, -1, -1}, {-1, -1, 20, 21, -1, -1, 22, -1}},
	};
	for (uint32_t il = 1; il <= 2; il++)
		for (uint32_t rank = 0; rank < 2; rank++) {
			struct kvp_slot_args a = {.block_table = row, .row_stride = 2, .num_reqs = 1,
			                          .query_start_loc = qsl, .positions = pos, .block_size = 4,
			                          .cp = {.pcp_world = 1, .dcp_world = 2, .dcp_rank = rank,
			                                 .interleave = il}};
			int64_t out[8];
			assert_ok(kvp_compute_slot_mapping(&a, out, 8));
			assert_slots(out, want[il - 1][rank], 8);
		}
}

static void
slot_mapping_refusals(void **state)
{
	(void)state;
	const int32_t row[2] = {5, 9};
	const int32_t qsl[2] = {0, 2}, bad_qsl[2] = {1, 2};
	const int64_t pos[2] = {7, 8}, neg[2] = {0, -1};
	const uint32_t one[1] = {1}, three[1] = {3};
	int64_t out[4] = {7, 7, 7, 7};
	struct kvp_slot_args a = {.block_table = row, .row_stride = 2, .num_reqs = 1,
	                          .query_start_loc = qsl, .positions = pos, .block_size = 4};

	/* Position 8 needs a third block. */
	assert_status(kvp_compute_slot_mapping(&a, out, 4), KVP_ERANGE);
	/* Only one block of the row is in use: position 7 is past it. */
	a.row_len = one;
	assert_status(kvp_compute_slot_mapping(&a, out, 4), KVP_ERANGE);
	a.row_len = three; /* longer than the row */
	assert_status(kvp_compute_slot_mapping(&a, out, 4), KVP_EINVAL);
	a.row_len = NULL;
	a.positions = neg;
	assert_status(kvp_compute_slot_mapping(&a, out, 4), KVP_ERANGE);
	a.positions = pos;
	a.query_start_loc = bad_qsl;
	assert_status(kvp_compute_slot_mapping(&a, out, 4), KVP_EINVAL);
	a.query_start_loc = qsl;
	assert_status(kvp_compute_slot_mapping(&a, out, 1), KVP_EINVAL); /* 2 tokens, room for 1 */
	a.cp.dcp_world = 2;
	a.cp.dcp_rank = 2;
	assert_status(kvp_compute_slot_mapping(&a, out, 4), KVP_EINVAL);
	a.block_size = 0;
	assert_status(kvp_compute_slot_mapping(&a, out, 4), KVP_EINVAL);
	for (int i = 0; i < 4; i++)
		assert_int_equal(out[i], 7); /* nothing written by any refusal */
	assert_status(kvp_compute_slot_mapping(NULL, out, 4), KVP_EINVAL);
}

/* G4: heads 2, head size 8, fp16 (x = 8), block size 4; slot 6, head 1, dim 5. */
static void
g4_element_placement(void **state)
{
	(void)state;
	struct kvp_kv_shape s = {.num_blocks = 3, .block_size = 4, .num_layers = 1, .num_heads = 2,
	                         .head_size = 8, .dtype = KVP_DTYPE_FP16, .layout = KVP_LAYOUT_NHD};
	struct kvp_kv_strides st = kvp_kv_strides_of(&s);
	uint64_t b = kvp_slot_block(6, 4);
	uint32_t o = kvp_slot_offset(6, 4);

	assert_int_equal(b, 1);
	assert_int_equal(o, 2);
	assert_int_equal(kvp_paged_key_offset(b, o, 1, 5, 2, 8, 4, 16 / 2), 117);
	assert_int_equal(kvp_paged_value_offset(b, o, 1, 5, 2, 8, 4), 118);
	assert_int_equal(kvp_elem_offset(&st, 0, 0, b, o, 1, 5), 109);
	/* V of the same layer starts num_blocks blocks later. */
	assert_int_equal(kvp_elem_offset(&st, 0, 1, b, o, 1, 5), 109 + 3 * 64);

	/* HND: [nb, heads, block_size, head_size]: 1*64 + 1*32 + 2*8 + 5. */
	s.layout = KVP_LAYOUT_HND;
	st = kvp_kv_strides_of(&s);
	assert_int_equal(kvp_elem_offset(&st, 0, 0, b, o, 1, 5), 64 + 32 + 16 + 5);
}

static void
shapes_and_sizing(void **state)
{
	(void)state;
	struct kvp_kv_shape s = {.num_blocks = 10, .block_size = 16, .num_layers = 32,
	                         .num_heads = 8, .head_size = 128, .dtype = KVP_DTYPE_FP16};
	uint32_t n = 0, v;
	char why[128];

	assert_ok(kvp_kv_shape_check(&s, why, sizeof(why)));
	/* vLLM: page = 16 x 8 x 128 x 2 x 2 = 64 KiB per layer; 1 GiB / 64 KiB / 32 = 512. */
	assert_int_equal(kvp_kv_block_bytes(&s), 32ull * 65536);
	assert_ok(kvp_kv_fit_blocks(&s, 1ull << 30, &n));
	assert_int_equal(n, 512);
	assert_status(kvp_kv_fit_blocks(&s, 65536, &n), KVP_ENOSPACE);

	s.head_size = 0;
	assert_status(kvp_kv_shape_check(&s, why, sizeof(why)), KVP_EINVAL);
	assert_non_null(strstr(why, "head size"));
	s.head_size = 128;
	s.dtype = 7;
	assert_status(kvp_kv_shape_check(&s, why, sizeof(why)), KVP_EINVAL);
	s.dtype = KVP_DTYPE_FP32;
	s.num_blocks = 1u << 30;
	s.num_layers = 1024;
	s.num_heads = 1024;
	s.head_size = 4096;
	assert_status(kvp_kv_shape_check(&s, why, sizeof(why)), KVP_EINVAL);

	assert_int_equal(kvp_dtype_parse("bf16", &v), 0);
	assert_int_equal(v, KVP_DTYPE_BF16);
	assert_int_equal(kvp_dtype_parse("fp8", &v), -1);
	assert_int_equal(kvp_cache_layout_parse("hnd", &v), 0);
	assert_int_equal(v, KVP_LAYOUT_HND);
	assert_string_equal(kvp_dtype_name(KVP_DTYPE_FP32), "fp32");
	assert_string_equal(kvp_cache_layout_name(KVP_LAYOUT_NHD), "nhd");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(g3_slot_mapping),
		cmocka_unit_test(g3_kernel_block_split),
		cmocka_unit_test(g3_dcp),
		cmocka_unit_test(slot_mapping_refusals),
		cmocka_unit_test(g4_element_placement),
		cmocka_unit_test(shapes_and_sizing),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
