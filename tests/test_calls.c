/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The call table (service/rpc/calls.h) against the wire contract: every call the
 * .proto defines has a row of the same name and number, a row is batchable
 * exactly when BatchCall carries it, and every row is counted in /metrics
 * under its name. A call added to kvpool.proto without a row fails here.
 */
#include "kvp_test.h"

#include <stdbool.h>

#include "service/rpc/calls.h"

static bool
is_oneof(const ProtobufCFieldDescriptor *f)
{
	return (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) != 0;
}

static void
test_calls_every_request_field_has_a_row(void **state)
{
	const ProtobufCMessageDescriptor *d = &kvpool__v1__request__descriptor;
	unsigned n = 0;

	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		if (!is_oneof(f))
			continue;
		const struct kvpd_call_op *op = kvpd_call_lookup((int)f->id);
		if (op == NULL)
			fail_msg("Request field %s (%u) has no row in service/rpc/calls.h", f->name, f->id);
		assert_string_equal(op->name, f->name);
		assert_string_equal(kvpd_call_name(kvpd_call_index(op)), f->name);
		n++;
	}
	assert_int_equal(n, KVPD_NUM_CALLS);
}

static void
test_calls_batchable_rows_are_batch_fields(void **state)
{
	const ProtobufCMessageDescriptor *d = &kvpool__v1__batch_call__descriptor;
	unsigned n = 0, rows = 0;

	for (unsigned i = 0; i < d->n_fields; i++) {
		const struct kvpd_call_op *op = kvpd_call_lookup((int)d->fields[i].id);
		/* A slots run is the batch's own (dispatch.c), n AllocateSlots calls. */
		if (d->fields[i].id == KVPOOL__V1__BATCH_CALL__CALL_SLOTS_RUN) {
			assert_null(op);
			continue;
		}
		if (op == NULL || !op->batchable)
			fail_msg("BatchCall field %s is not a batchable row", d->fields[i].name);
		assert_string_equal(op->name, d->fields[i].name);
		n++;
	}
	for (unsigned i = 0; i < kvpool__v1__request__descriptor.n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &kvpool__v1__request__descriptor.fields[i];
		const struct kvpd_call_op *op = is_oneof(f) ? kvpd_call_lookup((int)f->id) : NULL;
		rows += op != NULL && op->batchable;
	}
	assert_int_equal(rows, n);
}

static void
test_calls_unknown_number_has_no_row(void **state)
{
	assert_null(kvpd_call_lookup(0));
	assert_null(kvpd_call_lookup(1));
	assert_null(kvpd_call_lookup(9999));
	assert_null(kvpd_call_name(-1));
	assert_null(kvpd_call_name(KVPD_NUM_CALLS));
}

static void
test_calls_mutating_set_is_the_documented_one(void **state)
{
	/* A mutating call is answered from the reply cache on a retry. */
	static const char *const want[] = {"allocate", "touch", "free", "cache", "evict", "reset",
	                                   "allocate_slots", "free_request", "batch",
	                                   "reserve", "commit", "abort", "lookup_and_lock", "unlock",
	                                   "cache_partial", "move_hashes", "report_cached",
	                                   "cluster_fill"};
	const ProtobufCMessageDescriptor *d = &kvpool__v1__request__descriptor;
	size_t n = 0;
	for (unsigned i = 0; i < d->n_fields; i++) {
		const struct kvpd_call_op *op = kvpd_call_lookup((int)d->fields[i].id);
		if (op == NULL || !(op->flags & KVPD_CALL_MUTATING))
			continue;
		bool listed = false;
		for (size_t k = 0; k < N_ELEMS(want); k++)
			listed |= strcmp(want[k], op->name) == 0;
		if (!listed)
			fail_msg("%s is mutating but not in the documented set", op->name);
		n++;
	}
	assert_int_equal(n, N_ELEMS(want));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_calls_every_request_field_has_a_row),
		cmocka_unit_test(test_calls_batchable_rows_are_batch_fields),
		cmocka_unit_test(test_calls_unknown_number_has_no_row),
		cmocka_unit_test(test_calls_mutating_set_is_the_documented_one),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
