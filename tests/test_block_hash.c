/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Block hashing against vLLM's known answers: sha256_cbor (scenarios H0-H7),
 * sha256 (pickle), xxhash and xxhash_cbor.
 */
#include "kvp_test.h"

#include <stdlib.h>

#include "common/block_hash.h"
#include "common/pickle.h"

/* The scenarios' vectors (H0-H7) are vLLM 9aaf83ef5's: plain extra keys. */
static struct kvp_hasher *
seeded(void)
{
	struct kvp_hasher *h = NULL;
	assert_ok(kvp_hasher_create("0", &h));
	assert_ok(kvp_hasher_set_keys_form(h, KVP_KEYS_PLAIN));
	return h;
}

static void
assert_hex(const uint8_t *got, size_t n, const char *hex)
{
	uint8_t want[256];
	size_t wn = kvp_test_unhex(hex, want, sizeof(want));
	assert_int_equal(n, wn);
	if (memcmp(got, want, n) != 0) {
		char g[513];
		for (size_t i = 0; i < n; i++)
			snprintf(g + 2 * i, 3, "%02x", got[i]);
		fail_msg("got %s\nwant %s", g, hex);
	}
}

static void
test_block_hash_h0_none_hash_from_seed(void **state)
{
	struct kvp_hasher *h = seeded();

	(void)state;
	assert_hex(kvp_hasher_none_hash(h), 32,
	           "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e");
	kvp_hasher_destroy(h);
}

static void
test_block_hash_random_none_hash_differs_per_hasher(void **state)
{
	struct kvp_hasher *a = NULL, *b = NULL;

	(void)state;
	assert_ok(kvp_hasher_create(NULL, &a));
	assert_ok(kvp_hasher_create(NULL, &b));
	assert_memory_not_equal(kvp_hasher_none_hash(a), kvp_hasher_none_hash(b), 32);
	kvp_hasher_destroy(a);
	kvp_hasher_destroy(b);
	kvp_hasher_destroy(NULL);
	assert_status(kvp_hasher_create("0", NULL), KVP_EINVAL);
}

static void
test_block_hash_h1_h2_chain_and_event_ids(void **state)
{
	struct kvp_hasher *h = seeded();
	int64_t tok[48];
	uint8_t h1[32], h2[32], h3[32];

	(void)state;
	for (int i = 0; i < 48; i++)
		tok[i] = i;
	assert_ok(kvp_hash_block(h, NULL, tok, 16, NULL, 0, h1));
	assert_hex(h1, 32, "d830de3d42c00f25a2949b5d12d98642664a44872c1614c5b0147556276afc9c");
	assert_int_equal(kvp_hash_event_id(h1, 32), 12687895063098490012ull);
	uint8_t in[128];
	size_t inlen = 0;
	assert_ok(kvp_hash_block_input(h, NULL, tok, 16, NULL, 0, in, sizeof(in), &inlen));
	assert_hex(in, inlen, "8358204e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e"
	                      "90000102030405060708090a0b0c0d0e0ff6");
	assert_ok(kvp_hash_block_input(h, h1, tok + 16, 16, NULL, 0, in, sizeof(in), &inlen));
	assert_hex(in, inlen, "835820d830de3d42c00f25a2949b5d12d98642664a44872c1614c5b0147556276afc9c"
	                      "90101112131415161718181819181a181b181c181d181e181ff6");
	assert_status(kvp_hash_block_input(h, h1, tok, 16, NULL, 0, in, 52, &inlen), KVP_EINVAL);
	assert_ok(kvp_hash_block_input(h, h1, tok, 16, NULL, 0, in, 53, &inlen));
	assert_ok(kvp_hash_block(h, h1, tok + 16, 16, NULL, 0, h2));
	assert_hex(h2, 32, "fedd9e4abebebbe6f6cf96b682f08d316063fe2f22a5c552192dd62904fcccac");
	assert_int_equal(kvp_hash_event_id(h2, 32), 1814341696565857452ull);
	assert_ok(kvp_hash_block(h, h2, tok + 32, 16, NULL, 0, h3));
	assert_hex(h3, 32, "ee4c34c217da17ac84268f864db16efed5fcefe10fcc4a9625a719adc68e654f");
	assert_int_equal(kvp_hash_event_id(h3, 32), 2713165534665270607ull);

	/* The request hasher gives the same chain, 16-token blocks. */
	uint8_t out[3 * 32];
	size_t n = 0;
	assert_ok(kvp_hash_request(h, NULL, tok, 47, 16, NULL, 0, out, 3, &n));
	assert_int_equal(n, 2); /* the partial third block is not hashed */
	assert_memory_equal(out, h1, 32);
	assert_memory_equal(out + 32, h2, 32);
	assert_ok(kvp_hash_request(h, NULL, tok, 48, 16, out, 2, out + 64, 1, &n));
	assert_int_equal(n, 1);
	assert_memory_equal(out + 64, h3, 32);
	kvp_hasher_destroy(h);
}

/* H3: the extra keys tuple ("my-lora", ("aaa", 0), "salt1"), built from a request. */
static void
test_block_hash_h3_extra_keys_bytes_and_digest(void **state)
{
	struct kvp_hasher *h = seeded();
	const struct kvp_mm_feature mm[] = {{"aaa", 0, 4}};
	const struct kvp_request_keys k = {.lora_name = "my-lora", .mm = mm, .num_mm = 1,
	                                   .cache_salt = "salt1"};
	uint8_t buf[128], out[32];
	size_t len = 0;
	int64_t idx = 0;

	(void)state;
	assert_ok(kvp_extra_keys_encode(&k, KVP_KEYS_PLAIN, 0, 4, &idx, buf, sizeof(buf), &len));
	assert_hex(buf, len, "83676d792d6c6f72618263616161006573616c7431");
	assert_ok(kvp_hash_block(h, NULL, (int64_t[]){1, 2, 3, 4}, 4, buf, len, out));
	assert_hex(out, 32, "5748396c1fb6bbd198f3140eb47b377ada812e6e1dcab2fb88ea37306c7f459d");
	assert_int_equal(kvp_hash_event_id(out, 32), 9865758614826730909ull);
	assert_status(kvp_extra_keys_encode(&k, KVP_KEYS_PLAIN, 0, 4, &idx, buf, 8, &len), KVP_EINVAL);
	kvp_hasher_destroy(h);
}

/* H4: every CBOR integer width, negatives, literal parent, negative mm offset. */
static void
test_block_hash_h4_integer_widths_and_negatives(void **state)
{
	struct kvp_hasher *h = seeded();
	uint8_t parent[32], out[32];
	const int64_t tok[] = {0, 23, 24, 255, 256, 65535, 65536, 4294967295LL,
	                       4294967296LL, -1, -24, -25, 151643};
	const uint8_t extra[] = {0x81, 0x82, 0x63, 'b', 'b', 'b', 0x24};

	(void)state;
	for (int i = 0; i < 32; i++)
		parent[i] = (uint8_t)i;
	uint8_t in[256];
	size_t inlen = 0;
	assert_ok(kvp_hash_block_input(h, parent, tok, N_ELEMS(tok), extra, sizeof(extra), in,
	                               sizeof(in), &inlen));
	assert_hex(in, inlen,
	           "835820000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f8d0017"
	           "181818ff19010019ffff1a000100001affffffff1b0000000100000000203738181a0002505b"
	           "81826362626224");
	assert_ok(kvp_hash_block(h, parent, tok, N_ELEMS(tok), extra, sizeof(extra), out));
	assert_hex(out, 32, "90f201423fd50e99a8fed4b73258c98dbf2912772e2e61cf1d57772954e5471f");
	assert_int_equal(kvp_hash_event_id(out, 32), 2114289569475413791ull);
	kvp_hasher_destroy(h);
}

/* H5: request-level chain with LoRA, mm and salt. */
static void
test_block_hash_h5_request_chain_with_lora_mm_salt(void **state)
{
	struct kvp_hasher *h = seeded();
	const struct kvp_mm_feature mm[] = {{"img", 2, 3}};
	const struct kvp_request_keys k = {.lora_name = "L", .mm = mm, .num_mm = 1,
	                                   .cache_salt = "S"};
	int64_t tok[8];
	uint8_t out[2 * 32];
	size_t n = 0;

	(void)state;
	for (int i = 0; i < 8; i++)
		tok[i] = i;
	assert_ok(kvp_hash_request(h, &k, tok, 8, 4, NULL, 0, out, 2, &n));
	assert_int_equal(n, 2);
	assert_hex(out, 32, "2e22a72f505692bd4873ca3d4e0b019404e5cbaa6a9cb18cafba1662ecb8b859");
	assert_hex(out + 32, 32, "ae38ae0968b51d793c445e0331a86d8f5671fb01c02f0db4d90a0c83fd9c2fe9");
	/* From a midpoint: only block 1's tokens, chained from block 0's hash. */
	uint8_t mid[32];
	assert_ok(kvp_hash_chain(h, &k, tok + 4, 4, 4, 1, out, mid, 1, &n));
	assert_int_equal(n, 1);
	assert_memory_equal(mid, out + 32, 32);
	assert_status(kvp_hash_chain(h, &k, tok + 4, 4, 4, 1, NULL, mid, 1, &n), KVP_EINVAL);
	/* Incrementally (block 1 hashed after block 0, mm index -1): same. */
	uint8_t inc[2 * 32];
	assert_ok(kvp_hash_request(h, &k, tok, 4, 4, NULL, 0, inc, 1, &n));
	assert_ok(kvp_hash_request(h, &k, tok, 8, 4, inc, 1, inc + 32, 1, &n));
	assert_memory_equal(inc, out, 64);
	kvp_hasher_destroy(h);
}

/* H6: salt only enters the first block. */
static void
test_block_hash_h6_salt_only_on_first_block(void **state)
{
	struct kvp_hasher *h = seeded();
	const struct kvp_request_keys k = {.cache_salt = "salt1"};
	int64_t tok[8];
	uint8_t out[64];
	size_t n = 0;

	(void)state;
	for (int i = 0; i < 8; i++)
		tok[i] = i;
	assert_ok(kvp_hash_request(h, &k, tok, 8, 4, NULL, 0, out, 2, &n));
	assert_hex(out, 32, "95e6875f935c12800a594290e439ee8ce2d8a9b262ac6b3712e78bfb506376df");
	assert_hex(out + 32, 32, "8e0557308051de46c86ba26e918f54980959cae8a215d11c20c63a7ea516dcfb");
	kvp_hasher_destroy(h);
}

/* Spec 6.6: bs 16, aaa@11+10, bbb@30+18 over three blocks. */
static void
test_block_hash_mm_offsets_relative_to_block_start(void **state)
{
	const struct kvp_mm_feature mm[] = {{"aaa", 11, 10}, {"bbb", 30, 18}};
	const struct kvp_request_keys k = {.mm = mm, .num_mm = 2};
	uint8_t buf[128];
	size_t len;
	int64_t idx = 0;

	(void)state;
	assert_ok(kvp_extra_keys_encode(&k, KVP_KEYS_PLAIN, 0, 16, &idx, buf, sizeof(buf), &len));
	assert_hex(buf, len, "8182636161610b");             /* (("aaa",11),) */
	assert_ok(kvp_extra_keys_encode(&k, KVP_KEYS_PLAIN, 16, 32, &idx, buf, sizeof(buf), &len));
	assert_hex(buf, len, "8282636161612482636262620e"); /* (("aaa",-5),("bbb",14)) */
	assert_ok(kvp_extra_keys_encode(&k, KVP_KEYS_PLAIN, 32, 48, &idx, buf, sizeof(buf), &len));
	assert_hex(buf, len, "818263626262" "21");          /* (("bbb",-2),) */
	assert_ok(kvp_extra_keys_encode(&k, KVP_KEYS_PLAIN, 48, 64, &idx, buf, sizeof(buf), &len));
	assert_hex(buf, len, "f6");
	assert_ok(kvp_extra_keys_encode(NULL, KVP_KEYS_PLAIN, 0, 16, NULL, buf, sizeof(buf), &len));
	assert_hex(buf, len, "f6");
}

/* H7: a coarse key is the concatenation of fine hashes, event id from the last. */
static void
test_block_hash_h7_coarse_key_event_id(void **state)
{
	uint8_t key[68];

	(void)state;
	kvp_test_unhex("d830de3d42c00f25a2949b5d12d98642664a44872c1614c5b0147556276afc9c"
	               "fedd9e4abebebbe6f6cf96b682f08d316063fe2f22a5c552192dd62904fcccac"
	               "00000001", key, sizeof(key));
	assert_int_equal(kvp_hash_event_id(key, 64), 1814341696565857452ull);
	assert_int_equal(kvp_hash_event_id((const uint8_t *)"\x01\x02", 2), 0x0102);
}

static void
test_block_hash_bad_arguments_are_einval(void **state)
{
	struct kvp_hasher *h = seeded();
	uint8_t out[32];
	size_t n;
	const struct kvp_mm_feature unsorted[] = {{"a", 5, 1}, {"b", 1, 1}};
	const struct kvp_mm_feature nullid[] = {{NULL, 0, 1}};
	const struct kvp_mm_feature zerolen[] = {{"a", 0, 0}};
	struct kvp_request_keys k = {.mm = unsorted, .num_mm = 2};
	int64_t tok[8] = {0};

	(void)state;
	assert_status(kvp_hash_block(h, NULL, NULL, 4, NULL, 0, out), KVP_EINVAL);
	assert_status(kvp_hash_block(NULL, NULL, tok, 4, NULL, 0, out), KVP_EINVAL);
	assert_status(kvp_hash_request(h, &k, tok, 8, 4, NULL, 0, out, 1, &n), KVP_EINVAL);
	k.mm = nullid;
	k.num_mm = 1;
	assert_status(kvp_hash_request(h, &k, tok, 8, 4, NULL, 0, out, 1, &n), KVP_EINVAL);
	k.mm = zerolen;
	assert_status(kvp_hash_request(h, &k, tok, 8, 4, NULL, 0, out, 1, &n), KVP_EINVAL);
	assert_status(kvp_hash_request(h, NULL, tok, 8, 0, NULL, 0, out, 1, &n), KVP_EINVAL);
	/* cap too small: nothing written */
	assert_status(kvp_hash_request(h, NULL, tok, 8, 4, NULL, 0, out, 1, &n), KVP_EINVAL);
	kvp_hasher_destroy(h);
}

/* Blocks larger than the encoder's chunk buffer hash the same as a one-shot encode. */
static void
test_block_hash_large_block_crosses_chunk_boundary(void **state)
{
	struct kvp_hasher *h = seeded();
	enum { N = 1000 };
	int64_t *tok = malloc(N * sizeof(*tok));
	uint8_t *enc = malloc(64 + N * 9), got[32], want[32];
	size_t len = 0;

	(void)state;
	for (int i = 0; i < N; i++)
		tok[i] = (int64_t)i * 100003 - 5000000;
	enc[len++] = 0x83;
	enc[len++] = 0x58;
	enc[len++] = 0x20;
	memcpy(enc + len, kvp_hasher_none_hash(h), 32);
	len += 32;
	enc[len++] = 0x99; /* array, 2-byte length */
	enc[len++] = N >> 8;
	enc[len++] = N & 0xff;
	for (int i = 0; i < N; i++) {
		int64_t v = tok[i];
		uint64_t u = v >= 0 ? (uint64_t)v : (uint64_t)(-1 - v);
		uint8_t major = v >= 0 ? 0x00 : 0x20;
		if (u < 24) {
			enc[len++] = major | (uint8_t)u;
		} else if (u <= 0xff) {
			enc[len++] = major | 24;
			enc[len++] = (uint8_t)u;
		} else if (u <= 0xffff) {
			enc[len++] = major | 25;
			enc[len++] = (uint8_t)(u >> 8);
			enc[len++] = (uint8_t)u;
		} else {
			enc[len++] = major | 26;
			for (int s = 24; s >= 0; s -= 8)
				enc[len++] = (uint8_t)(u >> s);
		}
	}
	enc[len++] = 0xf6;
	assert_ok(kvp_hash_raw(h, enc, len, want));
	assert_ok(kvp_hash_block(h, NULL, tok, N, NULL, 0, got));
	assert_memory_equal(got, want, 32);
	free(tok);
	free(enc);
	kvp_hasher_destroy(h);
}

/* Each extra key is at most KVP_MAX_KEY_LEN bytes; one more is refused. */
static void
test_block_hash_keys_longer_than_the_limit_are_refused(void **state)
{
	static char key[KVP_MAX_KEY_LEN + 2];
	struct kvp_mm_feature mm = {.identifier = key, .offset = 0, .length = 1};
	(void)state;
	for (size_t len = KVP_MAX_KEY_LEN; len <= KVP_MAX_KEY_LEN + 1; len++) {
		int want = len > KVP_MAX_KEY_LEN ? KVP_EINVAL : KVP_OK;
		memset(key, 'x', len);
		key[len] = '\0';
		struct kvp_request_keys lora = {.lora_name = key};
		struct kvp_request_keys salt = {.cache_salt = key};
		struct kvp_request_keys ident = {.mm = &mm, .num_mm = 1};
		assert_status(kvp_request_keys_validate(&lora), want);
		assert_status(kvp_request_keys_validate(&salt), want);
		assert_status(kvp_request_keys_validate(&ident), want);
	}
}

/* ---- sha256: SHA-256 of pickle protocol 5 (spec 6.5, scenarios H0-H4) ---- */

static struct kvp_hasher *
seeded_pickle(void)
{
	struct kvp_hasher *h = NULL;
	assert_ok(kvp_hasher_create_algo("0", KVP_HASH_SHA256, &h));
	assert_ok(kvp_hasher_set_keys_form(h, KVP_KEYS_PLAIN)); /* the spec's vectors */
	assert_int_equal(kvp_hasher_algo(h), KVP_HASH_SHA256);
	return h;
}

static void
test_block_hash_sha256_h0_h1_h2_pickle_bytes_and_digests(void **state)
{
	struct kvp_hasher *h = seeded_pickle();
	int64_t tok[32];
	uint8_t h1[32], h2[32], in[256];
	size_t inlen = 0;

	(void)state;
	assert_hex(kvp_hasher_none_hash(h), 32,
	           "1973e23848344dc43a988a9b478663803cfffe1243480253f9a3cf004b14aa7c");
	assert_ok(kvp_pickle_str("0", in, sizeof(in), &inlen));
	assert_hex(in, inlen, "80059505000000000000008c013094" "2e");
	for (int i = 0; i < 32; i++)
		tok[i] = i;
	assert_ok(kvp_hash_block(h, NULL, tok, 16, NULL, 0, h1));
	assert_hex(h1, 32, "6358e31578a64b75ebe28cdb99d3beae65de82a2087321dc6ec84ae048faaaa6");
	assert_ok(kvp_hash_block_input(h, h1, tok + 16, 16, NULL, 0, in, sizeof(in), &inlen));
	assert_hex(in, inlen,
	           "8005954a0000000000000043206358e31578a64b75ebe28cdb99d3beae65de82a2087321dc6ec8"
	           "4ae048faaaa694284b104b114b124b134b144b154b164b174b184b194b1a4b1b4b1c4b1d4b1e"
	           "4b1f74944e87942e");
	assert_ok(kvp_hash_block(h, h1, tok + 16, 16, NULL, 0, h2));
	assert_hex(h2, 32, "3c3c50f324aefbdfbb124dfdc541efac3e94e59c40f4be08afe70601eeca92c8");
	/* The request hasher chains the same way. */
	uint8_t out[64];
	size_t n = 0;
	assert_ok(kvp_hash_request(h, NULL, tok, 32, 16, NULL, 0, out, 2, &n));
	assert_int_equal(n, 2);
	assert_memory_equal(out, h1, 32);
	assert_memory_equal(out + 32, h2, 32);
	/* One byte short of the exact pickle: refused. */
	assert_status(kvp_hash_block_input(h, h1, tok + 16, 16, NULL, 0, in, 84, &inlen),
	              KVP_EINVAL);
	kvp_hasher_destroy(h);
}

static void
test_block_hash_sha256_h3_h4_extra_keys_and_int_widths(void **state)
{
	struct kvp_hasher *h = seeded_pickle();
	const struct kvp_mm_feature mm[] = {{"aaa", 0, 4}};
	const struct kvp_request_keys k = {.lora_name = "my-lora", .mm = mm, .num_mm = 1,
	                                   .cache_salt = "salt1"};
	uint8_t buf[128], out[32], parent[32];
	size_t len = 0;
	int64_t idx = 0;
	const int64_t tok[] = {0, 23, 24, 255, 256, 65535, 65536, 4294967295LL,
	                       4294967296LL, -1, -24, -25, 151643};
	const uint8_t extra[] = {0x81, 0x82, 0x63, 'b', 'b', 'b', 0x24};

	(void)state;
	assert_ok(kvp_extra_keys_encode(&k, KVP_KEYS_PLAIN, 0, 4, &idx, buf, sizeof(buf), &len));
	assert_ok(kvp_hash_block(h, NULL, (int64_t[]){1, 2, 3, 4}, 4, buf, len, out));
	assert_hex(out, 32, "3d90bd638ff50afd3a8e2fba0f24c7532e3c3ad20d5f249d7a588f4d95122e38");
	for (int i = 0; i < 32; i++)
		parent[i] = (uint8_t)i;
	assert_ok(kvp_hash_block(h, parent, tok, N_ELEMS(tok), extra, sizeof(extra), out));
	assert_hex(out, 32, "483fb1af2dffd647d1c4aeb7938ed4c339846987e45eca973f7ae71453f6f1ec");
	/* Extra keys that are not one CBOR item are refused, not hashed. */
	const uint8_t two[] = {0xf6, 0xf6}, cut[] = {0x82, 0x01};
	assert_status(kvp_hash_block(h, parent, tok, 1, two, sizeof(two), out), KVP_EINVAL);
	assert_status(kvp_hash_block(h, parent, tok, 1, cut, sizeof(cut), out), KVP_EINVAL);
	kvp_hasher_destroy(h);
}

/* LONG1 for int64 extremes, as CPython's encode_long writes them. */
static void
test_block_hash_sha256_long1_minimal_twos_complement(void **state)
{
	uint8_t nh[32] = {0}, in[128];
	size_t len = 0;
	const int64_t tok[] = {INT64_MIN, INT64_MAX, -2147483649LL, 2147483648LL,
	                       -549755813888LL};

	(void)state;
	assert_ok(kvp_pickle_block(nh, 32, tok, N_ELEMS(tok), NULL, 0, 0, in, sizeof(in), &len));
	/* pickle.dumps((bytes(32), (-2**63, 2**63-1, -2**31-1, 2**31, -2**39), None), 5) */
	assert_hex(in, len,
	           "80059553000000000000004320000000000000000000000000000000000000000000000000000000"
	           "000000000094288a0800000000000000808a08ffffffffffffff7f8a05ffffff7fff8a0500000080"
	           "008a05000000008074944e87942e");
	assert_status(kvp_pickle_block(nh, 32, tok, N_ELEMS(tok), NULL, 0, 0, in, len - 1, &len),
	              KVP_EINVAL);
	assert_status(kvp_pickle_block(NULL, 32, tok, 1, NULL, 0, 0, in, sizeof(in), &len),
	              KVP_EINVAL);
}

/*
 * vLLM 0.33's tagged extra keys, golden: vLLM 0.33.0's own
 * get_request_block_hasher with PYTHONHASHSEED=0 (tests/vllm/golden_keys.py
 * prints this table). Each case hashes its first tokens, then the rest from
 * the hashes so far, as vLLM extends a request: LoRA (name and path), salt,
 * all three, two images in one block (the pickle refers back to its "mm"
 * tag), a later block's walk starting at the image it is inside (window),
 * and an image that ends where a cached block ends (edge).
 */
enum { LORA, SALT, ALL, MM2, WINDOW, EDGE };
static const struct {
	enum kvp_hash_algo algo;
	int keys;
	const char *hashes;
} tagged_vectors[] = {
	{KVP_HASH_SHA256_CBOR, LORA, "c5078b07c0d1d89abace9419fd9f2ae9ed86b14ef708c0f9c1fb48bd25ab37f32d3039fb9da56c7930d217f73106a4c0fa80bceb0c6a73f261c21fe780c1f8d6"},
	{KVP_HASH_SHA256_CBOR, SALT, "cdc4c6dd4cf6fb662f0bb9d00762f5f2ff4fbd7b92e124a822bceaadccfa4a83cf2f82f18613eaed9199068d9931e4538826703ccad9d7f924eb12e8e4324924"},
	{KVP_HASH_SHA256_CBOR, ALL, "3fc0cb18daaebd7927762b5cd0b8add2e87a28c32dc6794e76f722ddff782bf874f049b8d64653c9afdfeaf7e2fd69246433c4ece2a6fc3bdc9487999e4f96af"},
	{KVP_HASH_SHA256_CBOR, MM2, "5410caf1e1aed6e0ea898ba990a302f44bcb5967fea5f40b6aa7ee8f369080e1ff0f5293cf24a301e9a27485a3892321988d5c113f2b9f4fbbc26ae7d1ed52ed"},
	{KVP_HASH_SHA256_CBOR, WINDOW, "5acac52d2f903609f297322a72bf6a83fdde1e1450f064d66259ac62e44e937107c158859b8effe168964aacd5697133a917bd68b0845379da5c0b137458e45a5ec76100c5fb5a243f9363be37113e847e9146d143f74190e4db6368861871e076ded105b72638ea332ec290aa72cd410f7aa2074577293545672a332a9cfce6"},
	{KVP_HASH_SHA256_CBOR, EDGE, "7f309838dff55603437c9b6d57b7676a4384630cccafe5e066ad32c4da40c15ebed153ddea74514a61e24d9f88d1de361955c07de2bb245b46e929d383456e3c089b2a9d53480e7746d8216eb34a11a957f6d78e7e4e2f00e5038ac6124945c8"},
	{KVP_HASH_SHA256, LORA, "9e9d1ac901c5fedad63567146004951e3a86cb067dea16034bb39302cc8c9bc111172853af0aed9b67c730c3d4f1a541c0e8a387739a42171b2f104f6d8b417b"},
	{KVP_HASH_SHA256, SALT, "35188a6829d5380702f52a10e98e2bfc2fae22ceb8c410a5b2dd67bdb8897cc460aed925444d3f1bbb12180740bc3ec6acc4cd4e855b3c29b7d6ad0925de478e"},
	{KVP_HASH_SHA256, ALL, "40f72ab089bb7a67a38b53e92db3a46f7893c7cbad18a85ee17be8df841037d957357a398692c5a736b392db99d2339ce4ab2964fe52e5f81bdc8f12bd5aa406"},
	{KVP_HASH_SHA256, MM2, "7f8d135c2e7224cd1498e399376b5ba0507c8a1244e8f6d7b3dfe2fab156163c3a42cd67c1a0877c0c7ddf1d67a0bf3ebde7c225c641c05af3f7ab2327fe0aac"},
	{KVP_HASH_SHA256, WINDOW, "24d0f8a31a35f703dd4b456968c90f13ca14e28eb1f5ea9cefb2ada1af82668dd140e21c18a5cdd54ec9a005b3124a74ffe2954fb23fe53ee8593b00699a4d7fb42155f5782210b9c0e672e446edd0cf3129f68cbed2dc36ea242c7552ddedac719d802f898ee9cf19daaae240728f56afa3fa30e83d5627b036b193828d5b9d"},
	{KVP_HASH_SHA256, EDGE, "a99e65fd014bdd568012cae9abd39f876e6119e45408fbb794c1201b18359babcc663cd1095bfdf5a45d7f20e409bd6386baf202b882bceeea4b82c38578bfc6fd810123c9150ace50ab4846557d8d6dbc707606b4947876e1ef645388d54971"},
	{KVP_HASH_XXHASH, LORA, "7bbd54c9eee9ae391ee3992568162cc4d6f45a3f254d22dfc83853e5a0bf7780"},
	{KVP_HASH_XXHASH, SALT, "0b4bb7b8bf6a5ce0a7e8874805152f733ff07b58d63afc1a8c1f393f28f8a1d1"},
	{KVP_HASH_XXHASH, ALL, "ef4b5db4cb7f6da3523b43aa223e60f412f168acfae47c35018b21a8894ff7bf"},
	{KVP_HASH_XXHASH, MM2, "61c6782c752ebe66c0753166f29eb0afd0028bce724854be9478be669e582e55"},
	{KVP_HASH_XXHASH, WINDOW, "b2bf9af9ee77dc8ab253af301dc270c9bf56d173b4171e25f840585473a42a21161d547ed42223ac99d3bb33a76f41dcf6349beac26fedc7ea923fcd1a96cd5a"},
	{KVP_HASH_XXHASH, EDGE, "fceaf4b1f5a0eb93208be896d1b05f051bba1cba9ddc7ec817ae5cefc77052c67163e0fe335c67ffd67ce89876591b85"},
	{KVP_HASH_XXHASH_CBOR, LORA, "20b90a6aa02790e0d3a993a0eb36a8c39bec5901de3904b30dfa9d861622c8ac"},
	{KVP_HASH_XXHASH_CBOR, SALT, "1d92bf207d855080aedc5d9845f4143e1845665c11dfc0581acd897ad4000f01"},
	{KVP_HASH_XXHASH_CBOR, ALL, "b3553114db36d9e58766394ca2fb3661744f0cec3f233daa3bc6eedffe9eb6ce"},
	{KVP_HASH_XXHASH_CBOR, MM2, "54bedc1f57cd041214e85ffad4f8857085ff20bb3ac914eea7d7249c2189d2ee"},
	{KVP_HASH_XXHASH_CBOR, WINDOW, "d0028e626f1fc5f7bd7eaa61280a413ef6e176112708b474243ca5a6f75f489b6de7132a8ad9562106da4941a298f1a56a0187e2f72362a47c0e025051f9fcae"},
	{KVP_HASH_XXHASH_CBOR, EDGE, "c27be5f770d05c678fd392b8defa008b54841fcb97ab1d0b7c2a4909f99243e56f4d3e4b0b2afaea28335ebc285da88d"},
};

static void
test_block_hash_tagged_keys_match_vllm_033(void **state)
{
	static const struct kvp_mm_feature img[] = {{"img", 2, 3}}, two[] = {{"aaa", 0, 1}, {"bbb", 2, 1}},
	                                   win[] = {{"a", 2, 8}, {"b", 10, 2}}, edge[] = {{"img", 8, 8}};
	static const struct {
		struct kvp_request_keys k;
		uint32_t bs;
		size_t first, all;
	} cases[] = {
		[LORA] = {{.lora_name = "L", .lora_path = "/adapters/L"}, 4, 8, 8},
		[SALT] = {{.cache_salt = "S"}, 4, 8, 8},
		[ALL] = {{.lora_name = "L", .lora_path = "/p", .mm = img, .num_mm = 1, .cache_salt = "S"},
		         4, 8, 8},
		[MM2] = {{.mm = two, .num_mm = 2}, 4, 8, 8},
		[WINDOW] = {{.mm = win, .num_mm = 2}, 4, 8, 16},
		[EDGE] = {{.mm = edge, .num_mm = 1}, 8, 8, 24},
	};
	int64_t tok[24];
	uint8_t out[4 * KVP_HASH_LEN];

	(void)state;
	for (int i = 0; i < 24; i++)
		tok[i] = i;
	for (size_t v = 0; v < N_ELEMS(tagged_vectors); v++) {
		const struct kvp_request_keys *k = &cases[tagged_vectors[v].keys].k;
		uint32_t bs = cases[tagged_vectors[v].keys].bs;
		size_t first = cases[tagged_vectors[v].keys].first, all = cases[tagged_vectors[v].keys].all;
		size_t n1 = 0, n2 = 0;
		struct kvp_hasher *h = NULL;
		assert_ok(kvp_hasher_create_algo("0", tagged_vectors[v].algo, &h));
		assert_int_equal(kvp_hasher_keys_form(h), KVP_KEYS_TAGGED); /* a new hasher's */
		size_t hl = kvp_hasher_len(h);
		assert_ok(kvp_hash_request(h, k, tok, first, bs, NULL, 0, out, 4, &n1));
		assert_ok(kvp_hash_request(h, k, tok, all, bs, out, n1, out + n1 * hl, 4 - n1, &n2));
		assert_int_equal(n1 + n2, all / bs);
		assert_hex(out, (n1 + n2) * hl, tagged_vectors[v].hashes);
		kvp_hasher_destroy(h);
	}
}

/* A LoRA name without its path cannot be hashed as vLLM 0.33 hashes it: refused. */
static void
test_block_hash_tagged_lora_without_path_is_einval(void **state)
{
	struct kvp_hasher *h = NULL;
	const struct kvp_request_keys name_only = {.lora_name = "L"}, path_only = {.lora_path = "/p"};
	int64_t tok[4] = {0};
	uint8_t out[32], buf[128];
	size_t n = 0, len = 0;

	(void)state;
	assert_ok(kvp_hasher_create("0", &h));
	assert_status(kvp_hash_request(h, &name_only, tok, 4, 4, NULL, 0, out, 1, &n), KVP_EINVAL);
	assert_status(kvp_request_keys_validate(&path_only), KVP_EINVAL);
	assert_status(kvp_hasher_set_keys_form(h, (enum kvp_keys_form)2), KVP_EINVAL);
	assert_status(kvp_hasher_set_keys_form(NULL, KVP_KEYS_PLAIN), KVP_EINVAL);
	assert_int_equal(kvp_hasher_keys_form(h), KVP_KEYS_TAGGED); /* the refusals changed nothing */
	assert_status(kvp_extra_keys_encode(&name_only, (enum kvp_keys_form)2, 0, 4, NULL, buf,
	                                    sizeof(buf), &len),
	              KVP_EINVAL);
	/* The plain form (9aaf83ef5, and every version's events) needs the name only. */
	assert_ok(kvp_hasher_set_keys_form(h, KVP_KEYS_PLAIN));
	assert_ok(kvp_hash_request(h, &name_only, tok, 4, 4, NULL, 0, out, 1, &n));
	assert_ok(kvp_extra_keys_encode(&name_only, KVP_KEYS_PLAIN, 0, 4, NULL, buf, sizeof(buf),
	                                &len));
	assert_hex(buf, len, "81614c"); /* ("L",) */
	kvp_hasher_destroy(h);
}

/* Both forms of one block's keys, byte for byte: vLLM 0.33's hash input and its event's. */
static void
test_block_hash_tagged_and_event_forms(void **state)
{
	const struct kvp_mm_feature mm[] = {{"img", 2, 3}};
	const struct kvp_request_keys k = {.lora_name = "L", .lora_path = "/p", .mm = mm,
	                                   .num_mm = 1, .cache_salt = "S"};
	uint8_t buf[128];
	size_t len = 0;

	(void)state;
	/* (("lora","L","/p"), ("mm","img",2), ("cache_salt","S")) */
	assert_ok(kvp_extra_keys_encode(&k, KVP_KEYS_TAGGED, 0, 4, NULL, buf, sizeof(buf), &len));
	assert_hex(buf, len, "8383646c6f7261614c622f7083626d6d63696d6702826a63616368655f73616c746153");
	/* to_event_extra_keys: ("L", ("img", 2), "S") */
	assert_ok(kvp_extra_keys_encode(&k, KVP_KEYS_PLAIN, 0, 4, NULL, buf, sizeof(buf), &len));
	assert_hex(buf, len, "83614c8263696d670261" "53");
}

/* An image that ends where a block starts is not that block's (spec 6.6: "at or before"). */
static void
test_block_hash_mm_ending_at_block_start_is_not_in_it(void **state)
{
	const struct kvp_mm_feature mm[] = {{"img", 8, 8}};
	const struct kvp_request_keys k = {.mm = mm, .num_mm = 1};
	uint8_t buf[64];
	size_t len = 0;

	(void)state;
	for (int form = KVP_KEYS_TAGGED; form <= KVP_KEYS_PLAIN; form++) {
		int64_t idx = -1; /* 9aaf83ef5's start for a later block */
		assert_ok(kvp_extra_keys_encode(&k, (enum kvp_keys_form)form, 16, 24, &idx, buf,
		                                sizeof(buf), &len));
		assert_hex(buf, len, "f6");
		idx = 0;
		assert_ok(kvp_extra_keys_encode(&k, (enum kvp_keys_form)form, 16, 24, &idx, buf,
		                                sizeof(buf), &len));
		assert_hex(buf, len, "f6");
	}
}

static void
test_block_hash_algorithm_names_round_trip(void **state)
{
	enum kvp_hash_algo a;
	struct kvp_hasher *h = NULL;

	(void)state;
	assert_ok(kvp_hash_algo_parse("sha256", &a));
	assert_int_equal(a, KVP_HASH_SHA256);
	assert_string_equal(kvp_hash_algo_name(a), "sha256");
	assert_ok(kvp_hash_algo_parse("sha256_cbor", &a));
	assert_int_equal(a, KVP_HASH_SHA256_CBOR);
	assert_ok(kvp_hash_algo_parse("xxhash", &a));
	assert_int_equal(a, KVP_HASH_XXHASH);
	assert_int_equal(kvp_hash_algo_len(a), 16);
	assert_ok(kvp_hash_algo_parse("xxhash_cbor", &a));
	assert_int_equal(a, KVP_HASH_XXHASH_CBOR);
	assert_int_equal(kvp_hash_algo_len(KVP_HASH_SHA256), 32);
	assert_int_equal(kvp_hash_algo_len((enum kvp_hash_algo)7), 0);
	assert_status(kvp_hash_algo_parse("SHA256", &a), KVP_EINVAL);
	assert_status(kvp_hash_algo_parse("xxhash_msgpack", &a), KVP_EINVAL);
	assert_null(kvp_hash_algo_name((enum kvp_hash_algo)7));
	assert_status(kvp_hasher_create_algo("0", (enum kvp_hash_algo)7, &h), KVP_EINVAL);
	assert_null(h);
}

/*
 * vLLM's xxhash and xxhash_cbor with PYTHONHASHSEED=0, from vLLM's own
 * functions (python-xxhash 3.2.0's xxh3_128_digest over pickle.dumps(obj, 5)
 * or cbor2.dumps(obj, canonical=True)): NONE_HASH, blocks range(0,16) and
 * range(16,32) with no extra keys, then with extra keys ("L", "s") and ("L",)
 * (the plain form, as vLLM 9aaf83ef5 hashed them).
 */
static void
test_block_hash_xxhash_vectors(void **state)
{
	static const struct {
		enum kvp_hash_algo algo;
		const char *none, *b0, *b1, *e0, *e1;
	} v[] = {
		{KVP_HASH_XXHASH_CBOR, "1ebe36576dcb573f26b99533a20aaeca",
		 "209f5d549fc07c8e39d823615ede61ce", "03888914ee75b87e89df867a21beb72b",
		 "8b0b08764ecf9967c8354fd80dd6c39a", "8531201cdac34fbdf8cf780802aebc58"},
		{KVP_HASH_XXHASH, "6fb31cc38bba6066183f7f2104b9c051",
		 "8ef953407c0da43eacbb3639ed2bff4d", "5a51cc5ac3a4b1f7d5efd012fb00201a",
		 "a67370d48e3363c7d62dae1ef219a753", "82fe6db667aab795686fb72f679dee16"},
	};
	int64_t tok[32];
	uint8_t out[2 * 16 + 1] = {0}, in[128];
	size_t n = 0, len = 0;
	struct kvp_request_keys keys = {.lora_name = "L", .cache_salt = "s"};

	(void)state;
	for (int i = 0; i < 32; i++)
		tok[i] = i;
	for (size_t i = 0; i < N_ELEMS(v); i++) {
		struct kvp_hasher *h = NULL;
		assert_ok(kvp_hasher_create_algo("0", v[i].algo, &h));
		assert_ok(kvp_hasher_set_keys_form(h, KVP_KEYS_PLAIN)); /* keys as 9aaf83ef5 hashed */
		assert_int_equal(kvp_hasher_len(h), 16);
		assert_int_equal(kvp_hasher_none_len(h), 16);
		assert_hex(kvp_hasher_none_hash(h), 16, v[i].none);
		assert_ok(kvp_hash_request(h, NULL, tok, 32, 16, NULL, 0, out, 2, &n));
		assert_int_equal(n, 2);
		assert_hex(out, 16, v[i].b0);
		assert_hex(out + 16, 16, v[i].b1);
		assert_int_equal(out[32], 0); /* two hashes at a 16-byte stride, nothing past */
		assert_ok(kvp_hash_request(h, &keys, tok, 32, 16, NULL, 0, out, 2, &n));
		assert_hex(out, 16, v[i].e0);
		assert_hex(out + 16, 16, v[i].e1);
		if (v[i].algo == KVP_HASH_XXHASH_CBOR) {
			/* canonical CBOR: a 16-byte parent's head is 0x50, not 0x58 0x10 */
			assert_ok(kvp_hash_block_input(h, out, tok, 1, NULL, 0, in, sizeof(in), &len));
			assert_int_equal(len, 1 + 1 + 16 + 1 + 1 + 1);
			assert_int_equal(in[1], 0x50);
		}
		kvp_hasher_destroy(h);
	}
	/* A block whose encoding spans several chunks streams; the same bytes one-shot agree. */
	enum { BIG = 700 };
	int64_t *big = malloc(BIG * sizeof(*big));
	uint8_t *enc = malloc(BIG * 9 + 64), streamed[16], once[16];
	assert_non_null(big);
	assert_non_null(enc);
	for (int i = 0; i < BIG; i++)
		big[i] = (int64_t)i * 7919;
	for (size_t i = 0; i < N_ELEMS(v); i++) {
		struct kvp_hasher *h = NULL;
		assert_ok(kvp_hasher_create_algo("0", v[i].algo, &h));
		assert_ok(kvp_hash_block(h, NULL, big, BIG, NULL, 0, streamed));
		assert_ok(kvp_hash_block_input(h, NULL, big, BIG, NULL, 0, enc, BIG * 9 + 64, &len));
		assert_true(len > 1024);
		assert_ok(kvp_hash_raw(h, enc, len, once));
		assert_memory_equal(streamed, once, 16);
		kvp_hasher_destroy(h);
	}
	free(big);
	free(enc);
	/* No seed: 32 random bytes, as vLLM's os.urandom(32), then 16-byte hashes. */
	struct kvp_hasher *r = NULL;
	assert_ok(kvp_hasher_create_algo(NULL, KVP_HASH_XXHASH_CBOR, &r));
	assert_int_equal(kvp_hasher_none_len(r), 32);
	assert_ok(kvp_hash_block_input(r, NULL, tok, 1, NULL, 0, in, sizeof(in), &len));
	assert_int_equal(in[1], 0x58);
	assert_int_equal(in[2], 32);
	kvp_hasher_destroy(r);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_block_hash_keys_longer_than_the_limit_are_refused),
		cmocka_unit_test(test_block_hash_h0_none_hash_from_seed),
		cmocka_unit_test(test_block_hash_random_none_hash_differs_per_hasher),
		cmocka_unit_test(test_block_hash_h1_h2_chain_and_event_ids),
		cmocka_unit_test(test_block_hash_h3_extra_keys_bytes_and_digest),
		cmocka_unit_test(test_block_hash_h4_integer_widths_and_negatives),
		cmocka_unit_test(test_block_hash_h5_request_chain_with_lora_mm_salt),
		cmocka_unit_test(test_block_hash_h6_salt_only_on_first_block),
		cmocka_unit_test(test_block_hash_mm_offsets_relative_to_block_start),
		cmocka_unit_test(test_block_hash_h7_coarse_key_event_id),
		cmocka_unit_test(test_block_hash_bad_arguments_are_einval),
		cmocka_unit_test(test_block_hash_large_block_crosses_chunk_boundary),
		cmocka_unit_test(test_block_hash_sha256_h0_h1_h2_pickle_bytes_and_digests),
		cmocka_unit_test(test_block_hash_sha256_h3_h4_extra_keys_and_int_widths),
		cmocka_unit_test(test_block_hash_sha256_long1_minimal_twos_complement),
		cmocka_unit_test(test_block_hash_algorithm_names_round_trip),
		cmocka_unit_test(test_block_hash_tagged_keys_match_vllm_033),
		cmocka_unit_test(test_block_hash_tagged_lora_without_path_is_einval),
		cmocka_unit_test(test_block_hash_tagged_and_event_forms),
		cmocka_unit_test(test_block_hash_mm_ending_at_block_start_is_not_in_it),
		cmocka_unit_test(test_block_hash_xxhash_vectors),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
