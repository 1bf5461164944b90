/* SPDX-License-Identifier: Apache-2.0 */
/* The wire contract and the engine agree on every status, by number and by name. */
#include "kvp_test.h"

#include "kvpool.pb-c.h"
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

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_wire_status_names_match_proto_enum),
		cmocka_unit_test(test_wire_keys_round_trip),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
