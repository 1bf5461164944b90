/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vLLM's event wire: spec scenario F5's payload byte for byte (array form,
 * int and bytes hashes), the map form's layout, extra keys as msgpack, and
 * vLLM's endpoint and topic rules.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "common/kvp_status.h"
#include "proto/vllm_wire.h"

static void
unhex(const char *s, uint8_t *out, size_t *n)
{
	*n = 0;
	for (; s[0] && s[1]; s += 2) {
		unsigned v;
		sscanf(s, "%2x", &v);
		out[(*n)++] = (uint8_t)v;
	}
}

static const char H1[] = "c9d58ba695280d69b243e1e0df813136ca9196b286fb1a021e0b2e028ef071cb";
static const char H2[] = "24125b23e68883b5c2141db2959d48433fe6bde2f26bd914efad121d154ab2d6";

/* Scenario F5: Stored(h1, h2; tokens 1..8; bs 4; GPU), Removed(h2), Cleared. */
static void
f5_batch(struct kvp_event_batch *b, const uint8_t *extra, size_t extra_len)
{
	uint8_t h[2][32];
	size_t n;
	int64_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8};

	unhex(H1, h[0], &n);
	unhex(H2, h[1], &n);
	kvp_event_batch_init(b);
	assert_int_equal(kvp_event_batch_reserve(b, 3,
	                                         kvp_event_stored_bytes(2, 32, false, 8, NULL, NULL, "GPU",
	                                                                2 * extra_len) +
	                                                 kvp_event_removed_bytes(32, "GPU")),
	                 KVP_OK);
	struct kvp_stored_desc d = {.hash_len = 32, .token_ids = tok, .num_tokens = 8,
	                            .block_size = 4, .medium = "GPU", .max_hashes = 2};
	kvp_event_stored_begin(b, &d);
	kvp_event_stored_add(b, h[0], extra, extra_len);
	kvp_event_stored_add(b, h[1], extra, extra_len);
	kvp_event_stored_end(b);
	assert_int_equal(kvp_event_batch_set_spec(b, 0, "full_attention", false, 0), KVP_OK);
	kvp_event_append_removed(b, h[1], 32, "GPU", 0);
	kvp_event_append_cleared(b);
}

static void
expect_hex(const struct kvp_vllm_buf *got, const char *hex)
{
	uint8_t want[512];
	size_t n;
	unhex(hex, want, &n);
	if (got->len != n || memcmp(got->data, want, n) != 0) {
		fprintf(stderr, "got %zu bytes: ", got->len);
		for (size_t i = 0; i < got->len; i++)
			fprintf(stderr, "%02x", got->data[i]);
		fprintf(stderr, "\n");
		fail_msg("payload differs from the reference (%zu bytes wanted)", n);
	}
}

static void
test_f5_array_form_int_hashes_is_byte_exact(void **state)
{
	struct kvp_event_batch b;
	struct kvp_vllm_buf out = {0};
	struct kvp_vllm_opts o = {.form = KVP_VLLM_ARRAY};

	(void)state;
	f5_batch(&b, (const uint8_t *)"\xf6", 1);
	assert_int_equal(kvp_vllm_encode(&b, 1700000000.5, 0, &o, &out), KVP_OK);
	assert_int_equal(out.len, 128);
	expect_hex(&out, "93cb41d954fc40200000939cab426c6f636b53746f72656492cf1e0b2e028ef071cbcfefad12"
	                 "1d154ab2d6c098010203040506070804c0a3475055c092c0c000ae66756c6c5f617474656e"
	                 "74696f6ec094ac426c6f636b52656d6f76656491cfefad121d154ab2d6a34750550091b041"
	                 "6c6c426c6f636b73436c656172656400");
	kvp_vllm_buf_fini(&out);
	kvp_event_batch_fini(&b);
}

static void
test_f5_array_form_bytes_hashes_is_byte_exact(void **state)
{
	struct kvp_event_batch b;
	struct kvp_vllm_buf out = {0};
	struct kvp_vllm_opts o = {.form = KVP_VLLM_ARRAY, .hash_bytes = true};

	(void)state;
	f5_batch(&b, (const uint8_t *)"\xf6", 1);
	assert_int_equal(kvp_vllm_encode(&b, 1700000000.5, 0, &o, &out), KVP_OK);
	assert_int_equal(out.len, 203);
	expect_hex(&out,
	           "93cb41d954fc40200000939cab426c6f636b53746f72656492c420c9d58ba695280d69b243e1e0df"
	           "813136ca9196b286fb1a021e0b2e028ef071cbc42024125b23e68883b5c2141db2959d48433fe6bd"
	           "e2f26bd914efad121d154ab2d6c098010203040506070804c0a3475055c092c0c000ae66756c6c5f"
	           "617474656e74696f6ec094ac426c6f636b52656d6f76656491c42024125b23e68883b5c2141db295"
	           "9d48433fe6bde2f26bd914efad121d154ab2d6a34750550091b0416c6c426c6f636b73436c656172"
	           "656400");
	kvp_vllm_buf_fini(&out);
	kvp_event_batch_fini(&b);
}

/*
 * The map form of F5 with extra keys ("L", ("img", -2)) on each block and
 * dp rank 1. The expected bytes are Python msgpack.packb(..., use_bin_type=True)
 * of the equivalent dicts (tests/vllm_golden.py checks the same at test time).
 */
static void
test_f5_map_form_layout(void **state)
{
	struct kvp_event_batch b;
	struct kvp_vllm_buf out = {0};
	struct kvp_vllm_opts o = {.form = KVP_VLLM_MAP};
	/* CBOR ("L", ("img", -2)) */
	static const uint8_t extra[] = {0x82, 0x61, 'L', 0x82, 0x63, 'i', 'm', 'g', 0x21};

	(void)state;
	f5_batch(&b, extra, sizeof(extra));
	assert_int_equal(kvp_vllm_encode(&b, 1700000000.5, 1, &o, &out), KVP_OK);
	expect_hex(&out,
	           "93cb41d954fc40200000938ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368"
	           "657392cf1e0b2e028ef071cbcfefad121d154ab2d6b1706172656e745f626c6f636b5f68617368c0"
	           "a9746f6b656e5f696473980102030405060708aa626c6f636b5f73697a6504a76c6f72615f6964c0"
	           "a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b6579739292a14c92a369"
	           "6d67fe92a14c92a3696d67fea967726f75705f69647800b26b765f63616368655f737065635f6b69"
	           "6e64ae66756c6c5f617474656e74696f6e84a474797065ac426c6f636b52656d6f766564ac626c6f"
	           "636b5f68617368657391cfefad121d154ab2d6a66d656469756da3475055a967726f75705f696478"
	           "0081a474797065b0416c6c426c6f636b73436c656172656401");
	kvp_vllm_buf_fini(&out);
	kvp_event_batch_fini(&b);
}

static void
test_empty_batch_and_bad_extra_keys(void **state)
{
	struct kvp_event_batch b;
	struct kvp_vllm_buf out = {0};
	struct kvp_vllm_opts o = {.form = KVP_VLLM_MAP};

	(void)state;
	kvp_event_batch_init(&b);
	assert_int_equal(kvp_vllm_encode(&b, 0.0, 0, &o, &out), KVP_OK);
	expect_hex(&out, "93cb00000000000000009000");
	kvp_event_batch_fini(&b);
	/* A CBOR map (major 5) is not a key vLLM produces: refused, not guessed. */
	f5_batch(&b, (const uint8_t *)"\xa0", 1);
	assert_int_equal(kvp_vllm_encode(&b, 0.0, 0, &o, &out), KVP_EINVAL);
	kvp_event_batch_fini(&b);
	/* A truncated string. */
	f5_batch(&b, (const uint8_t *)"\x63" "ab", 3);
	assert_int_equal(kvp_vllm_encode(&b, 0.0, 0, &o, &out), KVP_EINVAL);
	kvp_event_batch_fini(&b);
	o.form = 7;
	assert_int_equal(kvp_vllm_encode(&b, 0.0, 0, &o, &out), KVP_EINVAL);
	assert_int_equal(kvp_vllm_encode(NULL, 0.0, 0, &o, &out), KVP_EINVAL);
	kvp_vllm_buf_fini(&out);
}

static void
test_seq_frames(void **state)
{
	uint8_t s[8];
	(void)state;
	kvp_vllm_seq_put(s, 0x0102030405060708ull);
	assert_memory_equal(s, "\x01\x02\x03\x04\x05\x06\x07\x08", 8);
	assert_true(kvp_vllm_seq_get(s) == 0x0102030405060708ull);
	kvp_vllm_seq_put(s, KVP_VLLM_END_SEQ);
	assert_memory_equal(s, "\xff\xff\xff\xff\xff\xff\xff\xff", 8);
}

static void
test_endpoint_rules(void **state)
{
	char ep[64];
	(void)state;
	assert_true(kvp_vllm_binds("tcp://*:5557"));
	assert_true(kvp_vllm_binds("tcp://[::]:5557"));
	assert_true(kvp_vllm_binds("ipc:///tmp/x"));
	assert_true(kvp_vllm_binds("inproc://x"));
	assert_false(kvp_vllm_binds("tcp://10.0.0.1:5557")); /* centralised: connect */
	assert_int_equal(kvp_vllm_offset_endpoint("tcp://*:5557", 0, ep, sizeof(ep)), KVP_OK);
	assert_string_equal(ep, "tcp://*:5557");
	assert_int_equal(kvp_vllm_offset_endpoint("tcp://*:5557", 1, ep, sizeof(ep)), KVP_OK);
	assert_string_equal(ep, "tcp://*:5558");
	assert_int_equal(kvp_vllm_offset_endpoint("tcp://[::1]:5557", 3, ep, sizeof(ep)), KVP_OK);
	assert_string_equal(ep, "tcp://[::1]:5560");
	assert_int_equal(kvp_vllm_offset_endpoint("inproc://ev", 2, ep, sizeof(ep)), KVP_OK);
	assert_string_equal(ep, "inproc://ev_dp2");
	assert_int_equal(kvp_vllm_offset_endpoint("ipc:///tmp/x", 0, ep, sizeof(ep)), KVP_OK);
	assert_int_equal(kvp_vllm_offset_endpoint("ipc:///tmp/x", 1, ep, sizeof(ep)), KVP_EINVAL);
	assert_int_equal(kvp_vllm_offset_endpoint("tcp://*:65535", 1, ep, sizeof(ep)), KVP_EINVAL);
	assert_int_equal(kvp_vllm_offset_endpoint("tcp://*:x", 1, ep, sizeof(ep)), KVP_EINVAL);
	assert_int_equal(kvp_vllm_offset_endpoint("tcp://*:5557", 1, ep, 8), KVP_EINVAL);
}

static void
test_topic_template(void **state)
{
	char t[32];
	(void)state;
	assert_int_equal(kvp_vllm_topic("kv@{pod}@{model}", "p-0", "llama", "default", 1, t,
	                                sizeof(t)), KVP_OK);
	assert_string_equal(t, "kv@p-0@llama");
	assert_int_equal(kvp_vllm_topic("{pool}/{rank}", "p", "m", "ev", 3, t, sizeof(t)), KVP_OK);
	assert_string_equal(t, "ev/3");
	assert_int_equal(kvp_vllm_topic("", "p", "m", "ev", 0, t, sizeof(t)), KVP_OK);
	assert_string_equal(t, "");
	assert_int_equal(kvp_vllm_topic("kv@{podname}", "p", "m", "ev", 0, t, sizeof(t)),
	                 KVP_EINVAL);
	assert_int_equal(kvp_vllm_topic("{model}{model}{model}{model}", "p", "0123456789", "ev", 0, t,
	                                sizeof(t)), KVP_EINVAL);
}

static void
test_payload_as_json(void **state)
{
	struct kvp_event_batch b;
	struct kvp_vllm_buf out = {0}, js = {0};
	struct kvp_vllm_opts o = {.form = KVP_VLLM_MAP};
	static const uint8_t extra[] = {0x82, 0x61, 'L', 0x82, 0x63, 'i', 'm', 'g', 0x21};

	(void)state;
	f5_batch(&b, extra, sizeof(extra));
	assert_int_equal(kvp_vllm_encode(&b, 1700000000.5, 1, &o, &out), KVP_OK);
	assert_int_equal(kvp_vllm_payload_json(out.data, out.len, &js), KVP_OK);
	assert_string_equal((const char *)js.data,
	    "[1700000000.5,[{\"type\":\"BlockStored\",\"block_hashes\":[2164874634404590027,"
	    "17270480062156288726],\"parent_block_hash\":null,\"token_ids\":[1,2,3,4,5,6,7,8],"
	    "\"block_size\":4,\"lora_id\":null,\"medium\":\"GPU\",\"lora_name\":null,"
	    "\"extra_keys\":[[\"L\",[\"img\",-2]],[\"L\",[\"img\",-2]]],\"group_idx\":0,"
	    "\"kv_cache_spec_kind\":\"full_attention\"},{\"type\":\"BlockRemoved\","
	    "\"block_hashes\":[17270480062156288726],\"medium\":\"GPU\",\"group_idx\":0},"
	    "{\"type\":\"AllBlocksCleared\"}],1]");
	assert_int_equal(js.len, strlen((const char *)js.data));
	/* Truncated, or trailing bytes: refused. */
	assert_int_equal(kvp_vllm_payload_json(out.data, out.len - 1, &js), KVP_EINVAL);
	assert_int_equal(kvp_vllm_payload_json((const uint8_t *)"\x90\x90", 2, &js), KVP_EINVAL);
	assert_int_equal(kvp_vllm_payload_json((const uint8_t *)"\xc4\x02\x01\x22", 4, &js),
	                 KVP_OK);
	assert_string_equal((const char *)js.data, "\"0122\"");
	kvp_vllm_buf_fini(&out);
	kvp_vllm_buf_fini(&js);
	kvp_event_batch_fini(&b);
}

/* --dump: F5 with extra keys ("L", ("img", -2)), each form, for tests/vllm_golden.py. */
static int
dump(void)
{
	static const uint8_t extra[] = {0x82, 0x61, 'L', 0x82, 0x63, 'i', 'm', 'g', 0x21};
	struct kvp_event_batch b;
	struct kvp_vllm_buf out = {0};
	const char *names[] = {"map-int", "map-bytes", "array-int", "array-bytes"};

	f5_batch(&b, extra, sizeof(extra));
	for (int k = 0; k < 4; k++) {
		struct kvp_vllm_opts o = {.form = k < 2 ? KVP_VLLM_MAP : KVP_VLLM_ARRAY,
		                          .hash_bytes = k % 2 == 1};
		if (kvp_vllm_encode(&b, 1700000000.5, 1, &o, &out) != KVP_OK)
			return 1;
		printf("%s ", names[k]);
		for (size_t i = 0; i < out.len; i++)
			printf("%02x", out.data[i]);
		printf("\n");
	}
	kvp_vllm_buf_fini(&out);
	kvp_event_batch_fini(&b);
	return 0;
}

int
main(int argc, char **argv)
{
	if (argc == 2 && strcmp(argv[1], "--dump") == 0)
		return dump();
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_f5_array_form_int_hashes_is_byte_exact),
		cmocka_unit_test(test_f5_array_form_bytes_hashes_is_byte_exact),
		cmocka_unit_test(test_f5_map_form_layout),
		cmocka_unit_test(test_empty_batch_and_bad_extra_keys),
		cmocka_unit_test(test_seq_frames),
		cmocka_unit_test(test_endpoint_rules),
		cmocka_unit_test(test_topic_template),
		cmocka_unit_test(test_payload_as_json),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
