/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A session's request table (service/rpc/session.c): an open-addressing map
 * from the client's request ids to the manager's, against a plain array
 * model through 200,000 seeded adds, removes and lookups (ids chosen to
 * collide), and the newest-first order a session's end releases them in;
 * its block references against a model through log compactions and takes;
 * and the
 * map under it (service/rpc/u64map.h) at its edges.
 */
#include "kvp_test.h"

#include <stdlib.h>

#include "service/rpc/session.h"

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
		assert_int_equal(s->reqs.n, n);
	}
	for (size_t i = 0; i < n; i++)
		assert_int_equal(kvpd_session_request(s, client[i]), mgr[i]);
	/* A session's end hands them all over, newest (highest manager id) first. */
	struct ended e = {.n = 0};
	kvpd_session_end_requests(s, on_end, &e);
	assert_int_equal(e.n, n);
	for (size_t i = 1; i < e.n; i++)
		assert_true(e.ids[i - 1] > e.ids[i]);
	assert_int_equal(s->reqs.n, 0);
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

/* u64map: a replace does not add, 0 is no value, a delete says what it removed. */
static void
test_session_u64map_edges(void **state)
{
	struct kvpd_u64map m = {0};

	(void)state;
	assert_int_equal(kvpd_u64map_get(&m, 7), 0);
	assert_int_equal(kvpd_u64map_del(&m, 7), 0);
	assert_status(kvpd_u64map_put(&m, 7, 0), KVP_EINVAL);
	assert_int_equal(m.n, 0);
	assert_ok(kvpd_u64map_put(&m, 7, 1));
	assert_ok(kvpd_u64map_put(&m, 7, 2));
	assert_int_equal(m.n, 1);
	assert_int_equal(kvpd_u64map_get(&m, 7), 2);
	/* Key 0 and the largest key are keys like any other. */
	assert_ok(kvpd_u64map_put(&m, 0, 5));
	assert_ok(kvpd_u64map_put(&m, UINT64_MAX, 6));
	for (uint64_t k = 100; k < 1100; k++) /* grows several times */
		assert_ok(kvpd_u64map_put(&m, k << 40, k));
	assert_int_equal(m.n, 1003);
	assert_true(2 * m.n <= m.cap);
	assert_int_equal(kvpd_u64map_get(&m, 0), 5);
	assert_int_equal(kvpd_u64map_get(&m, UINT64_MAX), 6);
	for (uint64_t k = 100; k < 1100; k += 2)
		assert_int_equal(kvpd_u64map_del(&m, k << 40), k);
	for (uint64_t k = 100; k < 1100; k++)
		assert_int_equal(kvpd_u64map_get(&m, k << 40), k % 2 ? k : 0);
	assert_int_equal(kvpd_u64map_del(&m, 7), 2);
	assert_int_equal(m.n, 502);
	kvpd_u64map_clear(&m);
	assert_int_equal(m.n, 0);
	assert_int_equal(kvpd_u64map_get(&m, 0), 0);
	kvpd_u64map_fini(&m);
	assert_null(m.v);
}

struct released {
	int32_t ids[4096];
	size_t n;
};

static int
release_one(void *ctx, int32_t id)
{
	struct released *r = ctx;
	if (r->n < 4096)
		r->ids[r->n] = id;
	r->n++;
	return KVP_OK;
}

/*
 * Block references against a model: the acquisition order, where a release
 * drops the id's oldest entry (an id's held references are its newest log
 * entries). Add/remove churn compacts the log many times over (and grows
 * and rehashes the table); at the end, releasing everything gives the
 * model's order reversed, every held count matching on the way.
 */
static void
test_session_refs_survive_log_compaction(void **state)
{
	struct kvpd_session *s = kvpd_session_create(3, 1000, "refs", 0);
	static int32_t model[4096];
	static struct released rel;
	size_t n = 0;
	uint64_t pool_held = 0;

	(void)state;
	assert_non_null(s);
	s->pool_held = &pool_held;
	for (int op = 0; op < 60000; op++) {
		int32_t id = (int32_t)(next_rand() % 300) * (op % 2 ? 1 : 977);
		if (op % 7 == 0) { /* a take of a short list, repeats and the skipped id included */
			int32_t list[6], skip = -5;
			size_t len = 1 + next_rand() % 6, fail = len;
			static int32_t trial[4096];
			size_t tn = n;
			memcpy(trial, model, n * sizeof(*model));
			for (size_t k = 0; k < len; k++)
				list[k] = next_rand() % 4 == 0 ? skip
				          : next_rand() % 2 ? model[next_rand() % (n ? n : 1)]
				                            : (int32_t)(next_rand() % 300);
			for (size_t k = 0; k < len && fail == len; k++) {
				size_t at = tn;
				for (size_t i = 0; i < tn && at == tn; i++)
					if (trial[i] == list[k])
						at = i;
				if (list[k] == skip)
					continue;
				if (at == tn)
					fail = k;
				else
					memmove(trial + at, trial + at + 1, (--tn - at) * sizeof(*trial));
			}
			assert_int_equal(kvpd_session_take(s, list, len, skip), fail);
			if (fail == len && next_rand() % 3 == 0) {
				kvpd_session_untake(s, list, len, skip); /* as if the engine refused */
			} else if (fail == len) {
				memcpy(model, trial, tn * sizeof(*model));
				n = tn;
			}
			assert_int_equal(s->held, n);
			assert_int_equal(pool_held, n);
			continue;
		}
		if (next_rand() % 2 == 0 && n < 2000) {
			assert_ok(kvpd_session_reserve(s, 1));
			kvpd_session_add(s, id);
			model[n++] = id;
		} else {
			size_t at = n;
			for (size_t i = 0; i < n && at == n; i++) /* the oldest entry */
				if (model[i] == id)
					at = i;
			kvpd_session_remove(s, id);
			if (at < n) {
				memmove(model + at, model + at + 1, (n - at - 1) * sizeof(*model));
				n--;
			}
		}
		uint32_t want = 0;
		for (size_t i = 0; i < n; i++)
			want += model[i] == id;
		assert_int_equal(kvpd_session_held(s, id), want);
		assert_int_equal(s->held, n);
		assert_int_equal(pool_held, n);
		assert_true(s->log_len >= n);
		if (op % 97 == 0) { /* the whole table: every id's count, only held ids in slots */
			uint32_t distinct = 0;
			for (int32_t k = 0; k < 300; k++) {
				for (int32_t mult = 1; mult <= 977; mult += 976) {
					uint32_t cnt = 0;
					for (size_t i = 0; i < n; i++)
						cnt += model[i] == k * mult;
					assert_int_equal(kvpd_session_held(s, k * mult), cnt);
					distinct += cnt > 0 && (k > 0 || mult == 1);
				}
			}
			assert_int_equal(s->used, distinct);
			assert_true(2 * (uint64_t)s->used <= s->cap);
		}
	}
	rel.n = 0;
	while (kvpd_session_release_some(s, 7, release_one, &rel) > 0)
		;
	assert_int_equal(rel.n, n);
	for (size_t i = 0; i < n; i++)
		assert_int_equal(rel.ids[i], model[n - 1 - i]);
	assert_int_equal(s->held, 0);
	assert_int_equal(pool_held, 0);
	assert_int_equal(s->used, 0); /* every id left the table as its count reached 0 */
	assert_ok(kvpd_session_reserve(s, 1));
	assert_int_equal(s->cap, 64); /* and the table shrank back */
	kvpd_session_destroy(s);
}

/*
 * A session that cycles through a large pool's blocks, holding few at a
 * time, keeps a table the size of what it holds: released ids' slots are
 * dropped when the table is rebuilt, and the rebuilt table is sized by the
 * references still held, not by the slots in use.
 */
static void
test_session_table_follows_what_is_held(void **state)
{
	(void)state;
	struct kvpd_session *s = kvpd_session_create(1, 1000, "t", 0);
	assert_non_null(s);
	for (int32_t id = 0; id < 200000; id++) {
		assert_int_equal(kvpd_session_reserve(s, 1), KVP_OK);
		kvpd_session_add(s, id);
		if (id >= 16) /* hold the last 16 */
			kvpd_session_remove(s, id - 16);
	}
	assert_int_equal(s->held, 16);
	for (int32_t id = 200000 - 16; id < 200000; id++)
		assert_int_equal(kvpd_session_held(s, id), 1);
	assert_int_equal(kvpd_session_held(s, 200000 - 17), 0);
	assert_true(s->cap <= 256);
	/* And it grows for what it holds. */
	assert_int_equal(kvpd_session_reserve(s, 5000), KVP_OK);
	for (int32_t id = 0; id < 5000; id++)
		kvpd_session_add(s, id);
	assert_true(s->cap >= 10000);
	assert_int_equal(s->held, 5016);
	kvpd_session_destroy(s);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_session_request_table_matches_a_model),
		cmocka_unit_test(test_session_u64map_edges),
		cmocka_unit_test(test_session_refs_survive_log_compaction),
		cmocka_unit_test(test_session_table_follows_what_is_held),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
