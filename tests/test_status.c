/* SPDX-License-Identifier: Apache-2.0 */
/* The status table: numbers are the wire's, names and text come from one table. */
#include "kvp_test.h"

static void
test_status_numbers_match_wire_contract(void **state)
{
	(void)state;
	/* These numbers are on the wire: changing one is a protocol break. */
	assert_int_equal(KVP_OK, 0);
	assert_int_equal(KVP_EINVAL, 1);
	assert_int_equal(KVP_ENOSPACE, 2);
	assert_int_equal(KVP_ENOTFOUND, 3);
	assert_int_equal(KVP_ESTATE, 4);
	assert_int_equal(KVP_ENOTOWNER, 5);
	assert_int_equal(KVP_EUNKNOWNPOOL, 6);
	assert_int_equal(KVP_EVERSION, 7);
	assert_int_equal(KVP_ETOOLARGE, 8);
	assert_int_equal(KVP_EUNAUTH, 9);
	assert_int_equal(KVP_EBUSY, 10);
	assert_int_equal(KVP_EINTERNAL, 11);
	assert_int_equal(KVP_ERANGE, 12);
	assert_int_equal(KVP_ENOMEM, 13);
	assert_int_equal(KVP_ENOTSUP, 14);
	assert_int_equal(KVP_ENODEVICE, 15);
	assert_int_equal(KVP_EUNAVAILABLE, 16);
}

static void
test_status_every_code_has_name_and_text(void **state)
{
	(void)state;
	for (int s = 0; s < KVP_STATUS_COUNT; s++) {
		assert_string_not_equal(kvp_strerror(s), "unknown status");
		assert_non_null(strstr(kvp_status_name(s), "KVP_"));
		assert_string_not_equal(kvp_status_name(s), "KVP_UNKNOWN");
	}
	assert_string_equal(kvp_status_name(KVP_ENOSPACE), "KVP_ENOSPACE");
	assert_string_equal(kvp_status_wire_name(KVP_ENOTOWNER), "NOT_OWNER");
	assert_string_equal(kvp_status_wire_name(99), "UNKNOWN");
}

static void
test_status_unknown_code_is_named_unknown(void **state)
{
	(void)state;
	assert_string_equal(kvp_strerror(-1), "unknown status");
	assert_string_equal(kvp_strerror(KVP_STATUS_COUNT), "unknown status");
	assert_string_equal(kvp_status_name(9999), "KVP_UNKNOWN");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_status_numbers_match_wire_contract),
		cmocka_unit_test(test_status_every_code_has_name_and_text),
		cmocka_unit_test(test_status_unknown_code_is_named_unknown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
