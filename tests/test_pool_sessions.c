/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Lease expiry at scale, in process (kvpd_core, no sockets, the clock given
 * to each call): a pool with more sessions than one expiry pass looks at
 * (KVPD_EXPIRE_SCAN), half of them kept alive by heartbeats. One
 * kvpd_server_expire ends exactly the others and releases their blocks;
 * every survivor still answers as itself, every ended one is refused.
 */
#include "kvp_test.h"

#include <stdlib.h>

#include "kvpool.pb-c.h"
#include "service/config.h"
#include "service/dispatch.h"
#include "service/server.h"

enum { N = 3 * KVPD_EXPIRE_SCAN + 17, LEASE = 1000 };

static struct kvpd_server *srv;

/* One call at now_ms; the reply's status (and the reply, if out is not NULL). */
static int
call(Kvpool__V1__Request *rq, uint64_t now_ms, Kvpool__V1__Reply **out)
{
	size_t n = kvpool__v1__request__get_packed_size(rq), len = 0;
	uint8_t *req = malloc(n), *b = NULL;
	assert_non_null(req);
	kvpool__v1__request__pack(rq, req);
	assert_ok(kvpd_server_handle(srv, req, n, now_ms, &b, &len));
	free(req);
	Kvpool__V1__Reply *r = kvpool__v1__reply__unpack(NULL, len, b);
	free(b);
	assert_non_null(r);
	int status = (int)r->status;
	if (out)
		*out = r;
	else
		kvpool__v1__reply__free_unpacked(r, NULL);
	return status;
}

static uint64_t
hello(uint64_t now_ms)
{
	Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
	Kvpool__V1__HelloRequest h = KVPOOL__V1__HELLO_REQUEST__INIT;
	Kvpool__V1__Reply *r;
	h.protocol_version = 1;
	h.lease_ms = LEASE;
	rq.pool = "p";
	rq.call_case = KVPOOL__V1__REQUEST__CALL_HELLO;
	rq.hello = &h;
	assert_ok(call(&rq, now_ms, &r));
	uint64_t id = r->hello->session_id;
	kvpool__v1__reply__free_unpacked(r, NULL);
	return id;
}

static int
on_session(uint64_t session, Kvpool__V1__Request *rq, uint64_t now_ms, Kvpool__V1__Reply **out)
{
	rq->pool = "p";
	rq->session_id = session;
	return call(rq, now_ms, out);
}

static int
heartbeat(uint64_t session, uint64_t now_ms)
{
	Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
	Kvpool__V1__HeartbeatRequest h = KVPOOL__V1__HEARTBEAT_REQUEST__INIT;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_HEARTBEAT;
	rq.heartbeat = &h;
	return on_session(session, &rq, now_ms, NULL);
}

static int
allocate_one(uint64_t session, uint64_t now_ms)
{
	Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
	Kvpool__V1__AllocateRequest a = KVPOOL__V1__ALLOCATE_REQUEST__INIT;
	a.num_blocks = 1;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_ALLOCATE;
	rq.allocate = &a;
	return on_session(session, &rq, now_ms, NULL);
}

static void
stats(uint64_t session, uint64_t now_ms, uint32_t *sessions, uint32_t *num_free)
{
	Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
	Kvpool__V1__StatsRequest s = KVPOOL__V1__STATS_REQUEST__INIT;
	Kvpool__V1__Reply *r;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_STATS;
	rq.stats = &s;
	assert_ok(on_session(session, &rq, now_ms, &r));
	*sessions = r->stats->sessions;
	*num_free = r->stats->num_free;
	kvpool__v1__reply__free_unpacked(r, NULL);
}

/* A server with pool "p" and N sessions opened at 1000 ms, one block each. */
static void
open_sessions(uint64_t *id, uint32_t *num_free)
{
	uint32_t sessions;
	char *argv[] = {"kvpoold", "--quiet", "--executor", "none", "--events", "none",
	                "--max-sessions", "2000", "--lease-ms", "1000",
	                "--pool", "name=p,blocks=2048,block_size=4", NULL};
	struct kvpd_config cfg;
	char err[512];
	FILE *devnull = fopen("/dev/null", "w");

	assert_non_null(devnull);
	assert_int_equal(kvpd_config_load(&cfg, (int)(sizeof(argv) / sizeof(*argv)) - 1, argv, NULL,
	                                  devnull, devnull), 0);
	fclose(devnull);
	assert_ok(kvpd_server_create(&cfg, &srv, err, sizeof(err)));
	for (size_t i = 0; i < N; i++) {
		id[i] = hello(1000);
		assert_ok(allocate_one(id[i], 1000));
	}
	stats(id[0], 1000, &sessions, num_free);
	assert_int_equal(sessions, N);
}

static void
test_expiry_ends_exactly_the_lapsed_sessions_in_one_call(void **state)
{
	static uint64_t id[N];
	uint32_t sessions, num_free, before;

	(void)state;
	open_sessions(id, &before);
	/* Odd sessions stay alive; at 2600 the even ones have been silent 1600 ms. */
	for (size_t i = 1; i < N; i += 2)
		assert_ok(heartbeat(id[i], 2000));
	assert_int_equal(kvpd_server_expire(srv, 2600), (N + 1) / 2);
	for (size_t i = 0; i < N; i++) {
		if (i % 2)
			assert_ok(heartbeat(id[i], 2600));
		else
			assert_status(heartbeat(id[i], 2600), KVP_EUNAUTH); /* "lease expired" */
	}
	stats(id[1], 2600, &sessions, &num_free);
	assert_int_equal(sessions, N / 2);
	assert_int_equal(num_free, before + (N + 1) / 2);
	/* A second round finds nothing more; the survivors' blocks are still theirs. */
	assert_int_equal(kvpd_server_expire(srv, 2700), 0);
	kvpd_server_destroy(srv);
	srv = NULL;
}

/*
 * One kvpd_pool_expire looks at no more than KVPD_EXPIRE_SCAN sessions, so
 * a lock hold is bounded however many sessions lapsed at once; the round
 * goes on from where the last call stopped until it says there is no more.
 */
static void
test_expiry_one_call_looks_at_a_bounded_number(void **state)
{
	static uint64_t id[N];
	uint32_t before;
	size_t ended = 0, calls = 0;
	bool more = true;

	(void)state;
	open_sessions(id, &before);
	struct kvpd_pool *p = &srv->pools[0];
	while (more) {
		size_t k = kvpd_pool_expire(p, 5000, SIZE_MAX, &more);
		assert_true(k <= KVPD_EXPIRE_SCAN);
		if (calls == 0)
			assert_int_equal(k, KVPD_EXPIRE_SCAN); /* every one lapsed: each looked at ends */
		ended += k;
		calls++;
		assert_true(calls <= N);
	}
	(void)kvpd_pool_release_pending(p, SIZE_MAX);
	print_message("%d lapsed sessions ended in %zu calls\n", (int)N, calls);
	assert_int_equal(ended, N);
	assert_int_equal(calls, (N + KVPD_EXPIRE_SCAN - 1) / KVPD_EXPIRE_SCAN);
	assert_int_equal(p->num_sessions, 0);
	kvpd_server_destroy(srv);
	srv = NULL;
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_expiry_ends_exactly_the_lapsed_sessions_in_one_call),
		cmocka_unit_test(test_expiry_one_call_looks_at_a_bounded_number),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
