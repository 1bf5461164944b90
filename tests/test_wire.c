/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The wire contract: statuses agree with the engine by number and name, and
 * every encoding proto/ owns (request keys, event batches, the in-place
 * ReadBlocks reply, the per-call limits) round-trips and matches protobuf-c.
 */
#include "kvp_test.h"

#include <stdlib.h>

#include "common/block_hash.h"
#include "kvpool.pb-c.h"
#include "proto/data_wire.h"
#include "proto/event_wire.h"
#include "proto/wire.h"

static void
test_wire_status_names_match_proto_enum(void **state)
{
	const ProtobufCEnumDescriptor *d = &kvpool__v1__status__descriptor;

	(void)state;
	assert_int_equal(d->n_values, KVP_STATUS_COUNT);
	for (int s = 0; s < KVP_STATUS_COUNT; s++) {
		const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(d, s);
		char want[64];
		assert_non_null(v);
		snprintf(want, sizeof(want), "STATUS_%s", kvp_status_wire_name(s));
		assert_string_equal(v->name, want);
		assert_int_equal(kvp_wire_status((Kvpool__V1__Status)s), s);
	}
	assert_int_equal(kvp_wire_status((Kvpool__V1__Status)99), KVP_EINTERNAL);
}

static void
test_wire_keys_round_trip(void **state)
{
	const struct kvp_mm_feature mm[] = {{"img", 2, 3}, {"aud", 9, 4}};
	const struct kvp_request_keys k = {.lora_name = "L", .mm = mm, .num_mm = 2,
	                                   .cache_salt = "S"};
	Kvpool__V1__RequestKeys pk;
	Kvpool__V1__MmFeature msgs[2], *ptrs[2];
	struct kvp_request_keys back;
	struct kvp_mm_feature store[2];
	bool has_id;
	int64_t id;

	(void)state;
	kvp_wire_keys_to_proto(&k, true, 7, &pk, msgs, ptrs);
	assert_ok(kvp_wire_keys_from_proto(&pk, &back, store, 2, &has_id, &id));
	assert_string_equal(back.lora_name, "L");
	assert_string_equal(back.cache_salt, "S");
	assert_int_equal(back.num_mm, 2);
	assert_string_equal(back.mm[1].identifier, "aud");
	assert_int_equal(back.mm[1].offset, 9);
	assert_true(has_id);
	assert_int_equal(id, 7);
	/* Too many features for the caller's room, and unsorted features. */
	assert_status(kvp_wire_keys_from_proto(&pk, &back, store, 1, &has_id, &id), KVP_EINVAL);
	msgs[1].offset = 0;
	assert_status(kvp_wire_keys_from_proto(&pk, &back, store, 2, &has_id, &id), KVP_EINVAL);
}

/* One batch with every event kind and every optional field set somewhere. */
static void
fill_batch(struct kvp_event_batch *b)
{
	static uint8_t h[3][32], parent[32];
	static const int64_t toks[] = {1, 2, 3, 4, 5, 6, 7, 8};
	static const uint8_t none = 0xf6, extra[] = {0x81, 0x61, 0x78}; /* ["x"] */
	for (int i = 0; i < 3; i++)
		memset(h[i], 0x10 + i, 32);
	memset(parent, 0xee, 32);
	struct kvp_stored_desc d = {
		.hash_len = 32, .parent = parent, .token_ids = toks, .num_tokens = 8,
		.block_size = 4, .has_lora_id = true, .lora_id = 7, .lora_name = "adapter",
		.medium = "GPU", .group_idx = 1, .max_hashes = 2,
	};
	assert_ok(kvp_event_batch_reserve(b, 1, kvp_event_stored_bytes(2, 32, true, 8, "adapter",
	                                                                NULL, "GPU", 4)));
	kvp_event_stored_begin(b, &d);
	kvp_event_stored_add(b, h[0], &none, 1);
	kvp_event_stored_add(b, h[1], extra, sizeof(extra));
	kvp_event_stored_end(b);
	assert_ok(kvp_event_batch_set_spec(b, 0, "sliding_window", true, 128));
	assert_ok(kvp_event_batch_reserve(b, 2, kvp_event_removed_bytes(32, NULL)));
	kvp_event_append_removed(b, h[2], 32, NULL, 0);
	kvp_event_append_cleared(b);
}

/* Equal strings, or both NULL (None). */
static void
assert_same_name(const char *a, const char *b)
{
	assert_true((a == NULL) == (b == NULL));
	if (a)
		assert_string_equal(a, b);
}

static void
assert_same_event(const struct kvp_event *a, const struct kvp_event *b)
{
	assert_int_equal(a->type, b->type);
	assert_int_equal(a->num_hashes, b->num_hashes);
	if (a->type == KVP_EVENT_ALL_CLEARED)
		return;
	assert_int_equal(a->hash_len, b->hash_len);
	assert_memory_equal(a->hashes, b->hashes, (size_t)a->num_hashes * a->hash_len);
	assert_int_equal(a->group_idx, b->group_idx);
	assert_same_name(a->medium, b->medium);
	if (a->type == KVP_EVENT_BLOCK_REMOVED)
		return;
	assert_true((a->parent == NULL) == (b->parent == NULL));
	if (a->parent)
		assert_memory_equal(a->parent, b->parent, a->hash_len);
	assert_int_equal(a->num_tokens, b->num_tokens);
	assert_memory_equal(a->token_ids, b->token_ids, a->num_tokens * sizeof(int64_t));
	assert_int_equal(a->block_size, b->block_size);
	assert_int_equal(a->has_lora_id, b->has_lora_id);
	assert_int_equal(a->lora_id, b->lora_id);
	assert_same_name(a->lora_name, b->lora_name);
	assert_same_name(a->session_id, b->session_id);
	assert_int_equal(a->extra_key_offsets[a->num_hashes], b->extra_key_offsets[b->num_hashes]);
	assert_memory_equal(a->extra_keys, b->extra_keys, a->extra_key_offsets[a->num_hashes]);
	assert_same_name(a->spec_kind, b->spec_kind);
	assert_int_equal(a->has_sliding_window, b->has_sliding_window);
	assert_int_equal(a->sliding_window, b->sliding_window);
}

/* The first n events of a and b are the same. */
static void
assert_same_events(const struct kvp_event_batch *a, const struct kvp_event_batch *b, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		struct kvp_event x, y;
		assert_ok(kvp_event_batch_get(a, i, &x));
		assert_ok(kvp_event_batch_get(b, i, &y));
		assert_same_event(&x, &y);
	}
}

static void
test_wire_events_round_trip(void **state)
{
	struct kvp_event_batch in, out;
	struct kvp_wire_batch_hdr h = {.epoch = 42, .seq = 9, .ts_unix_ns = 123456789}, back;
	uint8_t *bytes;
	size_t len;

	(void)state;
	kvp_event_batch_init(&in);
	kvp_event_batch_init(&out);
	fill_batch(&in);
	assert_ok(kvp_wire_events_encode("p0", &h, &in, &bytes, &len));

	/* protobuf-c reads what we wrote, field by field. */
	Kvpool__V1__EventBatch *pb = kvpool__v1__event_batch__unpack(NULL, len, bytes);
	assert_non_null(pb);
	assert_string_equal(pb->pool, "p0");
	assert_int_equal(pb->epoch, 42);
	assert_int_equal(pb->seq, 9);
	assert_int_equal(pb->n_events, 3);
	assert_int_equal(pb->events[0]->event_case, KVPOOL__V1__EVENT__EVENT_STORED);
	const Kvpool__V1__EventStored *st = pb->events[0]->stored;
	assert_int_equal(st->n_hash_ids, 2);
	assert_true(st->hash_ids[1] == kvp_hash_event_id(st->block_hashes.data + 32, 32));
	assert_string_equal(st->spec_kind, "sliding_window");
	assert_int_equal(pb->events[1]->event_case, KVPOOL__V1__EVENT__EVENT_REMOVED);
	assert_int_equal(pb->events[2]->event_case, KVPOOL__V1__EVENT__EVENT_CLEARED);
	kvpool__v1__event_batch__free_unpacked(pb, NULL);

	/* And the decoder gives back the same events. */
	assert_ok(kvp_wire_events_decode(bytes, len, &back, &out));
	assert_int_equal(back.epoch, 42);
	assert_int_equal(back.seq, 9);
	assert_int_equal(back.ts_unix_ns, 123456789);
	assert_false(back.tick);
	assert_int_equal(kvp_event_batch_count(&out), 3);
	assert_same_events(&in, &out, 3);
	free(bytes);
	kvp_event_batch_fini(&in);
	kvp_event_batch_fini(&out);
}

static void
test_wire_events_tick_and_refusals(void **state)
{
	struct kvp_event_batch out;
	struct kvp_wire_batch_hdr h = {.epoch = 5, .seq = 77, .tick = true}, back;
	uint8_t *bytes, junk[] = {0xff, 0xff, 0xff};
	char long_name[KVP_WIRE_EVENTS_MAX_POOL + 2];
	size_t len;

	(void)state;
	kvp_event_batch_init(&out);
	assert_ok(kvp_wire_events_encode("p", &h, NULL, &bytes, &len));
	assert_ok(kvp_wire_events_decode(bytes, len, &back, &out));
	assert_true(back.tick);
	assert_int_equal(back.seq, 77);
	assert_int_equal(kvp_event_batch_count(&out), 0);
	free(bytes);

	memset(long_name, 'a', sizeof(long_name) - 1);
	long_name[sizeof(long_name) - 1] = '\0';
	assert_status(kvp_wire_events_encode(long_name, &h, NULL, &bytes, &len), KVP_EINVAL);
	assert_status(kvp_wire_events_encode(NULL, &h, NULL, &bytes, &len), KVP_EINVAL);
	assert_status(kvp_wire_events_decode(junk, sizeof(junk), &back, &out), KVP_EINVAL);
	assert_status(kvp_wire_events_decode(NULL, 0, &back, &out), KVP_EINVAL);
	assert_string_equal(kvp_wire_spec_kind("mamba"), "mamba");
	assert_string_equal(kvp_wire_spec_kind("no_such_kind"), "unknown");
	assert_null(kvp_wire_spec_kind(""));
	kvp_event_batch_fini(&out);
}

/* A random batch: every event kind, every optional field present or absent, wide values. */
static void
fill_random_batch(struct kvp_event_batch *b, uint64_t *rng)
{
	static const char *const names[] = {NULL, "", "GPU", "adapter-with-a-longer-name"};
	static const char *const kinds[] = {NULL, "full_attention", "sliding_window", "mamba"};
	uint8_t hashes[6][32], parent[32], extra[6][5];
	int64_t toks[200];
	size_t events = kvp_test_rand(rng) % 5;

	for (size_t e = 0; e < events; e++) {
		size_t hl = kvp_test_rand(rng) % 2 ? 32 : 16, nh = 1 + kvp_test_rand(rng) % 6;
		size_t nt = kvp_test_rand(rng) % 3 ? kvp_test_rand(rng) % 200 : 0, xb = 0;
		for (size_t i = 0; i < sizeof(hashes); i++)
			((uint8_t *)hashes)[i] = (uint8_t)kvp_test_rand(rng);
		switch (kvp_test_rand(rng) % 4) {
		case 0:
			kvp_event_batch_reserve(b, 1, 0) == KVP_OK ? kvp_event_append_cleared(b)
			                                           : fail();
			continue;
		case 1: {
			const char *medium = names[kvp_test_rand(rng) % 2 * 2]; /* None or "GPU" */
			assert_ok(kvp_event_batch_reserve(b, 1, kvp_event_removed_bytes(hl, medium)));
			kvp_event_append_removed(b, hashes[0], hl, medium,
			                         (uint32_t)kvp_test_rand_wide(rng));
			continue;
		}
		default:
			break;
		}
		for (size_t t = 0; t < nt; t++) /* some negative: ten bytes each */
			toks[t] = kvp_test_rand(rng) % 8 ? (int64_t)(kvp_test_rand_wide(rng) >> 1)
			                                 : -(int64_t)(kvp_test_rand(rng) % 1000) - 1;
		size_t xl[6];
		for (size_t h = 0; h < nh; h++) {
			xl[h] = 1 + kvp_test_rand(rng) % 5;
			memset(extra[h], (int)(0x80 + h), xl[h]);
			xb += xl[h];
		}
		memset(parent, (int)(kvp_test_rand(rng) & 0xff), sizeof(parent));
		struct kvp_stored_desc d = {
			.hash_len = hl, .parent = kvp_test_rand(rng) % 2 ? parent : NULL,
			.token_ids = toks, .num_tokens = nt,
			.block_size = (uint32_t)kvp_test_rand_wide(rng),
			.has_lora_id = kvp_test_rand(rng) % 2,
			.lora_id = kvp_test_rand(rng) % 3 ? (int64_t)kvp_test_rand_wide(rng) : -7,
			.lora_name = names[kvp_test_rand(rng) % 4],
			.session_id = names[kvp_test_rand(rng) % 4],
			.medium = names[kvp_test_rand(rng) % 3],
			.group_idx = (uint32_t)kvp_test_rand_wide(rng), .max_hashes = nh,
		};
		if (d.lora_name && !d.lora_name[0])
			d.lora_name = NULL; /* "" reads back as None */
		if (d.medium && !d.medium[0])
			d.medium = NULL;
		assert_ok(kvp_event_batch_reserve(b, 1, kvp_event_stored_bytes(
		                                            nh, hl, d.parent != NULL, nt, d.lora_name,
		                                            d.session_id, d.medium, xb)));
		kvp_event_stored_begin(b, &d);
		for (size_t h = 0; h < nh; h++)
			kvp_event_stored_add(b, hashes[h], extra[h], xl[h]);
		kvp_event_stored_end(b);
		int64_t window = kvp_test_rand(rng) % 2 ? (int64_t)kvp_test_rand_wide(rng) : -1;
		assert_ok(kvp_event_batch_set_spec(b, kvp_event_batch_count(b) - 1,
		                                   kinds[kvp_test_rand(rng) % 4],
		                                   kvp_test_rand(rng) % 2, window));
	}
}

/*
 * The hand-written encoder's bytes are protobuf-c's: protobuf-c re-packs what
 * it reads of them to the same bytes (so every field is where and as
 * protobuf-c puts it), and the decoder gives back the batch that went in.
 */
static void
test_wire_events_encoding_is_protobuf_cs(void **state)
{
	static const char *const pools[] = {"", "p", "a-pool-name-of-some-length"};
	uint64_t rng = 0x9e3779b97f4a7c15u;
	struct kvp_event_batch in, out;

	(void)state;
	kvp_event_batch_init(&in);
	kvp_event_batch_init(&out);
	for (int round = 0; round < 2000; round++) {
		struct kvp_wire_batch_hdr h = {
			.epoch = kvp_test_rand_wide(&rng), .seq = kvp_test_rand_wide(&rng),
			.ts_unix_ns = kvp_test_rand_wide(&rng), .tick = kvp_test_rand(&rng) % 8 == 0,
		}, back;
		const char *pool = pools[kvp_test_rand(&rng) % 3];
		uint8_t *bytes, *again;
		size_t len;

		kvp_event_batch_clear(&in);
		fill_random_batch(&in, &rng);
		assert_ok(kvp_wire_events_encode(pool, &h, &in, &bytes, &len));
		Kvpool__V1__EventBatch *pb = kvpool__v1__event_batch__unpack(NULL, len, bytes);
		assert_non_null(pb);
		assert_int_equal(kvpool__v1__event_batch__get_packed_size(pb), len);
		assert_non_null(again = malloc(len ? len : 1));
		assert_int_equal(kvpool__v1__event_batch__pack(pb, again), len);
		assert_memory_equal(again, bytes, len);
		kvpool__v1__event_batch__free_unpacked(pb, NULL);
		free(again);

		assert_ok(kvp_wire_events_decode(bytes, len, &back, &out));
		assert_true(back.epoch == h.epoch && back.seq == h.seq &&
		            back.ts_unix_ns == h.ts_unix_ns && back.tick == h.tick);
		size_t n = h.tick ? 0 : kvp_event_batch_count(&in);
		assert_int_equal(kvp_event_batch_count(&out), n);
		assert_same_events(&in, &out, n);
		free(bytes);
	}
	kvp_event_batch_fini(&in);
	kvp_event_batch_fini(&out);
}

/* protobuf-c's bytes for a successful ReadBlocks reply. */
static uint8_t *
pb_read_reply(uint64_t call_id, const uint8_t *payload, size_t plen, uint32_t *crcs, size_t n,
              size_t *len)
{
	Kvpool__V1__Reply r = KVPOOL__V1__REPLY__INIT;
	Kvpool__V1__ReadBlocksReply rb = KVPOOL__V1__READ_BLOCKS_REPLY__INIT;
	rb.payload.data = (uint8_t *)payload;
	rb.payload.len = plen;
	rb.crc32c = crcs;
	rb.n_crc32c = n;
	r.call_id = call_id;
	r.result_case = KVPOOL__V1__REPLY__RESULT_READ_BLOCKS;
	r.read_blocks = &rb;
	*len = kvpool__v1__reply__get_packed_size(&r);
	uint8_t *b = malloc(*len);
	assert_non_null(b);
	kvpool__v1__reply__pack(&r, b);
	return b;
}

static void
test_wire_read_reply_matches_protobuf_c(void **state)
{
	const uint64_t bb = 200, call_ids[] = {0, 1, 300, 1ull << 40};
	const size_t counts[] = {1, 3, 700};

	(void)state;
	for (size_t ci = 0; ci < N_ELEMS(call_ids); ci++) {
		for (size_t ni = 0; ni < N_ELEMS(counts); ni++) {
			size_t n = counts[ni], want_len, len;
			uint8_t *payload = malloc(n * bb), *pl;
			uint32_t *crcs = malloc(n * sizeof(*crcs));
			assert_non_null(payload);
			assert_non_null(crcs);
			for (size_t i = 0; i < n * bb; i++)
				payload[i] = (uint8_t)(i * 7 + ni);
			for (size_t i = 0; i < n; i++)
				crcs[i] = 0x01020304u * (uint32_t)(i + 1);
			uint8_t *want = pb_read_reply(call_ids[ci], payload, n * bb, crcs, n, &want_len);

			/* The writer gives protobuf-c's bytes. */
			len = kvp_wire_read_reply_size(call_ids[ci], n, bb);
			assert_int_equal(len, want_len);
			uint8_t *got = malloc(len), *p;
			assert_non_null(got);
			p = kvp_wire_read_reply_begin(got, call_ids[ci], n, bb, &pl);
			memcpy(pl, payload, n * bb);
			for (size_t i = 0; i < n; i++)
				p = kvp_wire_put_crc(p, crcs[i]);
			assert_int_equal((size_t)(p - got), len);
			assert_memory_equal(got, want, len);

			/* The parser finds payload and checksums in protobuf-c's bytes. */
			const uint8_t *fp, *fc;
			uint64_t fpl, fcl;
			assert_true(kvp_wire_read_reply_parse(want, want_len, call_ids[ci], &fp, &fpl,
			                                      &fc, &fcl));
			assert_int_equal(fpl, n * bb);
			assert_memory_equal(fp, payload, n * bb);
			assert_int_equal(fcl, 4 * n);
			for (size_t i = 0; i < n; i++)
				assert_int_equal(kvp_wire_get_crc(fc, i), crcs[i]);
			/* Cut anywhere, it is refused, never read past. */
			for (size_t cut = 1; cut < want_len && cut < 64; cut++)
				assert_false(kvp_wire_read_reply_parse(want, want_len - cut, call_ids[ci],
				                                       &fp, &fpl, &fc, &fcl));
			free(got);
			free(want);
			free(payload);
			free(crcs);
		}
	}
}

static void
test_wire_read_reply_parse_refuses_other_shapes(void **state)
{
	Kvpool__V1__Reply r = KVPOOL__V1__REPLY__INIT;
	uint8_t buf[256], payload[8] = {1, 2, 3, 4, 5, 6, 7, 8}, *b;
	uint32_t crc = 99;
	const uint8_t *fp, *fc;
	uint64_t fpl, fcl;
	size_t len;

	(void)state;
	/* An error status. */
	r.call_id = 5;
	r.status = KVPOOL__V1__STATUS__STATUS_NOT_OWNER;
	r.detail = "no";
	len = kvpool__v1__reply__pack(&r, buf);
	assert_false(kvp_wire_read_reply_parse(buf, len, 5, &fp, &fpl, &fc, &fcl));
	/* Another call's reply. */
	b = pb_read_reply(6, payload, sizeof(payload), &crc, 1, &len);
	assert_false(kvp_wire_read_reply_parse(b, len, 5, &fp, &fpl, &fc, &fcl));
	assert_true(kvp_wire_read_reply_parse(b, len, 6, &fp, &fpl, &fc, &fcl));
	free(b);
	/* Another result. */
	Kvpool__V1__Reply s = KVPOOL__V1__REPLY__INIT;
	Kvpool__V1__StatsReply st = KVPOOL__V1__STATS_REPLY__INIT;
	s.result_case = KVPOOL__V1__REPLY__RESULT_STATS;
	s.stats = &st;
	len = kvpool__v1__reply__pack(&s, buf);
	assert_false(kvp_wire_read_reply_parse(buf, len, 0, &fp, &fpl, &fc, &fcl));
	/* Unpacked checksums (field 2, fixed32): the slow path decodes them. */
	const uint8_t unpacked[] = {0xe2, 0x01, 0x0f, 0x0a, 0x08, 1, 2, 3, 4, 5, 6, 7, 8,
	                            0x15, 99, 0, 0, 0};
	assert_false(kvp_wire_read_reply_parse(unpacked, sizeof(unpacked), 0, &fp, &fpl, &fc,
	                                       &fcl));
	assert_false(kvp_wire_read_reply_parse(NULL, 0, 0, &fp, &fpl, &fc, &fcl));
}

static void
test_wire_units_per_call(void **state)
{
	(void)state;
	assert_int_equal(kvp_wire_units_per_call(KVP_WIRE_ENVELOPE, 0, 1), 0);
	assert_int_equal(kvp_wire_units_per_call(KVP_WIRE_ENVELOPE + 100, 0, 10), 10);
	assert_int_equal(kvp_wire_units_per_call(KVP_WIRE_ENVELOPE + 100, 4, 10), 4);
	assert_int_equal(kvp_wire_units_per_call(1u << 20, 0, 0), 0);
	assert_int_equal(kvp_wire_blocks_per_call(KVP_WIRE_ENVELOPE + 1000, 0, 84), 10);
	/* The writer's own bytes for the most a call may carry fit the message. */
	uint64_t bb = 4096, most = kvp_wire_blocks_per_call(KVP_WIRE_DEFAULT_MAX_MSG, 0, bb);
	assert_true(most > 0);
	assert_true(kvp_wire_read_reply_size(UINT64_MAX, most, bb) <= KVP_WIRE_DEFAULT_MAX_MSG);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_wire_status_names_match_proto_enum),
		cmocka_unit_test(test_wire_keys_round_trip),
		cmocka_unit_test(test_wire_events_round_trip),
		cmocka_unit_test(test_wire_events_tick_and_refusals),
		cmocka_unit_test(test_wire_events_encoding_is_protobuf_cs),
		cmocka_unit_test(test_wire_read_reply_matches_protobuf_c),
		cmocka_unit_test(test_wire_read_reply_parse_refuses_other_shapes),
		cmocka_unit_test(test_wire_units_per_call),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
