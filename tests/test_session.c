/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A session's request table (service/session.c): an open-addressing map
 * from the client's request ids to the manager's, against a plain array
 * model through 200,000 seeded adds, removes and lookups (ids chosen to
 * collide), and the newest-first order a session's end releases them in.
 */
#include "kvp_test.h"

#include <stdlib.h>

#include "service/session.h"

#define MODEL 512

static uint64_t rng = 0x2545f4914f6cdd1dull;

static uint64_t
next_rand(void)
{
	return kvp_test_rand(&rng);
}

struct ended {
	uint64_t ids[MODEL];
	size_t n;
};

static void
on_end(void *ctx, uint64_t mgr_id)
{
	struct ended *e = ctx;
	if (e->n < MODEL)
		e->ids[e->n] = mgr_id;
	e->n++;
}

static void
test_session_request_table_matches_a_model(void **state)
{
	struct kvpd_session *s = kvpd_session_create(1, 1000, "test", 0);
	uint64_t client[MODEL], mgr[MODEL], next_mgr = 0;
	size_t n = 0;

	(void)state;
	assert_non_null(s);
	assert_int_equal(kvpd_session_request(s, 5), 0); /* empty table */
	kvpd_session_remove_request(s, 5);               /* absent: no-op */
	assert_status(kvpd_session_add_request(s, 5, 0), KVP_EINVAL);
	for (int op = 0; op < 200000; op++) {
		/* Few distinct ids, several strides: runs of probes and wraparound. */
		uint64_t id = (next_rand() % 700) * (op % 3 == 0 ? 1u : 1024u);
		size_t at = n;
		for (size_t i = 0; i < n; i++)
			if (client[i] == id)
				at = i;
		switch (next_rand() % 3) {
		case 0: /* add when absent */
			if (at == n && n < MODEL) {
				assert_ok(kvpd_session_add_request(s, id, ++next_mgr));
				client[n] = id;
				mgr[n++] = next_mgr;
			}
			break;
		case 1:
			kvpd_session_remove_request(s, id);
			if (at < n) {
				client[at] = client[n - 1];
				mgr[at] = mgr[n - 1];
				n--;
			}
			break;
		default:
			break;
		}
		assert_int_equal(kvpd_session_request(s, id), at < n && client[at] == id ? mgr[at] : 0);
		assert_int_equal(s->num_reqs, n);
	}
	for (size_t i = 0; i < n; i++)
		assert_int_equal(kvpd_session_request(s, client[i]), mgr[i]);
	/* A session's end hands them all over, newest (highest manager id) first. */
	struct ended e = {.n = 0};
	kvpd_session_end_requests(s, on_end, &e);
	assert_int_equal(e.n, n);
	for (size_t i = 1; i < e.n; i++)
		assert_true(e.ids[i - 1] > e.ids[i]);
	assert_int_equal(s->num_reqs, 0);
	for (size_t i = 0; i < n; i++)
		assert_int_equal(kvpd_session_request(s, client[i]), 0);
	e.n = 0;
	kvpd_session_end_requests(s, on_end, &e);
	assert_int_equal(e.n, 0);
	/* The table works again after its end. */
	assert_ok(kvpd_session_add_request(s, 42, 1000));
	assert_int_equal(kvpd_session_request(s, 42), 1000);
	kvpd_session_destroy(s);
	/* A session that never made a request has no table to end. */
	struct kvpd_session *empty = kvpd_session_create(2, 1000, "empty", 0);
	assert_non_null(empty);
	e.n = 0;
	kvpd_session_end_requests(empty, on_end, &e);
	assert_int_equal(e.n, 0);
	kvpd_session_destroy(empty);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_session_request_table_matches_a_model),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
