/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A pool's sessions at scale, in process (kvpd_core, no sockets, the clock
 * given to each call).
 * - Lease expiry: a pool with more sessions than one expiry pass looks at
 *   (KVPD_EXPIRE_SCAN), half of them kept alive by heartbeats. One
 *   kvpd_server_expire ends exactly the others and releases their blocks;
 *   every survivor still answers as itself, every ended one is refused.
 * - Stored replies over the pool's budget go oldest first, whoever's, while
 *   sessions overwrite and end theirs: a retried call is answered from the
 *   store exactly for the newest replies.
 */
#include "kvp_test.h"

#include <stdlib.h>
#include <string.h>

#include "kvpool.pb-c.h"
#include "service/config/config.h"
#include "service/rpc/dispatch.h"
#include "service/pool/server.h"

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

/* Allocate n blocks as call call_id (0: none); their ids into ids if not NULL. */
static int
allocate_n(uint64_t session, uint32_t n, uint64_t call_id, int32_t *ids)
{
	Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
	Kvpool__V1__AllocateRequest a = KVPOOL__V1__ALLOCATE_REQUEST__INIT;
	Kvpool__V1__Reply *r;
	a.num_blocks = n;
	rq.call_id = call_id;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_ALLOCATE;
	rq.allocate = &a;
	int status = on_session(session, &rq, 1000, &r);
	if (status == KVP_OK && ids != NULL) {
		assert_int_equal(r->allocate->n_block_ids, n);
		memcpy(ids, r->allocate->block_ids, n * sizeof(*ids));
	}
	kvpool__v1__reply__free_unpacked(r, NULL);
	return status;
}

static int
allocate_one(uint64_t session, uint64_t now_ms)
{
	(void)now_ms;
	return allocate_n(session, 1, 0, NULL);
}

static int
free_ids(uint64_t session, const int32_t *ids, size_t n, uint64_t call_id)
{
	Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
	Kvpool__V1__FreeRequest f = KVPOOL__V1__FREE_REQUEST__INIT;
	f.block_ids = (int32_t *)ids;
	f.n_block_ids = n;
	rq.call_id = call_id;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_FREE;
	rq.free = &f;
	return on_session(session, &rq, 1000, NULL);
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
test_pool_sessions_expiry_ends_exactly_the_lapsed_ones(void **state)
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
test_pool_sessions_expiry_pass_looks_at_a_bounded_number(void **state)
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

static void
server_create(char **argv, int argc)
{
	struct kvpd_config cfg;
	char err[512];
	FILE *devnull = fopen("/dev/null", "w");
	assert_non_null(devnull);
	assert_int_equal(kvpd_config_load(&cfg, argc, argv, NULL, devnull, devnull), 0);
	fclose(devnull);
	assert_ok(kvpd_server_create(&cfg, &srv, err, sizeof(err)));
}

/*
 * Eight sessions: 40 rounds of one small Free each (a session keeps its last
 * 16 replies, so its older ones go on its own), then 4 rounds of a 48 KB
 * Allocate and its Free each, 1.3 MB over a 1 MiB budget, one session
 * ending in between. Retried newest first, the Allocates are answered from
 * the store (no block taken) down to some point and re-run from there on;
 * and every small Free, older than them all, is re-run (refused: the block
 * is no longer the session's).
 */
static void
test_pool_sessions_stored_replies_go_oldest_first(void **state)
{
	enum { S = 8, SMALL = 40, BIG = 4, NB = 16000 };
	char *argv[] = {"kvpoold", "--quiet", "--executor", "none", "--events", "none",
	                "--reply-cache-mib", "1", "--max-ids", "65536",
	                /* 9aaf83ef5's free order rotates the ids to 3-byte varints. */
	                "--pool", "name=p,blocks=65536,block_size=4,vllm=9aaf83ef5", NULL};
	static int32_t own[S][SMALL], big[NB];
	uint64_t id[S];
	uint32_t sessions, num_free, before;
	int kept = 0, rerun = 0;

	(void)state;
	server_create(argv, (int)(sizeof(argv) / sizeof(*argv)) - 1);
	for (size_t k = 0; k < S; k++) {
		id[k] = hello(1000);
		assert_ok(allocate_n(id[k], SMALL, 1, own[k]));
	}
	for (uint64_t r = 0; r < SMALL; r++)
		for (size_t k = 0; k < S; k++)
			assert_ok(free_ids(id[k], &own[k][r], 1, 100 + r));
	for (uint64_t r = 0; r < BIG; r++) {
		for (size_t k = 0; k < S; k++) {
			if (k == 3 && r >= 1)
				continue; /* ended after the first round: its replies went with it */
			assert_ok(allocate_n(id[k], NB, 1000 + r, big));
			assert_ok(free_ids(id[k], big, NB, 2000 + r));
		}
		if (r == 0) {
			Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
			Kvpool__V1__GoodbyeRequest g = KVPOOL__V1__GOODBYE_REQUEST__INIT;
			rq.call_case = KVPOOL__V1__REQUEST__CALL_GOODBYE;
			rq.goodbye = &g;
			assert_ok(on_session(id[3], &rq, 1000, NULL));
		}
	}
	/* Newest first: answered from the store, then (once one was forgotten) re-run. */
	for (int r = BIG - 1; r >= 0; r--)
		for (int k = S - 1; k >= 0; k--) {
			if (k == 3)
				continue; /* gone, and its stored replies with it */
			uint64_t who = id[k];
			stats(who, 1000, &sessions, &before);
			assert_ok(allocate_n(who, NB, 1000 + (uint64_t)r, big));
			stats(who, 1000, &sessions, &num_free);
			bool answered = num_free == before;
			if (!answered)
				assert_ok(free_ids(who, big, NB, 0)); /* give the re-run's blocks back */
			if (answered) {
				assert_int_equal(rerun, 0); /* nothing newer was forgotten */
				kept++;
			} else {
				rerun++;
			}
		}
	print_message("Allocate replies retried newest first: %d answered from the store, %d re-run\n",
	              kept, rerun);
	assert_true(kept >= 10 && rerun >= 1);
	/* The small Frees are older than every Allocate: forgotten, so a retry runs again. */
	for (size_t k = 0; k < S; k++)
		if (k != 3)
			assert_status(free_ids(id[k], &own[k][SMALL - 1], 1, 100 + SMALL - 1),
			              KVP_ENOTOWNER);
	kvpd_server_destroy(srv);
	srv = NULL;
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_pool_sessions_expiry_ends_exactly_the_lapsed_ones),
		cmocka_unit_test(test_pool_sessions_expiry_pass_looks_at_a_bounded_number),
		cmocka_unit_test(test_pool_sessions_stored_replies_go_oldest_first),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
