/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A Batch's slots run (kvp_batch_allocate_slots_n: n AllocateSlots calls
 * as one message of packed arrays) against the same calls sent plain
 * (KVP_BATCH_PLAIN), on twin pools of a real kvpoold: the same results,
 * statuses, details and pool state, fewer bytes; it stops, keeps going and
 * counts against max-ids as n calls. Then malformed runs, built by hand,
 * through the daemon's handler in process: refused whole, nothing applied;
 * and a fake daemon on a real socket whose run replies do not match the
 * run: the client refuses them rather than read past their arrays.
 */
#include "daemon_util.h"

#include <string.h>

#include "kvp_test.h"

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <pthread.h>

#include "clients/c/kvpool.h"
#include "kvpool.pb-c.h"
#include "service/config/config.h"
#include "service/pool/server.h"

#define POOL_ARGS "blocks=40,seed=0,groups=full:4+sliding_window:4:8"
enum { NREQ = 6, MAX_IDS = 16 };

static char ipc_url[256], tcp_url[256];
static pid_t daemon_pid;

static int
setup(void **state)
{
	(void)state;
	daemon_urls(ipc_url, sizeof(ipc_url), tcp_url, sizeof(tcp_url));
	const char *args[] = {"--rpc", ipc_url, "--admin", "none", "--max-ids", "16",
	                      "--pool", "name=run," POOL_ARGS, "--pool", "name=plain," POOL_ARGS,
	                      NULL};
	daemon_pid = daemon_start(args);
	return daemon_pid > 0 ? 0 : -1;
}

static int
teardown(void **state)
{
	(void)state;
	/* The daemon checks every pool's invariants on the way out. */
	return daemon_stop(daemon_pid) == 0 ? 0 : -1;
}

static struct kvp_client *
open_pool(const char *pool)
{
	struct kvp_client_options o = {.url = ipc_url, .pool = pool, .timeout_ms = 2000,
	                               .retries = 3};
	struct kvp_client *c = NULL;
	int rv = KVP_EBUSY;
	for (int i = 0; i < 50 && rv != KVP_OK; i++) {
		if ((rv = kvp_client_open(&o, &c)) != KVP_OK)
			nanosleep(&(struct timespec){0, 50000000}, NULL);
	}
	assert_ok(rv);
	return c;
}

/* Requests 1..NREQ, prompts of 5 tokens each, one plain batch. */
static void
add_requests(struct kvp_client *c, uint64_t base)
{
	struct kvp_batch *b;
	int64_t prompt[NREQ][5];
	size_t run;
	assert_ok(kvp_batch_create(&b));
	for (uint64_t r = 0; r < NREQ; r++) {
		for (int j = 0; j < 5; j++)
			prompt[r][j] = (int64_t)(base + 100 * r + (uint64_t)j);
		struct kvp_client_slots a = {.request_id = base + r + 1, .prompt = prompt[r],
		                             .num_prompt = 5};
		assert_ok(kvp_batch_allocate_slots(b, &a));
	}
	assert_ok(kvp_client_batch(c, b, &run));
	assert_int_equal(run, NREQ);
	kvp_batch_destroy(b);
}

/* Every result of calls 0..n-1 of x and y, field by field. */
static void
assert_same_results(const struct kvp_batch *x, const struct kvp_batch *y, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		struct kvp_batch_result a, b;
		assert_int_equal(kvp_batch_result(x, i, &a), kvp_batch_result(y, i, &b));
		assert_int_equal(a.status, b.status);
		assert_string_equal(a.detail, b.detail);
		assert_int_equal(a.has_block_ids, b.has_block_ids);
		assert_int_equal(a.num_block_ids, b.num_block_ids);
		if (a.num_block_ids > 0)
			assert_memory_equal(a.block_ids, b.block_ids, a.num_block_ids * sizeof(int32_t));
		assert_memory_equal(&a.slots, &b.slots, sizeof(a.slots));
	}
	int32_t st[2][32], ids[2][256];
	uint32_t comp[2][32], rows[2][64];
	size_t nids[2];
	assert_true(n <= 32);
	/* Call 0 is a Stats: the AllocateSlots calls are 1..n-1. */
	n--;
	assert_ok(kvp_batch_slots_results(x, 1, n, 2, st[0], comp[0], rows[0], ids[0], 256, &nids[0]));
	assert_ok(kvp_batch_slots_results(y, 1, n, 2, st[1], comp[1], rows[1], ids[1], 256, &nids[1]));
	assert_int_equal(st[0][3], KVP_ENOTFOUND); /* request 99 */
	assert_memory_equal(st[0], st[1], n * sizeof(int32_t));
	assert_memory_equal(comp[0], comp[1], n * sizeof(uint32_t));
	assert_memory_equal(rows[0], rows[1], 2 * n * sizeof(uint32_t));
	assert_int_equal(nids[0], nids[1]);
	assert_memory_equal(ids[0], ids[1], nids[0] * sizeof(int32_t));
}

/*
 * Decode steps (request 99 unknown, in the middle) until the pool runs out
 * of blocks: each step's every result is the same as a run and as plain
 * calls, and the run is the smaller message.
 */
static void
test_run_matches_plain_calls(void **state)
{
	struct kvp_client *c[2] = {open_pool("run"), open_pool("plain")};
	struct kvp_batch *b[2];
	const uint64_t rid[NREQ + 1] = {1, 2, 3, 99, 4, 5, 6};
	uint32_t one[NREQ + 1], ntok[NREQ + 1];
	int64_t tok[NREQ + 1];
	bool saw_no_space = false;
	(void)state;
	for (size_t i = 0; i <= NREQ; i++)
		one[i] = ntok[i] = 1;
	for (int k = 0; k < 2; k++) {
		add_requests(c[k], 0);
		assert_ok(kvp_batch_create(&b[k]));
	}
	assert_ok(kvp_batch_set_flags(b[0], KVP_BATCH_CONTINUE));
	assert_ok(kvp_batch_set_flags(b[1], KVP_BATCH_CONTINUE | KVP_BATCH_PLAIN));
	for (int step = 0; step < 24 && !saw_no_space; step++) {
		size_t run[2], req[2], rep[2];
		int rv[2];
		for (size_t i = 0; i <= NREQ; i++)
			tok[i] = 1000 + step;
		for (int k = 0; k < 2; k++) {
			kvp_batch_clear(b[k]);
			assert_ok(kvp_batch_stats(b[k])); /* a plain call before the run */
			assert_ok(kvp_batch_allocate_slots_n(b[k], NREQ + 1, rid, one, ntok, tok, 0,
			                                     false));
			assert_int_equal(kvp_batch_count(b[k]), NREQ + 2);
			rv[k] = kvp_client_batch(c[k], b[k], &run[k]);
			assert_ok(kvp_batch_wire_bytes(b[k], &req[k], &rep[k]));
		}
		assert_int_equal(rv[0], rv[1]);
		assert_int_not_equal(rv[0], KVP_OK); /* request 99 */
		assert_int_equal(run[0], NREQ + 2);
		assert_int_equal(run[1], NREQ + 2);
		assert_string_equal(kvp_client_last_detail(c[0]), kvp_client_last_detail(c[1]));
		assert_int_equal(kvp_batch_status(b[0], 4), KVP_ENOTFOUND);
		assert_same_results(b[0], b[1], NREQ + 2);
		assert_true(req[0] < req[1]);
		assert_true(rep[0] < rep[1]);
		for (size_t i = 1; i < NREQ + 2; i++)
			saw_no_space |= kvp_batch_status(b[0], i) == KVP_ENOSPACE;
	}
	assert_true(saw_no_space);
	/* Both pools ended in the same state. */
	struct kvp_client_stats s[2];
	for (int k = 0; k < 2; k++)
		assert_ok(kvp_client_stats(c[k], &s[k]));
	assert_int_equal(s[0].num_free, s[1].num_free);
	assert_int_equal(s[0].num_cached_blocks, s[1].num_cached_blocks);
	assert_int_equal(s[0].active_requests, s[1].active_requests);
	for (int k = 0; k < 2; k++) {
		for (uint64_t q = 1; q <= NREQ; q++)
			assert_ok(kvp_client_free_request(c[k], q, false));
		kvp_batch_destroy(b[k]);
		kvp_client_close(c[k]);
	}
}

/* Without KVP_BATCH_CONTINUE a run stops at its first failure, as its calls would. */
static void
test_run_stops_at_first_failure(void **state)
{
	struct kvp_client *c = open_pool("run");
	struct kvp_batch *b;
	const uint64_t rid[5] = {201, 202, 299, 203, 204};
	const uint32_t one[5] = {1, 1, 1, 1, 1};
	const int64_t tok[5] = {7, 7, 7, 7, 7};
	struct kvp_batch_result r;
	size_t run;
	(void)state;
	add_requests(c, 200);
	assert_ok(kvp_batch_create(&b));
	assert_ok(kvp_batch_free_request(b, 205, false));
	assert_ok(kvp_batch_allocate_slots_n(b, 5, rid, one, one, tok, 0, false));
	assert_ok(kvp_batch_free_request(b, 206, false));
	assert_int_equal(kvp_client_batch(c, b, &run), KVP_ENOTFOUND);
	assert_int_equal(run, 4); /* the free, 201, 202, 299 */
	assert_non_null(strstr(kvp_client_last_detail(c), "batch stopped at call 3"));
	assert_non_null(strstr(kvp_client_last_detail(c), "no request 299"));
	assert_ok(kvp_batch_status(b, 2));
	assert_int_equal(kvp_batch_result(b, 3, &r), KVP_OK);
	assert_int_equal(r.status, KVP_ENOTFOUND);
	assert_false(r.has_block_ids);
	assert_int_equal(kvp_batch_result(b, 4, &r), KVP_ENOTFOUND); /* did not run */
	assert_int_equal(kvp_batch_status(b, 6), KVP_ENOTFOUND);
	/* 203 did not run: one more token makes it 6 computed, where 201 has 7. */
	int32_t ids[16];
	struct kvp_client_slots_result res;
	int64_t t = 8;
	struct kvp_client_slots a = {.request_id = 203, .new_tokens = &t, .num_new_token_ids = 1,
	                             .num_new_tokens = 1};
	assert_ok(kvp_client_allocate_slots(c, &a, ids, 16, &res));
	assert_int_equal(res.num_computed_tokens, 6);
	a.request_id = 201;
	assert_ok(kvp_client_allocate_slots(c, &a, ids, 16, &res));
	assert_int_equal(res.num_computed_tokens, 7);
	/* Requests 206 (not freed: the batch stopped) and the others end here. */
	for (uint64_t q = 201; q <= 206; q++)
		assert_int_equal(kvp_client_free_request(c, q, false), q == 205 ? KVP_ENOTFOUND : KVP_OK);
	kvp_batch_destroy(b);
	kvp_client_close(c);
}

/* A run's calls count one by one against max-ids; a refused batch runs nothing. */
static void
test_run_counts_as_its_calls(void **state)
{
	struct kvp_client *c = open_pool("plain");
	struct kvp_batch *b;
	uint64_t rid[MAX_IDS + 1];
	uint32_t one[MAX_IDS + 1];
	size_t run;
	(void)state;
	for (size_t i = 0; i <= MAX_IDS; i++) {
		rid[i] = 400 + i;
		one[i] = 1;
	}
	assert_ok(kvp_batch_create(&b));
	assert_ok(kvp_batch_set_flags(b, KVP_BATCH_CONTINUE));
	assert_ok(kvp_batch_allocate_slots_n(b, MAX_IDS + 1, rid, one, NULL, NULL, 0, false));
	assert_int_equal(kvp_client_batch(c, b, &run), KVP_EINVAL);
	assert_int_equal(run, 0);
	assert_non_null(strstr(kvp_client_last_detail(c), "17 calls in one batch"));
	/* Two wire calls, 17 calls: the same. */
	kvp_batch_clear(b);
	assert_ok(kvp_batch_stats(b));
	assert_ok(kvp_batch_allocate_slots_n(b, MAX_IDS, rid, one, NULL, NULL, 0, false));
	assert_int_equal(kvp_batch_count(b), MAX_IDS + 1);
	assert_int_equal(kvp_client_batch(c, b, &run), KVP_EINVAL);
	assert_int_equal(run, 0);
	/* 16 go: every one refused alone (no such request), each with its detail. */
	kvp_batch_clear(b);
	assert_ok(kvp_batch_allocate_slots_n(b, MAX_IDS, rid, one, NULL, NULL, 0, false));
	assert_int_equal(kvp_client_batch(c, b, &run), KVP_ENOTFOUND);
	assert_int_equal(run, MAX_IDS);
	for (size_t i = 0; i < MAX_IDS; i++) {
		struct kvp_batch_result r;
		char want[64];
		assert_ok(kvp_batch_result(b, i, &r));
		assert_int_equal(r.status, KVP_ENOTFOUND);
		snprintf(want, sizeof(want), "no request %zu ", 400 + i);
		assert_non_null(strstr(r.detail, want));
	}
	/* An empty run adds nothing. */
	kvp_batch_clear(b);
	assert_ok(kvp_batch_allocate_slots_n(b, 0, NULL, NULL, NULL, NULL, 0, false));
	assert_int_equal(kvp_batch_count(b), 0);
	kvp_batch_destroy(b);
	kvp_client_close(c);
}

/* ---- malformed runs, in process ---- */

static struct kvpd_server *srv;

static Kvpool__V1__Reply *
handle(Kvpool__V1__Request *rq)
{
	size_t n = kvpool__v1__request__get_packed_size(rq), len = 0;
	uint8_t *req = malloc(n), *out = NULL;
	assert_non_null(req);
	kvpool__v1__request__pack(rq, req);
	assert_ok(kvpd_server_handle(srv, req, n, 1000, &out, &len));
	free(req);
	Kvpool__V1__Reply *r = kvpool__v1__reply__unpack(NULL, len, out);
	free(out);
	assert_non_null(r);
	return r;
}

/* A batch of one run, then a Stats call, with continue_on_error. */
static Kvpool__V1__Reply *
send_run(uint64_t session, Kvpool__V1__SlotsRunRequest *run)
{
	Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
	Kvpool__V1__BatchRequest br = KVPOOL__V1__BATCH_REQUEST__INIT;
	Kvpool__V1__BatchCall calls[2], *cp[2] = {&calls[0], &calls[1]};
	Kvpool__V1__StatsRequest st = KVPOOL__V1__STATS_REQUEST__INIT;
	kvpool__v1__batch_call__init(&calls[0]);
	kvpool__v1__batch_call__init(&calls[1]);
	calls[0].call_case = KVPOOL__V1__BATCH_CALL__CALL_SLOTS_RUN;
	calls[0].slots_run = run;
	calls[1].call_case = KVPOOL__V1__BATCH_CALL__CALL_STATS;
	calls[1].stats = &st;
	br.calls = cp;
	br.n_calls = 2;
	br.continue_on_error = true;
	rq.pool = "p";
	rq.session_id = session;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_BATCH;
	rq.batch = &br;
	return handle(&rq);
}

static void
test_malformed_runs_are_refused_whole(void **state)
{
	struct kvpd_config cfg;
	char err[512];
	char *argv[] = {"kvpoold", "--quiet", "--pool", "name=p,blocks=16,block_size=4", NULL};
	FILE *devnull = fopen("/dev/null", "w");
	(void)state;
	assert_int_equal(kvpd_config_load(&cfg, 4, argv, NULL, devnull, devnull), 0);
	fclose(devnull);
	assert_ok(kvpd_server_create(&cfg, &srv, err, sizeof(err)));
	/* A session and request 1 (5 tokens: 2 blocks). */
	Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
	Kvpool__V1__HelloRequest h = KVPOOL__V1__HELLO_REQUEST__INIT;
	h.protocol_version = 1;
	rq.pool = "p";
	rq.call_case = KVPOOL__V1__REQUEST__CALL_HELLO;
	rq.hello = &h;
	Kvpool__V1__Reply *r = handle(&rq);
	assert_true(r->hello->pool->slots_runs);
	uint64_t session = r->hello->session_id;
	kvpool__v1__reply__free_unpacked(r, NULL);
	Kvpool__V1__AllocateSlotsRequest as = KVPOOL__V1__ALLOCATE_SLOTS_REQUEST__INIT;
	int64_t prompt[5] = {1, 2, 3, 4, 5};
	as.request_id = 1;
	as.prompt_token_ids = prompt;
	as.n_prompt_token_ids = 5;
	rq.session_id = session;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_ALLOCATE_SLOTS;
	rq.allocate_slots = &as;
	r = handle(&rq);
	assert_int_equal(r->status, 0);
	kvpool__v1__reply__free_unpacked(r, NULL);

	uint64_t rid[2] = {1, 1};
	uint32_t one[2] = {1, 1}, big[2] = {UINT32_MAX, 2};
	int64_t tok[2] = {6, 7};
	struct {
		size_t nrid, nnew, nnum, ntok;
		const uint32_t *num;
		const char *why;
	} bad[] = {
		{0, 0, 0, 0, NULL, "no calls"},
		{2, 1, 0, 0, NULL, "each must have one per call"},
		{2, 2, 1, 1, one, "each must have one per call"},
		{2, 2, 2, 1, one, "do not add up"},
		{2, 2, 2, 2, big, "do not add up"},
		{2, 2, 0, 2, NULL, "do not add up"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		Kvpool__V1__SlotsRunRequest run = KVPOOL__V1__SLOTS_RUN_REQUEST__INIT;
		run.request_ids = rid;
		run.n_request_ids = bad[i].nrid;
		run.num_new_tokens = one;
		run.n_num_new_tokens = bad[i].nnew;
		run.num_token_ids = (uint32_t *)(uintptr_t)bad[i].num;
		run.n_num_token_ids = bad[i].nnum;
		run.token_ids = tok;
		run.n_token_ids = bad[i].ntok;
		r = send_run(session, &run);
		assert_int_equal(r->status, KVPOOL__V1__STATUS__STATUS_INVALID_ARGUMENT);
		/* Refused whole: nothing after it ran, continue_on_error or not. */
		assert_int_equal(r->batch->n_replies, 1);
		const Kvpool__V1__Reply *sub = r->batch->replies[0];
		assert_int_equal(sub->result_case, KVPOOL__V1__REPLY__RESULT_SLOTS_RUN);
		assert_int_equal(sub->slots_run->n_statuses, 0);
		if (strstr(sub->detail, bad[i].why) == NULL)
			fail_msg("case %zu: detail '%s' lacks '%s'", i, sub->detail, bad[i].why);
		kvpool__v1__reply__free_unpacked(r, NULL);
	}
	/* Request 1 is untouched: a good run of two calls computes tokens 5, then 6. */
	Kvpool__V1__SlotsRunRequest run = KVPOOL__V1__SLOTS_RUN_REQUEST__INIT;
	run.request_ids = rid;
	run.n_request_ids = run.n_num_new_tokens = run.n_num_token_ids = run.n_token_ids = 2;
	run.num_new_tokens = one;
	run.num_token_ids = one;
	run.token_ids = tok;
	r = send_run(session, &run);
	assert_int_equal(r->status, 0);
	assert_int_equal(r->batch->n_replies, 2);
	const Kvpool__V1__SlotsRunReply *s = r->batch->replies[0]->slots_run;
	assert_int_equal(s->n_statuses, 2);
	assert_int_equal(s->num_computed_tokens[0], 6);
	assert_int_equal(s->num_computed_tokens[1], 7);
	assert_int_equal(s->num_groups, 1);
	assert_int_equal(s->n_new_block_ids, 0); /* 7 tokens fit 2 blocks of 4 */
	kvpool__v1__reply__free_unpacked(r, NULL);
	kvpd_server_destroy(srv);
}

/* ---- a daemon whose run replies are wrong (a real REP socket, one thread) ---- */

static Kvpool__V1__SlotsRunReply fake_run;
static Kvpool__V1__Status fake_status;

/* Answers Hello, then each Batch with a Stats reply and fake_run; stops on Goodbye. */
static void *
fake_daemon(void *arg)
{
	nng_socket s = *(nng_socket *)arg;
	for (;;) {
		nng_msg *m;
		if (nng_recvmsg(s, &m, 0) != 0)
			return NULL;
		Kvpool__V1__Request *rq =
			kvpool__v1__request__unpack(NULL, nng_msg_len(m), nng_msg_body(m));
		nng_msg_free(m);
		if (rq == NULL)
			return NULL;
		Kvpool__V1__Reply r = KVPOOL__V1__REPLY__INIT, st = KVPOOL__V1__REPLY__INIT,
				  run = KVPOOL__V1__REPLY__INIT, *subs[2] = {&st, &run};
		Kvpool__V1__HelloReply h = KVPOOL__V1__HELLO_REPLY__INIT;
		Kvpool__V1__PoolInfo pi = KVPOOL__V1__POOL_INFO__INIT;
		Kvpool__V1__StatsReply sr = KVPOOL__V1__STATS_REPLY__INIT;
		Kvpool__V1__BatchReply br = KVPOOL__V1__BATCH_REPLY__INIT;
		Kvpool__V1__GoodbyeReply gb = KVPOOL__V1__GOODBYE_REPLY__INIT;
		bool bye = rq->call_case == KVPOOL__V1__REQUEST__CALL_GOODBYE;
		r.call_id = rq->call_id;
		if (rq->call_case == KVPOOL__V1__REQUEST__CALL_HELLO) {
			pi.name = "fake";
			pi.num_blocks = 64;
			pi.hash_len = 32;
			pi.slots_runs = true;
			h.session_id = 1;
			h.lease_ms = 60000;
			h.pool = &pi;
			r.result_case = KVPOOL__V1__REPLY__RESULT_HELLO;
			r.hello = &h;
		} else if (rq->call_case == KVPOOL__V1__REQUEST__CALL_BATCH) {
			st.result_case = KVPOOL__V1__REPLY__RESULT_STATS;
			st.stats = &sr;
			run.status = fake_status;
			run.result_case = KVPOOL__V1__REPLY__RESULT_SLOTS_RUN;
			run.slots_run = &fake_run;
			br.replies = subs;
			br.n_replies = 2;
			r.status = fake_status;
			r.result_case = KVPOOL__V1__REPLY__RESULT_BATCH;
			r.batch = &br;
		} else {
			r.result_case = KVPOOL__V1__REPLY__RESULT_GOODBYE;
			r.goodbye = &gb;
		}
		kvpool__v1__request__free_unpacked(rq, NULL);
		size_t n = kvpool__v1__reply__get_packed_size(&r);
		if (nng_msg_alloc(&m, n) != 0)
			return NULL;
		kvpool__v1__reply__pack(&r, nng_msg_body(m));
		if (nng_sendmsg(s, m, 0) != 0) {
			nng_msg_free(m);
			return NULL;
		}
		if (bye)
			return NULL;
	}
}

static void
test_client_checks_run_replies(void **state)
{
	char url[96];
	nng_socket s;
	pthread_t t;
	(void)state;
	kvpool__v1__slots_run_reply__init(&fake_run);
	snprintf(url, sizeof(url), "ipc:///tmp/kvpool-fake-run-%d.ipc", (int)getpid());
	assert_int_equal(nng_rep0_open(&s), 0);
	assert_int_equal(nng_listen(s, url, NULL, 0), 0);
	assert_int_equal(pthread_create(&t, NULL, fake_daemon, &s), 0);
	struct kvp_client_options o = {.url = url, .pool = "fake", .timeout_ms = 2000};
	struct kvp_client *c = NULL;
	struct kvp_batch *b = NULL;
	const uint64_t rid[3] = {1, 2, 3};
	const uint32_t one[3] = {1, 1, 1};
	struct kvp_batch_result res;
	size_t run;
	assert_ok(kvp_client_open(&o, &c));
	assert_ok(kvp_batch_create(&b));
	assert_ok(kvp_batch_stats(b));
	assert_ok(kvp_batch_allocate_slots_n(b, 3, rid, one, NULL, NULL, 0, false));

	/* A good reply: the second call refused, the others' ids split by their counts. */
	Kvpool__V1__Status sts[4] = {0, KVPOOL__V1__STATUS__STATUS_NO_SPACE, 0, 0};
	uint32_t sched[4] = {1, 0, 1, 1}, comp[4] = {5, 0, 9, 9}, per[4] = {1, 0, 2, 0};
	int32_t ids[3] = {5, 6, 7};
	char *details[1] = {"no room"};
	fake_run.statuses = sts;
	fake_run.num_scheduled_tokens = sched;
	fake_run.num_computed_tokens = comp;
	fake_run.new_blocks_per_group = per;
	fake_run.new_block_ids = ids;
	fake_run.details = details;
#define SET_RUN(ns, ng, nper, nids, ndet) \
	(fake_run.n_statuses = fake_run.n_num_scheduled_tokens = fake_run.n_num_computed_tokens = \
	 (ns), fake_run.num_groups = (ng), fake_run.n_new_blocks_per_group = (nper), \
	 fake_run.n_new_block_ids = (nids), fake_run.n_details = (ndet))
	SET_RUN(3, 1, 3, 3, 1);
	fake_status = KVPOOL__V1__STATUS__STATUS_NO_SPACE;
	assert_int_equal(kvp_client_batch(c, b, &run), KVP_ENOSPACE);
	assert_int_equal(run, 4);
	assert_ok(kvp_batch_result(b, 1, &res));
	assert_int_equal(res.num_block_ids, 1);
	assert_int_equal(res.block_ids[0], 5);
	assert_int_equal(res.slots.num_computed_tokens, 5);
	assert_ok(kvp_batch_result(b, 2, &res));
	assert_int_equal(res.status, KVP_ENOSPACE);
	assert_string_equal(res.detail, "no room");
	assert_ok(kvp_batch_result(b, 3, &res));
	assert_int_equal(res.num_block_ids, 2);
	assert_int_equal(res.block_ids[1], 7);
	assert_non_null(strstr(kvp_client_last_detail(c), "no room"));

	/* Replies that do not match the run: refused, nothing readable. */
	struct {
		size_t ns, ng, nper, nids, ndet;
	} bad[] = {
		{4, 1, 4, 3, 1}, /* more calls than the run has */
		{3, 0, 0, 3, 1}, /* no groups */
		{3, 1, 2, 3, 1}, /* counts per group missing */
		{3, 1, 3, 2, 1}, /* counts past the ids */
		{3, 1, 3, 3, 0}, /* a failed call without its detail */
		{0, 1, 0, 0, 0}, /* an empty run that claims success */
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		SET_RUN(bad[i].ns, bad[i].ng, bad[i].nper, bad[i].nids, bad[i].ndet);
		fake_status = bad[i].ns == 0 ? 0 : KVPOOL__V1__STATUS__STATUS_NO_SPACE;
		if (kvp_client_batch(c, b, &run) != KVP_EINTERNAL)
			fail_msg("case %zu: accepted", i);
		assert_int_equal(run, 0);
		assert_int_equal(kvp_batch_status(b, 0), KVP_ENOTFOUND);
	}
#undef SET_RUN
	kvp_batch_destroy(b);
	kvp_client_close(c); /* its Goodbye ends the fake daemon */
	pthread_join(t, NULL);
	nng_close(s);
}

int
main(void)
{
	const struct CMUnitTest daemon_tests[] = {
		cmocka_unit_test(test_run_matches_plain_calls),
		cmocka_unit_test(test_run_stops_at_first_failure),
		cmocka_unit_test(test_run_counts_as_its_calls),
	};
	const struct CMUnitTest core_tests[] = {
		cmocka_unit_test(test_malformed_runs_are_refused_whole),
		cmocka_unit_test(test_client_checks_run_replies),
	};
	int failed = cmocka_run_group_tests_name("slots run, kvpoold", daemon_tests, setup,
	                                         teardown);
	return failed + cmocka_run_group_tests_name("slots run, in process", core_tests, NULL, NULL);
}
