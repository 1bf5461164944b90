/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvpoold end to end: a real daemon (fork+exec), real nng sockets on
 * ipc:// and tcp://127.0.0.1, the real client library. Every status code the
 * service produces comes out of at least one call here.
 */
#include "daemon_util.h"

#include <pthread.h>

#include "kvp_test.h"

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "common/block_hash.h"
#include "common/kvp_version.h"
#include "clients/c/kvpool.h"
#include "kvpool.pb-c.h"
#include "proto/wire.h"

static char ipc_url[256], tcp_url[256], admin_url[64], token_pool[256], token_path[96],
	events_url[96], log_path[96];
static pid_t daemon_pid;

static int
setup(void **state)
{
	(void)state;
	daemon_urls(ipc_url, sizeof(ipc_url), tcp_url, sizeof(tcp_url));
	snprintf(admin_url, sizeof(admin_url), "http://127.0.0.1:%d", daemon_admin_port());
	snprintf(token_path, sizeof(token_path), "/tmp/kvpool-test-%d.token", (int)getpid());
	FILE *f = fopen(token_path, "w");
	if (f == NULL || fputs("s3cret\n", f) < 0 || fclose(f) != 0)
		return -1;
	snprintf(token_pool, sizeof(token_pool), "name=locked,blocks=8,block_size=4,token_file=%s",
	         token_path);
	snprintf(events_url, sizeof(events_url), "ipc:///tmp/kvpool-test-events-%d.ipc", (int)getpid());
	const char *args[] = {"--rpc", ipc_url, "--rpc", tcp_url, "--admin", admin_url,
	                      "--events", events_url,
	                      "--pool", "name=fresh,blocks=10,block_size=4,seed=0", "--pool", token_pool,
	                      "--pool", "name=default,blocks=10,block_size=4,seed=0",
	                      "--pool", "name=secure,blocks=32,block_size=4,seed=0",
	                      "--pool", "name=tiny,blocks=8,block_size=4,seed=0",
	                      "--max-ids", "64", "--max-sessions", "12", "--max-msg-bytes", "65536",
	                      "--lease-ms", "5000", "--log-format", "json", NULL};
	unsetenv("KVPOOL_TOKEN");
	snprintf(log_path, sizeof(log_path), "/tmp/kvpool-test-%d.log", (int)getpid());
	daemon_pid = daemon_start_log(args, log_path);
	return daemon_pid > 0 ? 0 : -1;
}

static int
teardown(void **state)
{
	(void)state;
	unlink(token_path);
	/* The daemon checks its invariants on the way out: exit 0 means they held. */
	int rv = daemon_stop(daemon_pid) == 0 ? 0 : -1;
	/* Its log, for whoever reads the test's output. */
	FILE *f = fopen(log_path, "r");
	char line[4096];
	while (f && fgets(line, sizeof(line), f))
		fputs(line, stderr);
	if (f)
		fclose(f);
	unlink(log_path);
	return rv;
}

static struct kvp_client *
open_on(const char *url, const char *pool, uint32_t lease_ms)
{
	struct kvp_client_options o = {.url = url, .pool = pool, .lease_ms = lease_ms,
	                               .timeout_ms = 2000, .retries = 3};
	struct kvp_client *c = NULL;
	int rv = KVP_EBUSY;
	/* The daemon may still be starting: nng redials in the background. */
	for (int i = 0; i < 50 && rv == KVP_EBUSY; i++)
		rv = kvp_client_open(&o, &c);
	if (rv != KVP_OK)
		fail_msg("open %s/%s: %s", url, pool, kvp_status_name(rv));
	return c;
}

static void
test_service_hello_describes_pool(void **state)
{
	struct kvp_client *c = open_on(ipc_url, "default", 0);
	const struct kvp_client_info *i = kvp_client_info(c);
	struct kvp_hasher *h;
	uint8_t fp[32];

	(void)state;
	assert_true(i->session_id != 0);
	assert_int_equal(i->num_blocks, 10);
	assert_int_equal(i->hash_block_size, 4);
	assert_int_equal(i->block_size, 4);
	assert_string_equal(i->hash_algorithm, "sha256_cbor");
	assert_string_equal(i->medium, "CPU");
	assert_int_equal(i->lease_ms, 5000);
	assert_int_equal(i->max_ids_per_call, 64);
	assert_string_equal(i->server_version, KVP_VERSION " (commit " KVP_GIT_COMMIT ")");
	/* seed "0": the fingerprint is sha256(NONE_HASH)[0:8] of vLLM's PYTHONHASHSEED=0 */
	assert_ok(kvp_hasher_create("0", &h));
	assert_ok(kvp_hash_raw(h, kvp_hasher_none_hash(h), 32, fp));
	assert_memory_equal(i->none_hash_fingerprint, fp, 8);
	kvp_hasher_destroy(h);
	kvp_client_close(c);
}

/* Scenario B2 and C1 over the wire: same ids, same queue behaviour. */
static void
block_calls_on(const char *url, const char *pool)
{
	struct kvp_client *c = open_on(url, pool, 0);
	struct kvp_client_stats st;
	int32_t ids[16], hits[16];
	int64_t tok[12];
	uint32_t n = 0, stored = 0, hit_tokens = 0, evicted = 0;

	for (int i = 0; i < 12; i++)
		tok[i] = i;
	assert_ok(kvp_client_allocate(c, 3, ids));
	assert_ids(ids, 3, 1, 2, 3);
	struct kvp_client_cache ca = {.block_ids = ids, .num_block_ids = 3, .num_full_blocks = 3,
	                              .tokens = tok, .num_tokens = 12};
	assert_ok(kvp_client_cache(c, &ca, &stored));
	assert_int_equal(stored, 3);
	int32_t rev[3] = {3, 2, 1};
	assert_ok(kvp_client_free(c, rev, 3));
	struct kvp_client_lookup q = {.tokens = tok, .num_tokens = 12};
	assert_ok(kvp_client_lookup(c, &q, hits, 16, &n, &hit_tokens));
	assert_int_equal(n, 3);
	assert_int_equal(hit_tokens, 12);
	assert_ids(hits, 3, 1, 2, 3);
	assert_ok(kvp_client_touch(c, hits, 2));
	assert_ok(kvp_client_stats(c, &st));
	assert_int_equal(st.num_free, 7);
	assert_int_equal(st.num_cached_blocks, 3);
	assert_true(st.events_emitted >= 1);
	/* Reset refuses while blocks are in use. */
	assert_status(kvp_client_reset(c), KVP_ESTATE);
	assert_non_null(strstr(kvp_client_last_detail(c), "in use"));
	assert_ok(kvp_client_free(c, (int32_t[]){2, 1}, 2));
	assert_ok(kvp_client_evict(c, (int32_t[]){3}, 1, &evicted));
	assert_int_equal(evicted, 1);
	assert_ok(kvp_client_lookup(c, &q, hits, 16, &n, &hit_tokens));
	assert_int_equal(n, 2);
	assert_ok(kvp_client_reset(c));
	assert_ok(kvp_client_lookup(c, &q, hits, 16, &n, &hit_tokens));
	assert_int_equal(n, 0);
	/* Over-allocation: KVP_ENOSPACE, nothing taken. */
	assert_status(kvp_client_allocate(c, 10, ids), KVP_ENOSPACE);
	assert_ok(kvp_client_stats(c, &st));
	assert_int_equal(st.num_free, 9);
	kvp_client_close(c);
}

static void
test_service_block_calls_match_engine_scenarios_ipc(void **state)
{
	(void)state;
	block_calls_on(ipc_url, "default");
}

static void
test_service_block_calls_match_engine_scenarios_tcp(void **state)
{
	(void)state;
	block_calls_on(tcp_url, "fresh");
}

/* Cache with a parent hash: only the new tokens travel; hashes match the full chain. */
static void
test_service_cache_from_parent_hash_matches_full_chain(void **state)
{
	struct kvp_client *c = open_on(ipc_url, "secure", 0);
	struct kvp_hasher *h;
	int32_t ids[3], hits[8];
	int64_t tok[12];
	uint8_t chain[3 * 32];
	size_t n = 0;
	uint32_t nh = 0, stored = 0;

	(void)state;
	for (int i = 0; i < 12; i++)
		tok[i] = 3000 + i;
	assert_ok(kvp_hasher_create("0", &h)); /* pool secure: seed=0 */
	assert_ok(kvp_hash_request(h, NULL, tok, 12, 4, NULL, 0, chain, 3, &n));
	assert_ok(kvp_client_allocate(c, 3, ids));
	struct kvp_client_cache first = {.block_ids = ids, .num_block_ids = 3, .num_full_blocks = 1,
	                                 .tokens = tok, .num_tokens = 4};
	assert_ok(kvp_client_cache(c, &first, &stored));
	struct kvp_client_cache rest = {.block_ids = ids, .num_block_ids = 3,
	                                .num_cached_blocks = 1, .num_full_blocks = 3,
	                                .tokens = tok + 4, .num_tokens = 9, /* one spare token */
	                                .parent_hash = chain};
	assert_ok(kvp_client_cache(c, &rest, &stored));
	assert_int_equal(stored, 2);
	struct kvp_client_lookup q = {.hashes = chain, .num_hashes = 3};
	assert_ok(kvp_client_lookup(c, &q, hits, 8, &nh, NULL));
	assert_int_equal(nh, 3);
	assert_ids(hits, 3, ids[0], ids[1], ids[2]);
	/* Misuse: a parent without num_cached, or too few tokens. */
	rest.num_cached_blocks = 0;
	assert_status(kvp_client_cache(c, &rest, NULL), KVP_EINVAL);
	rest.num_cached_blocks = 1;
	rest.num_tokens = 5;
	assert_status(kvp_client_cache(c, &rest, NULL), KVP_EINVAL);
	kvp_hasher_destroy(h);
	kvp_client_close(c);
}

static void
test_service_token_is_checked_per_pool(void **state)
{
	struct kvp_client_options o = {.url = tcp_url, .pool = "locked", .timeout_ms = 2000};
	struct kvp_client *c = NULL;

	(void)state;
	assert_status(kvp_client_open(&o, &c), KVP_EUNAUTH);
	o.token = "s3cre";
	assert_status(kvp_client_open(&o, &c), KVP_EUNAUTH);
	o.token = "s3cret";
	assert_ok(kvp_client_open(&o, &c));
	kvp_client_close(c);
	/* Client-side failures are statuses too: TLS material that does not exist. */
	struct kvp_client_options t = {.url = "tls+tcp://127.0.0.1:1", .tls_ca_file = "/nonexistent",
	                               .tls_server_name = "localhost"};
	assert_status(kvp_client_open(&t, &c), KVP_EINVAL);
	assert_non_null(strstr(kvp_client_open_detail(), "TLS CA file /nonexistent"));
	struct kvp_client_options bad = {.url = "bogus://x"};
	assert_status(kvp_client_open(&bad, &c), KVP_EINVAL);
	assert_status(kvp_client_open(NULL, &c), KVP_EINVAL);
}

/* The daemon's log so far, into buf. */
static void
read_log(char *buf, size_t cap)
{
	FILE *f = fopen(log_path, "r");
	size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
	buf[n] = '\0';
	if (f)
		fclose(f);
}

/* Each refusal says which it is; the daemon logs them with the peer, never the token. */
static void
test_service_refusals_say_why(void **state)
{
	static char log[1 << 20];
	struct kvp_client_options o = {.url = tcp_url, .pool = "locked", .timeout_ms = 2000};
	struct kvp_client *c = NULL;

	(void)state;
	assert_status(kvp_client_open(&o, &c), KVP_EUNAUTH);
	assert_non_null(strstr(kvp_client_open_detail(), "needs an auth token and none was given"));
	o.token = "wrong-s3cret";
	assert_status(kvp_client_open(&o, &c), KVP_EUNAUTH);
	assert_non_null(strstr(kvp_client_open_detail(), "wrong auth token for pool locked"));
	assert_null(c);
	/* Sessions: never opened, ended by Goodbye, lease expired. */
	struct kvp_client_options r = {.url = ipc_url, .pool = "default", .timeout_ms = 2000,
	                               .session_id = 12345};
	assert_status(kvp_client_open(&r, &c), KVP_EUNAUTH);
	assert_non_null(strstr(kvp_client_open_detail(), "never opened here"));
	struct kvp_client *g = open_on(ipc_url, "default", 0);
	r.session_id = kvp_client_info(g)->session_id;
	kvp_client_close(g);
	assert_status(kvp_client_open(&r, &c), KVP_EUNAUTH);
	assert_non_null(strstr(kvp_client_open_detail(), "was ended by Goodbye"));
	struct kvp_client *e = open_on(ipc_url, "default", 200);
	int32_t ids[2];
	assert_ok(kvp_client_allocate(e, 2, ids));
	r.session_id = kvp_client_info(e)->session_id;
	kvp_client_detach(e); /* gone without Goodbye */
	int rv = KVP_OK;
	for (int i = 0; i < 10; i++) {
		sleep_ms(500); /* past the 200 ms lease and the reaper's 250 ms round */
		if ((rv = kvp_client_open(&r, &c)) != KVP_OK)
			break;
		kvp_client_detach(c); /* our resume kept it alive: let it lapse */
		c = NULL;
	}
	assert_status(rv, KVP_EUNAUTH);
	assert_non_null(strstr(kvp_client_open_detail(), "expired"));
	assert_non_null(strstr(kvp_client_open_detail(), "its 2 block reference(s) were released"));
	/* The other refusals an operator should see: the session limit, an oversized request. */
	struct kvp_client *many[13] = {0};
	struct kvp_client_options t = {.url = ipc_url, .pool = "tiny", .timeout_ms = 2000};
	int opened = 0;
	for (; opened < 13; opened++)
		if ((rv = kvp_client_open(&t, &many[opened])) != KVP_OK)
			break;
	assert_status(rv, KVP_EBUSY);
	assert_non_null(strstr(kvp_client_open_detail(), "the limit"));
	static uint8_t huge[70000];
	uint8_t *reply = NULL;
	size_t reply_len = 0;
	assert_ok(kvp_client_raw(many[0], huge, sizeof(huge), &reply, &reply_len));
	free(reply);
	for (int i = 0; i < opened; i++)
		kvp_client_close(many[i]);
	/* The log: the expiry with what it released, refusals with a peer, no token. */
	for (int i = 0; i < 40; i++) {
		read_log(log, sizeof(log));
		if (strstr(log, "\"references_released\":\"2\"") != NULL)
			break;
		sleep_ms(50);
	}
	assert_non_null(strstr(log, "\"msg\":\"lease expired; session ended and its blocks released\""));
	assert_non_null(strstr(log, "\"references_released\":\"2\""));
	assert_non_null(strstr(log, "\"msg\":\"refused authentication\""));
	assert_non_null(strstr(log, "\"peer\":\""));
	assert_null(strstr(log, "s3cret"));
	assert_non_null(strstr(log, "\"msg\":\"refused a session: the pool is at --max-sessions\""));
	assert_non_null(strstr(log, "\"msg\":\"refused a request larger than --max-msg-bytes\""));
	assert_non_null(strstr(log, "\"level\":\"info\",\"component\":\"main\",\"msg\":\"ready\""));
}

/* No daemon: KVP_EUNAVAILABLE within the connect timeout, not BUSY after every retry. */
static void
test_service_no_daemon_is_unavailable_not_busy(void **state)
{
	char url[96];
	struct kvp_client *c = NULL;
	(void)state;
	snprintf(url, sizeof(url), "ipc:///tmp/kvpool-nobody-%d.ipc", (int)getpid());
	const char *urls[] = {url, "tcp://127.0.0.1:1"};
	for (int i = 0; i < 2; i++) {
		struct kvp_client_options o = {.url = urls[i], .connect_timeout_ms = 300};
		struct timespec t0, t1;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		assert_status(kvp_client_open(&o, &c), KVP_EUNAVAILABLE);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
		assert_true(s >= 0.25 && s < 2.0);
		assert_null(c);
		assert_non_null(strstr(kvp_client_open_detail(), "no kvpoold listening"));
		assert_non_null(strstr(kvp_client_open_detail(), urls[i]));
	}
}

static void
test_service_batch_builder_runs_a_scheduler_step(void **state)
{
	struct kvp_client *c = open_on(tcp_url, "secure", 0);
	struct kvp_batch *b = NULL;
	const int32_t *ids;
	size_t n, run;
	int64_t prompt[9];

	(void)state;
	for (int i = 0; i < 9; i++)
		prompt[i] = 77 + i;
	assert_ok(kvp_batch_create(&b));
	assert_ok(kvp_batch_allocate(b, 2));
	struct kvp_client_slots a = {.request_id = 5, .prompt = prompt, .num_prompt = 9,
	                             .use_prefix_cache = true};
	assert_ok(kvp_batch_allocate_slots(b, &a));
	struct kvp_client_lookup q = {.tokens = prompt, .num_tokens = 9};
	assert_ok(kvp_batch_lookup(b, &q));
	assert_ok(kvp_batch_free_request(b, 5, false));
	assert_int_equal(kvp_batch_count(b), 4);
	assert_ok(kvp_client_batch(c, b, &run));
	assert_int_equal(run, 4);
	assert_ok(kvp_batch_block_ids(b, 0, &ids, &n));
	assert_int_equal(n, 2);
	int32_t mine[2] = {ids[0], ids[1]};
	assert_ok(kvp_batch_block_ids(b, 1, &ids, &n));
	assert_int_equal(n, 3); /* 9 tokens, block size 4 */
	assert_ok(kvp_batch_block_ids(b, 2, &ids, &n));
	assert_int_equal(n, 2); /* the request cached its 2 full blocks */
	/* A failing call stops the batch; what ran is reported. */
	kvp_batch_clear(b);
	assert_ok(kvp_batch_free(b, mine, 1));
	assert_ok(kvp_batch_free(b, mine, 1)); /* not held any more */
	assert_ok(kvp_batch_free(b, mine + 1, 1));
	assert_status(kvp_client_batch(c, b, &run), KVP_ENOTOWNER);
	assert_int_equal(run, 2);
	assert_ok(kvp_batch_status(b, 0));
	assert_status(kvp_batch_status(b, 1), KVP_ENOTOWNER);
	assert_status(kvp_batch_status(b, 2), KVP_ENOTFOUND);
	assert_non_null(strstr(kvp_client_last_detail(c), "no reference"));
	kvp_batch_destroy(b);
	kvp_client_close(c);
}

static void
test_service_ownership_is_per_session(void **state)
{
	struct kvp_client *a = open_on(ipc_url, "default", 0);
	struct kvp_client *b = open_on(tcp_url, "default", 0);
	struct kvp_client_stats st;
	int32_t ids[2];

	(void)state;
	assert_ok(kvp_client_allocate(a, 2, ids));
	assert_status(kvp_client_free(b, ids, 1), KVP_ENOTOWNER);
	assert_ok(kvp_client_touch(b, ids, 1));
	assert_ok(kvp_client_free(b, ids, 1));
	assert_status(kvp_client_free(b, ids, 1), KVP_ENOTOWNER);
	/* Goodbye releases what the session still holds. */
	kvp_client_close(a);
	assert_ok(kvp_client_stats(b, &st));
	assert_int_equal(st.num_free, 9);
	kvp_client_close(b);
}

static void
test_service_bad_calls_get_clear_statuses(void **state)
{
	struct kvp_client *c = open_on(tcp_url, "default", 0);
	struct kvp_client_options o = {.url = ipc_url, .pool = "nope", .timeout_ms = 2000};
	struct kvp_client *x = NULL;
	int32_t ids[128] = {0};

	(void)state;
	assert_status(kvp_client_open(&o, &x), KVP_EUNKNOWNPOOL);
	assert_status(kvp_client_touch(c, (int32_t[]){10}, 1), KVP_ERANGE);
	assert_status(kvp_client_free(c, (int32_t[]){-1}, 1), KVP_ERANGE);
	assert_status(kvp_client_touch(c, ids, 65), KVP_EINVAL); /* over --max-ids */
	assert_status(kvp_client_free(c, (int32_t[]){4}, 1), KVP_ENOTOWNER);
	struct kvp_client_cache ca = {.block_ids = (int32_t[]){1}, .num_block_ids = 1,
	                              .num_full_blocks = 1, .hashes = (uint8_t[32]){0},
	                              .num_hashes = 1};
	assert_status(kvp_client_cache(c, &ca, NULL), KVP_ENOTOWNER);
	/* A group the pool does not have: refused, nothing cached under it. */
	int32_t mine;
	assert_ok(kvp_client_allocate(c, 1, &mine));
	struct kvp_client_cache cg = {.block_ids = &mine, .num_block_ids = 1, .num_full_blocks = 1,
	                              .hashes = (uint8_t[32]){7}, .num_hashes = 1,
	                              .group_id = UINT32_MAX};
	assert_status(kvp_client_cache(c, &cg, NULL), KVP_EINVAL);
	assert_non_null(strstr(kvp_client_last_detail(c), "has 1 group(s)"));
	cg.group_id = 1;
	assert_status(kvp_client_cache(c, &cg, NULL), KVP_EINVAL);
	uint32_t nhit = 0, htok = 0;
	struct kvp_client_lookup lq = {.hashes = (uint8_t[32]){7}, .num_hashes = 1,
	                               .group_ids = (uint32_t[]){1}, .num_groups = 1};
	assert_status(kvp_client_lookup(c, &lq, ids, 128, &nhit, &htok), KVP_EINVAL);
	/* Arguments that contradict themselves are refused before anything is sent, by the
	 * direct call and the batch alike (one builder serves both). */
	struct kvp_client_cache cn = {.block_ids = NULL, .num_block_ids = 3, .num_full_blocks = 1};
	struct kvp_batch *bn;
	assert_status(kvp_client_cache(c, &cn, NULL), KVP_EINVAL);
	assert_ok(kvp_batch_create(&bn));
	assert_status(kvp_batch_cache(bn, &cn), KVP_EINVAL);
	assert_status(kvp_batch_cache(bn, NULL), KVP_EINVAL);
	assert_status(kvp_batch_lookup(bn, NULL), KVP_EINVAL);
	assert_status(kvp_batch_allocate_slots(bn, NULL), KVP_EINVAL);
	assert_int_equal(kvp_batch_count(bn), 0);
	kvp_batch_destroy(bn);
	assert_ok(kvp_client_free(c, &mine, 1));
	/* A session that never said Hello. */
	o.pool = "default";
	o.session_id = 12345;
	x = NULL;
	assert_status(kvp_client_open(&o, &x), KVP_EUNAUTH); /* resuming checks the session */
	assert_null(x);
	kvp_client_close(c);
}

/* Speaks the wire directly: garbage, truncations, versions, retries. */
static nng_socket raw_sock;

static void
raw_open(void)
{
	assert_int_equal(nng_req0_open(&raw_sock), 0);
	assert_int_equal(nng_socket_set_ms(raw_sock, NNG_OPT_RECVTIMEO, 3000), 0);
	assert_int_equal(nng_dial(raw_sock, ipc_url, NULL, 0), 0);
}

static Kvpool__V1__Reply *
raw_call(const void *buf, size_t len)
{
	void *rb = NULL;
	size_t rl = 0;
	assert_int_equal(nng_send(raw_sock, (void *)buf, len, 0), 0);
	assert_int_equal(nng_recv(raw_sock, &rb, &rl, NNG_FLAG_ALLOC), 0);
	Kvpool__V1__Reply *r = kvpool__v1__reply__unpack(NULL, rl, rb);
	nng_free(rb, rl);
	assert_non_null(r);
	return r;
}

static size_t
pack_req(Kvpool__V1__Request *rq, uint8_t *buf)
{
	return kvpool__v1__request__pack(rq, buf);
}

/* Opens a session with a raw Hello on raw_sock; returns its id. */
static uint64_t
raw_hello(const char *pool, uint8_t *buf)
{
	Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
	Kvpool__V1__HelloRequest h = KVPOOL__V1__HELLO_REQUEST__INIT;
	h.protocol_version = 1;
	rq.pool = (char *)pool;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_HELLO;
	rq.hello = &h;
	Kvpool__V1__Reply *r = raw_call(buf, pack_req(&rq, buf));
	assert_int_equal(r->status, 0);
	uint64_t sid = r->hello->session_id;
	kvpool__v1__reply__free_unpacked(r, NULL);
	return sid;
}

static void
test_service_hostile_bytes_are_answered_and_serving_continues(void **state)
{
	uint8_t buf[4096];
	Kvpool__V1__Reply *r;
	uint64_t seed = (uint64_t)time(NULL);

	(void)state;
	printf("hostile: seed %llu\n", (unsigned long long)seed);
	srand((unsigned)seed);
	raw_open();
	/* Random bytes. */
	for (int i = 0; i < 200; i++) {
		size_t n = (size_t)(rand() % 300);
		for (size_t k = 0; k < n; k++)
			buf[k] = (uint8_t)rand();
		r = raw_call(buf, n);
		/* Random bytes rarely decode; when they do they name no pool or session. */
		assert_int_not_equal(r->status, KVPOOL__V1__STATUS__STATUS_OK);
		kvpool__v1__reply__free_unpacked(r, NULL);
	}
	/* A valid Hello, then every truncation of it. */
	Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
	Kvpool__V1__HelloRequest h = KVPOOL__V1__HELLO_REQUEST__INIT;
	h.protocol_version = 1;
	h.client_name = "raw";
	rq.pool = "default";
	rq.call_case = KVPOOL__V1__REQUEST__CALL_HELLO;
	rq.hello = &h;
	size_t n = pack_req(&rq, buf);
	for (size_t cut = 1; cut < n; cut++) {
		r = raw_call(buf, cut);
		kvpool__v1__reply__free_unpacked(r, NULL);
	}
	/* Wrong protocol version. */
	h.protocol_version = 2;
	n = pack_req(&rq, buf);
	r = raw_call(buf, n);
	assert_int_equal(r->status, KVPOOL__V1__STATUS__STATUS_UNSUPPORTED_VERSION);
	kvpool__v1__reply__free_unpacked(r, NULL);
	/* A message over --max-msg-bytes (within the transport's slack). */
	static uint8_t big[70000];
	memset(big, 0x08, sizeof(big));
	r = raw_call(big, sizeof(big));
	assert_int_equal(r->status, KVPOOL__V1__STATUS__STATUS_MESSAGE_TOO_LARGE);
	kvpool__v1__reply__free_unpacked(r, NULL);
	/* No call at all. */
	Kvpool__V1__Request empty = KVPOOL__V1__REQUEST__INIT;
	empty.pool = "default";
	h.protocol_version = 1;
	n = pack_req(&rq, buf);
	r = raw_call(buf, n);
	assert_int_equal(r->status, KVPOOL__V1__STATUS__STATUS_OK);
	empty.session_id = r->hello->session_id;
	kvpool__v1__reply__free_unpacked(r, NULL);
	n = pack_req(&empty, buf);
	r = raw_call(buf, n);
	assert_int_equal(r->status, KVPOOL__V1__STATUS__STATUS_INVALID_ARGUMENT);
	kvpool__v1__reply__free_unpacked(r, NULL);
	/* A request id this session never created. */
	Kvpool__V1__GetComputedBlocksRequest g = KVPOOL__V1__GET_COMPUTED_BLOCKS_REQUEST__INIT;
	empty.call_case = KVPOOL__V1__REQUEST__CALL_GET_COMPUTED_BLOCKS;
	empty.get_computed_blocks = &g;
	n = pack_req(&empty, buf);
	r = raw_call(buf, n);
	assert_int_equal(r->status, KVPOOL__V1__STATUS__STATUS_NOT_FOUND);
	kvpool__v1__reply__free_unpacked(r, NULL);
	nng_close(raw_sock);

	/* Still serving, invariants intact. */
	struct kvp_client *c = open_on(ipc_url, "default", 0);
	int32_t ids[2];
	assert_ok(kvp_client_allocate(c, 2, ids));
	kvp_client_close(c);
}

/*
 * Every extra key is bounded (KVP_MAX_KEY_LEN bytes): a LoRA name, salt or
 * mm identifier one byte over is refused before anything is hashed. Sent as
 * raw wire messages, so the daemon's own check is what answers.
 */
static void
test_service_overlong_extra_keys_are_refused(void **state)
{
	static uint8_t buf[16384];
	static char key[KVP_MAX_KEY_LEN + 2];
	int64_t tokens[16];
	Kvpool__V1__Reply *r;

	(void)state;
	for (int i = 0; i < 16; i++)
		tokens[i] = 40 + i;
	raw_open();
	uint64_t sid = raw_hello("default", buf);

	Kvpool__V1__MmFeature mf = KVPOOL__V1__MM_FEATURE__INIT;
	Kvpool__V1__MmFeature *mfp = &mf;
	mf.offset = 0;
	mf.length = 4;
	for (int which = 0; which < 3; which++) {
		for (size_t len = KVP_MAX_KEY_LEN; len <= KVP_MAX_KEY_LEN + 1; len++) {
			Kvpool__V1__RequestKeys k = KVPOOL__V1__REQUEST_KEYS__INIT;
			Kvpool__V1__LookupRequest lm = KVPOOL__V1__LOOKUP_REQUEST__INIT;
			Kvpool__V1__Request q = KVPOOL__V1__REQUEST__INIT;
			memset(key, 'k', len);
			key[len] = '\0';
			if (which == 0)
				k.lora_name = key;
			else if (which == 1)
				k.cache_salt = key;
			else {
				mf.identifier = key;
				k.mm = &mfp;
				k.n_mm = 1;
			}
			lm.token_ids = tokens;
			lm.n_token_ids = 16;
			lm.keys = &k;
			q.pool = "default";
			q.session_id = sid;
			q.call_case = KVPOOL__V1__REQUEST__CALL_LOOKUP;
			q.lookup = &lm;
			r = raw_call(buf, pack_req(&q, buf));
			if (len > KVP_MAX_KEY_LEN) {
				assert_int_equal(r->status, KVP_EINVAL);
				assert_non_null(strstr(r->detail, "over 1024 bytes"));
			} else {
				assert_int_equal(r->status, KVP_OK);
			}
			kvpool__v1__reply__free_unpacked(r, NULL);
		}
	}
	Kvpool__V1__GoodbyeRequest gm = KVPOOL__V1__GOODBYE_REQUEST__INIT;
	Kvpool__V1__Request g = KVPOOL__V1__REQUEST__INIT;
	g.pool = "default";
	g.session_id = sid;
	g.call_case = KVPOOL__V1__REQUEST__CALL_GOODBYE;
	g.goodbye = &gm;
	r = raw_call(buf, pack_req(&g, buf));
	assert_int_equal(r->status, KVP_OK);
	kvpool__v1__reply__free_unpacked(r, NULL);
	nng_close(raw_sock);
}

static void
test_service_retried_call_id_is_applied_once(void **state)
{
	uint8_t buf[512];
	Kvpool__V1__Reply *r, *r2;
	struct kvp_client *c = open_on(ipc_url, "tiny", 0);
	struct kvp_client_stats st;

	(void)state;
	raw_open();
	uint64_t sid = raw_hello("tiny", buf);

	Kvpool__V1__Request a = KVPOOL__V1__REQUEST__INIT;
	Kvpool__V1__AllocateRequest am = KVPOOL__V1__ALLOCATE_REQUEST__INIT;
	am.num_blocks = 3;
	a.pool = "tiny";
	a.session_id = sid;
	a.call_id = 777;
	a.call_case = KVPOOL__V1__REQUEST__CALL_ALLOCATE;
	a.allocate = &am;
	size_t n = pack_req(&a, buf);
	r = raw_call(buf, n);
	r2 = raw_call(buf, n); /* the "retry" */
	assert_int_equal(r->status, 0);
	assert_int_equal(r2->status, 0);
	assert_int_equal(r2->call_id, 777);
	assert_int_equal(r2->allocate->n_block_ids, 3);
	assert_memory_equal(r->allocate->block_ids, r2->allocate->block_ids, 3 * sizeof(int32_t));
	kvpool__v1__reply__free_unpacked(r, NULL);
	kvpool__v1__reply__free_unpacked(r2, NULL);
	assert_ok(kvp_client_stats(c, &st));
	assert_int_equal(st.num_free, 7 - 3); /* applied once */
	/* A new call id allocates again. */
	a.call_id = 778;
	r = raw_call(buf, pack_req(&a, buf));
	assert_int_equal(r->status, 0);
	kvpool__v1__reply__free_unpacked(r, NULL);
	assert_ok(kvp_client_stats(c, &st));
	assert_int_equal(st.num_free, 1);
	/* Call id 777 again for a different call: refused, not the old reply. */
	a.call_id = 777;
	am.num_blocks = 1;
	r = raw_call(buf, pack_req(&a, buf));
	assert_int_equal(r->status, KVP_EINVAL);
	assert_non_null(strstr(r->detail, "already used for another call"));
	kvpool__v1__reply__free_unpacked(r, NULL);
	assert_ok(kvp_client_stats(c, &st));
	assert_int_equal(st.num_free, 1);
	am.num_blocks = 3; /* the true retry still gets the first reply */
	r = raw_call(buf, pack_req(&a, buf));
	assert_int_equal(r->status, KVP_OK);
	assert_int_equal(r->allocate->n_block_ids, 3);
	kvpool__v1__reply__free_unpacked(r, NULL);
	/* Goodbye over the raw socket releases all six. */
	Kvpool__V1__GoodbyeRequest gb = KVPOOL__V1__GOODBYE_REQUEST__INIT;
	a.call_case = KVPOOL__V1__REQUEST__CALL_GOODBYE;
	a.goodbye = &gb;
	a.call_id = 779;
	r = raw_call(buf, pack_req(&a, buf));
	assert_int_equal(r->goodbye->references_released, 6);
	kvpool__v1__reply__free_unpacked(r, NULL);
	assert_ok(kvp_client_stats(c, &st));
	assert_int_equal(st.num_free, 7);
	nng_close(raw_sock);
	kvp_client_close(c);
}

static void
test_service_batch_runs_in_order_and_stops_at_failure(void **state)
{
	uint8_t buf[1024];
	Kvpool__V1__Reply *r;
	struct kvp_client *c = open_on(ipc_url, "tiny", 0);

	(void)state;
	raw_open();
	uint64_t sid = raw_hello("tiny", buf);

	Kvpool__V1__AllocateRequest al = KVPOOL__V1__ALLOCATE_REQUEST__INIT;
	Kvpool__V1__StatsRequest stq = KVPOOL__V1__STATS_REQUEST__INIT;
	Kvpool__V1__FreeRequest fr = KVPOOL__V1__FREE_REQUEST__INIT;
	Kvpool__V1__BatchCall c0 = KVPOOL__V1__BATCH_CALL__INIT, c1 = KVPOOL__V1__BATCH_CALL__INIT,
			      c2 = KVPOOL__V1__BATCH_CALL__INIT, c3 = KVPOOL__V1__BATCH_CALL__INIT;
	al.num_blocks = 2;
	c0.call_case = KVPOOL__V1__BATCH_CALL__CALL_ALLOCATE;
	c0.allocate = &al;
	c1.call_case = KVPOOL__V1__BATCH_CALL__CALL_STATS;
	c1.stats = &stq;
	fr.block_ids = (int32_t[]){5};
	fr.n_block_ids = 1;
	c2.call_case = KVPOOL__V1__BATCH_CALL__CALL_FREE; /* block 5 is not ours */
	c2.free = &fr;
	c3.call_case = KVPOOL__V1__BATCH_CALL__CALL_STATS;
	c3.stats = &stq;
	Kvpool__V1__BatchCall *calls[] = {&c0, &c1, &c2, &c3};
	Kvpool__V1__BatchRequest b = KVPOOL__V1__BATCH_REQUEST__INIT;
	b.calls = calls;
	b.n_calls = 4;
	Kvpool__V1__Request br = KVPOOL__V1__REQUEST__INIT;
	br.pool = "tiny";
	br.session_id = sid;
	br.call_id = 5;
	br.call_case = KVPOOL__V1__REQUEST__CALL_BATCH;
	br.batch = &b;
	r = raw_call(buf, pack_req(&br, buf));
	assert_int_equal(r->status, KVPOOL__V1__STATUS__STATUS_NOT_OWNER);
	assert_int_equal(r->result_case, KVPOOL__V1__REPLY__RESULT_BATCH);
	assert_int_equal(r->batch->n_replies, 3);
	assert_int_equal(r->batch->replies[0]->allocate->n_block_ids, 2);
	assert_int_equal(r->batch->replies[1]->stats->num_free, 5);
	assert_int_equal(r->batch->replies[2]->status, KVPOOL__V1__STATUS__STATUS_NOT_OWNER);
	kvpool__v1__reply__free_unpacked(r, NULL);
	nng_close(raw_sock); /* no Goodbye: the lease (5 s) would clean up; the teardown does */
	kvp_client_close(c);
}

/* A client that vanishes has its blocks released when its lease runs out. */
static void
test_service_lease_expiry_releases_blocks(void **state)
{
	struct kvp_client *gone = open_on(ipc_url, "secure", 300);
	struct kvp_client *watcher = open_on(ipc_url, "secure", 0);
	struct kvp_client_stats st;
	int32_t ids[8];

	(void)state;
	assert_ok(kvp_client_allocate(gone, 8, ids));
	kvp_client_detach(gone); /* crashed: no Goodbye */
	assert_ok(kvp_client_stats(watcher, &st));
	assert_int_equal(st.num_free, 31 - 8);
	for (int i = 0; i < 100 && st.num_free != 31; i++) {
		sleep_ms(50);
		assert_ok(kvp_client_stats(watcher, &st));
	}
	assert_int_equal(st.num_free, 31);
	assert_true(st.leases_expired >= 1);
	kvp_client_close(watcher);
}

/* The operator's --lease-ms (5000 here) caps what a client asks for. */
static void
test_service_requested_lease_is_capped_by_the_operator(void **state)
{
	(void)state;
	struct kvp_client *big = open_on(ipc_url, "default", 4294967295u);
	struct kvp_client *small = open_on(ipc_url, "default", 1000);
	struct kvp_client *dflt = open_on(ipc_url, "default", 0);
	assert_int_equal(kvp_client_info(big)->lease_ms, 5000);
	assert_int_equal(kvp_client_info(small)->lease_ms, 1000);
	assert_int_equal(kvp_client_info(dflt)->lease_ms, 5000);
	kvp_client_close(big);
	kvp_client_close(small);
	kvp_client_close(dflt);
}

static void
test_service_session_limit_is_busy(void **state)
{
	struct kvp_client *c[13] = {0};
	struct kvp_client_options o = {.url = ipc_url, .pool = "secure", .timeout_ms = 2000};
	int busy = 0;

	(void)state;
	for (int i = 0; i < 13; i++) {
		int rv = kvp_client_open(&o, &c[i]);
		if (rv == KVP_EBUSY) {
			busy++; /* with the daemon's reason, not an empty detail */
			assert_non_null(strstr(kvp_client_open_detail(), "sessions, the limit"));
		} else
			assert_ok(rv);
	}
	assert_int_equal(busy, 1);
	for (int i = 0; i < 13; i++)
		kvp_client_close(c[i]);
}

/* vLLM's manager over the wire: prefix sharing, the last-token cap, decode, preemption. */
static void
test_service_request_level_calls_share_prefixes(void **state)
{
	struct kvp_client *c = open_on(ipc_url, "secure", 0);
	struct kvp_client *other = open_on(ipc_url, "secure", 0);
	struct kvp_client_slots_result res;
	struct kvp_client_stats st;
	int32_t fresh[16], hits[16];
	int64_t prompt[13];
	size_t n;
	uint32_t hit;

	(void)state;
	for (int i = 0; i < 13; i++)
		prompt[i] = 500 + i;
	struct kvp_client_slots a = {.request_id = 1, .prompt = prompt, .num_prompt = 12,
	                             .use_prefix_cache = true};
	assert_ok(kvp_client_allocate_slots(c, &a, fresh, 16, &res));
	assert_int_equal(res.hit_tokens, 0);
	assert_int_equal(res.num_scheduled_tokens, 12);
	assert_int_equal(res.num_new_blocks, 3);
	assert_int_equal(res.num_computed_tokens, 12);
	/* Decode one token: a fourth block. */
	int64_t t = 900;
	struct kvp_client_slots d = {.request_id = 1, .new_tokens = &t, .num_new_token_ids = 1,
	                             .num_new_tokens = 1};
	assert_ok(kvp_client_allocate_slots(c, &d, fresh + 3, 13, &res));
	assert_int_equal(res.num_new_blocks, 1);
	/* Another session's request with the same 13-token prompt hits all 3 full blocks. */
	struct kvp_client_slots b = {.request_id = 1, .prompt = prompt, .num_prompt = 13,
	                             .use_prefix_cache = true};
	assert_status(kvp_client_get_computed_blocks(other, 1, hits, 16, &n, &hit), KVP_ENOTFOUND);
	assert_ok(kvp_client_allocate_slots(other, &b, hits, 16, &res));
	assert_int_equal(res.hit_tokens, 12);
	assert_int_equal(res.num_scheduled_tokens, 1);
	assert_int_equal(res.num_new_blocks, 1);
	assert_ok(kvp_client_get_computed_blocks(other, 1, hits, 16, &n, &hit));
	assert_int_equal(hit, 12);
	assert_int_equal(n, 3);
	assert_ids(hits, 3, fresh[0], fresh[1], fresh[2]);
	/* Request ids are per session: the other session cannot free ours. */
	assert_ok(kvp_client_free_request(other, 1, false));
	assert_status(kvp_client_free_request(other, 1, false), KVP_ENOTFOUND);
	assert_ok(kvp_client_free_request(c, 1, true)); /* preempt: kept */
	struct kvp_client_slots again = {.request_id = 1, .num_new_tokens = 0, .token_budget = 4,
	                                 .use_prefix_cache = true};
	assert_ok(kvp_client_allocate_slots(c, &again, fresh, 16, &res));
	assert_int_equal(res.hit_tokens, 12); /* 13 tokens, 3 blocks cached */
	assert_int_equal(res.num_scheduled_tokens, 1);
	/* Prompt on an existing request: refused. */
	assert_status(kvp_client_allocate_slots(c, &a, fresh, 16, &res), KVP_ESTATE);
	kvp_client_close(c);
	kvp_client_close(other);
	struct kvp_client *w = open_on(ipc_url, "secure", 0);
	assert_ok(kvp_client_stats(w, &st));
	assert_int_equal(st.num_free, 31);
	assert_int_equal(st.active_requests, 0);
	kvp_client_close(w);
}

/*
 * vLLM keeps no state for a request it could not schedule: a first
 * AllocateSlots refused with NO_SPACE leaves no request behind, and the
 * scheduler's identical retry on its next step is accepted as a first call.
 */
static void
test_service_refused_first_allocate_slots_leaves_no_request(void **state)
{
	struct kvp_client *c = open_on(ipc_url, "tiny", 0);
	struct kvp_client_slots_result res;
	struct kvp_client_stats st;
	int32_t ids[16];
	int64_t prompt[20];
	size_t n;
	uint32_t hit;

	(void)state;
	for (int i = 0; i < 20; i++)
		prompt[i] = 7000 + i;
	/* Earlier tests may still hold blocks of this pool: work from what is free. */
	assert_ok(kvp_client_stats(c, &st));
	uint32_t free0 = st.num_free;
	if (free0 < 3 || free0 > 7)
		fail_msg("tiny pool has %u free blocks; the test needs 3 to 7", free0);
	/* Blocks of 4 tokens: the hog leaves 2 free, the victim needs 3. */
	struct kvp_client_slots hog = {.request_id = 1, .prompt = prompt,
	                               .num_prompt = 4 * (free0 - 2)};
	assert_ok(kvp_client_allocate_slots(c, &hog, ids, 16, &res));
	assert_int_equal(res.num_new_blocks, free0 - 2);
	struct kvp_client_slots victim = {.request_id = 2, .prompt = prompt, .num_prompt = 12};
	for (int attempt = 0; attempt < 3; attempt++)
		assert_status(kvp_client_allocate_slots(c, &victim, ids, 16, &res), KVP_ENOSPACE);
	assert_ok(kvp_client_stats(c, &st));
	assert_int_equal(st.active_requests, 1);
	assert_int_equal(st.num_free, 2);
	assert_status(kvp_client_get_computed_blocks(c, 2, ids, 16, &n, &hit), KVP_ENOTFOUND);
	assert_status(kvp_client_free_request(c, 2, false), KVP_ENOTFOUND);
	/* The hog finishes; the same call again is a first call, not WRONG_STATE. */
	assert_ok(kvp_client_free_request(c, 1, false));
	assert_ok(kvp_client_allocate_slots(c, &victim, ids, 16, &res));
	assert_int_equal(res.num_new_blocks, 3);
	assert_ok(kvp_client_free_request(c, 2, false));
	assert_ok(kvp_client_stats(c, &st));
	assert_int_equal(st.active_requests, 0);
	assert_int_equal(st.num_free, free0);
	kvp_client_close(c);
}

/* Runs program with args; returns its exit code, its stdout in out. */
static int
run_tool(const char *program, const char *args, char *out, size_t cap)
{
	char cmd[512];
	size_t n = 0;
	snprintf(cmd, sizeof(cmd), "%s %s 2>/dev/null", program, args);
	FILE *f = popen(cmd, "r");
	if (f == NULL)
		return -1;
	n = fread(out, 1, cap - 1, f);
	out[n] = '\0';
	int st = pclose(f);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* --version and help answer at once, without dialing (the URL leads nowhere). */
/* A scheduler step whose middle request does not fit goes on past it. */
static void
test_service_batch_continues_past_refused_calls(void **state)
{
	struct kvp_client *c = open_on(ipc_url, "tiny", 0);
	struct kvp_batch *b = NULL;
	struct kvp_batch_result r;
	struct kvp_client_stats st;
	int64_t p1[32], p2[12], p3[4], probe[32];
	size_t run, req_bytes, rep_bytes;

	(void)state;
	for (int i = 0; i < 32; i++)
		p1[i] = 9000 + i;
	for (int i = 0; i < 12; i++)
		p2[i] = 9100 + i;
	for (int i = 0; i < 4; i++)
		p3[i] = 9200 + i;
	assert_ok(kvp_client_stats(c, &st));
	uint32_t free0 = st.num_free;
	if (free0 < 3 || free0 > 7)
		fail_msg("tiny pool has %u free blocks; the test needs 3 to 7", free0);
	uint32_t n1 = free0 - 2; /* blocks of 4 tokens: leaves 2 free */
	assert_ok(kvp_batch_create(&b));
	assert_status(kvp_batch_set_flags(b, 0x80), KVP_EINVAL);
	assert_ok(kvp_batch_set_flags(b, KVP_BATCH_CONTINUE | KVP_BATCH_BORROW));
	struct kvp_client_slots a1 = {.request_id = 11, .prompt = p1, .num_prompt = 4 * n1,
	                              .use_prefix_cache = true};
	struct kvp_client_slots a2 = {.request_id = 12, .prompt = p2, .num_prompt = 12,
	                              .use_prefix_cache = true}; /* 3 blocks: refused */
	struct kvp_client_slots a3 = {.request_id = 13, .prompt = p3, .num_prompt = 4,
	                              .use_prefix_cache = true};
	/* Borrowed: the lookup reads probe when the batch is sent, not now. */
	memset(probe, 0, sizeof(probe));
	struct kvp_client_lookup q = {.tokens = probe, .num_tokens = 4 * n1};
	assert_ok(kvp_batch_allocate_slots(b, &a1));
	assert_ok(kvp_batch_allocate_slots(b, &a2));
	assert_ok(kvp_batch_allocate_slots(b, &a3));
	assert_ok(kvp_batch_stats(b));
	assert_ok(kvp_batch_get_computed_blocks(b, 11));
	assert_ok(kvp_batch_lookup(b, &q));
	memcpy(probe, p1, sizeof(probe));
	assert_status(kvp_client_batch(c, b, &run), KVP_ENOSPACE);
	assert_int_equal(run, 6);
	assert_non_null(strstr(kvp_client_last_detail(c), "1 of 6 calls failed, the first at call 1"));
	assert_ok(kvp_batch_result(b, 0, &r));
	assert_ok(r.status);
	assert_int_equal(r.num_block_ids, n1);
	assert_int_equal(r.slots.num_scheduled_tokens, 4 * n1);
	assert_int_equal(r.slots.num_computed_tokens, 4 * n1);
	assert_int_equal(r.slots.hit_tokens, 0);
	assert_int_equal(r.slots.num_groups, 1);
	assert_int_equal(r.slots.new_blocks_per_group[0], n1);
	assert_ok(kvp_batch_result(b, 1, &r));
	assert_status(r.status, KVP_ENOSPACE);
	assert_false(r.has_block_ids);
	assert_true(r.detail[0] != '\0');
	assert_ok(kvp_batch_result(b, 2, &r));
	assert_ok(r.status);
	assert_int_equal(r.num_block_ids, 1);
	assert_ok(kvp_batch_result(b, 3, &r));
	assert_true(r.has_stats);
	assert_int_equal(r.stats.num_free, 1);
	assert_int_equal(r.stats.active_requests, 2); /* the refused request was not added */
	assert_ok(kvp_batch_result(b, 4, &r)); /* its own hit: all but the last token's block */
	assert_int_equal(r.slots.hit_tokens, 4 * (n1 - 1));
	assert_int_equal(r.num_block_ids, n1 - 1);
	assert_ok(kvp_batch_result(b, 5, &r));
	assert_int_equal(r.count, n1); /* the borrowed tokens as they were at send time */
	assert_int_equal(r.num_hashes, n1);
	assert_status(kvp_batch_result(b, 6, &r), KVP_ENOTFOUND);
	assert_status(r.status, KVP_ENOTFOUND);
	assert_ok(kvp_batch_wire_bytes(b, &req_bytes, &rep_bytes));
	assert_true(req_bytes > 4 * n1 + 12 && rep_bytes > 0);

	/* Copied (no BORROW): changing the caller's array after adding changes nothing. */
	kvp_batch_clear(b);
	assert_ok(kvp_batch_set_flags(b, 0));
	memcpy(probe, p1, sizeof(probe));
	assert_ok(kvp_batch_lookup(b, &q));
	probe[0] = -1;
	assert_ok(kvp_batch_free_request(b, 11, false));
	assert_ok(kvp_batch_free_request(b, 13, false));
	assert_ok(kvp_client_batch(c, b, &run));
	assert_ok(kvp_batch_result(b, 0, &r));
	assert_int_equal(r.count, n1);
	assert_ok(kvp_client_stats(c, &st));
	assert_int_equal(st.num_free, free0);
	assert_int_equal(st.active_requests, 0);
	kvp_batch_destroy(b);
	kvp_client_close(c);
}

static void
test_service_kvpoolctl_version_and_help_do_not_dial(void **state)
{
	static char out[8192];
	const char *nowhere = "--url ipc:///nonexistent/kvpool.ipc --timeout-ms 100000";
	char args[256];

	(void)state;
	snprintf(args, sizeof(args), "%s --version", nowhere);
	assert_int_equal(run_tool(KVPOOLCTL_PATH, args, out, sizeof(out)), 0);
	assert_string_equal(out, "kvpoolctl " KVP_VERSION " (commit " KVP_GIT_COMMIT ")\n");
	const char *helps[] = {"help", "-h", "--help"};
	for (size_t i = 0; i < N_ELEMS(helps); i++) {
		snprintf(args, sizeof(args), "%s %s", nowhere, helps[i]);
		assert_int_equal(run_tool(KVPOOLCTL_PATH, args, out, sizeof(out)), 0);
		assert_non_null(strstr(out, "usage: kvpoolctl"));
	}
	/* kvpoold says the same version. */
	assert_int_equal(run_tool(KVPOOLD_PATH, "--version", out, sizeof(out)), 0);
	assert_string_equal(out, "kvpoold " KVP_VERSION " (commit " KVP_GIT_COMMIT ")\n");
}

/* kvpoolctl: exit codes 0-4 as documented, and with --json every error one object on stdout. */
static void
test_service_kvpoolctl_exit_codes_and_json_errors(void **state)
{
	static char out[8192];
	char args[512];
	const struct {
		const char *args;
		int code;
		const char *json; /* in --json's stdout */
	} cases[] = {
		{"--url ipc:///nonexistent/k.ipc --connect-timeout-ms 200 stats", 3,
		 "\"status\":\"KVP_EUNAVAILABLE\",\"error\":\"unreachable\",\"exit_code\":3"},
		{"alloc -3", 2, "\"error\":\"usage\",\"exit_code\":2,\"detail\":\"alloc: '-3' is "
		                "not a count"},
		{"alloc abc", 2, "\"command\":\"alloc\",\"status\":\"KVP_EINVAL\""},
		{"-u x stats", 2, "unknown option -u"},
		{"stats --tokens 1", 2, "stats does not take --tokens"},
		{"free 1,-2", 2, "not a list of non-negative integers"},
		{"--timeout-ms -1 stats", 2, "--timeout-ms: '-1' is not a whole number"},
		{"frobnicate", 2, "unknown command 'frobnicate'"},
		{"--url %s --pool locked stats", 1,
		 "\"status\":\"KVP_EUNAUTH\",\"error\":\"refused\",\"exit_code\":1"},
		{"--url %s --pool nosuch stats", 1, "\"status\":\"KVP_EUNKNOWNPOOL\""},
		{"--url %s --pool default write --blocks 1 --in /nonexistent/in", 4,
		 "\"error\":\"local\",\"exit_code\":4"},
		{"--url %s --pool default stats", 0, "\"command\":\"stats\",\"num_blocks\":10"},
	};
	(void)state;
	for (size_t i = 0; i < N_ELEMS(cases); i++) {
		char a[256];
		snprintf(a, sizeof(a), cases[i].args, ipc_url);
		/* Text first: the exit code, nothing on stdout but a success's output. */
		assert_int_equal(run_tool(KVPOOLCTL_PATH, a, out, sizeof(out)), cases[i].code);
		if (cases[i].code != 0)
			assert_string_equal(out, "");
		/* Then --json: the same code, one object on one line. */
		snprintf(args, sizeof(args), "--json %s", a);
		int code = run_tool(KVPOOLCTL_PATH, args, out, sizeof(out));
		if (code != cases[i].code || strstr(out, cases[i].json) == NULL ||
		    out[0] != '{' || strchr(out, '\n') != out + strlen(out) - 1)
			fail_msg("kvpoolctl %s: exit %d, stdout %s", args, code, out);
	}
}

static void
test_service_admin_endpoints_serve_health_and_metrics(void **state)
{
	static char body[1 << 18];
	struct kvp_client *c = open_on(ipc_url, "default", 0);
	int32_t ids[2];

	(void)state;
	assert_ok(kvp_client_allocate(c, 2, ids));
	int32_t other = 1;
	while (other == ids[0] || other == ids[1])
		other++;
	assert_status(kvp_client_free(c, &other, 1), KVP_ENOTOWNER);
	assert_int_equal(http_get(daemon_admin_port(), "/healthz", body, sizeof(body)), 200);
	assert_int_equal(http_get(daemon_admin_port(), "/readyz", body, sizeof(body)), 200);
	assert_int_equal(http_get(daemon_admin_port(), "/nope", body, sizeof(body)), 404);
	assert_int_equal(http_get(daemon_admin_port(), "/metrics", body, sizeof(body)), 200);
	assert_non_null(strstr(body, "kvpool_blocks_in_use{pool=\"default\"} 2\n"));
	assert_non_null(strstr(body, "kvpool_build_info{version=\"" KVP_VERSION "\",commit=\""
	                             KVP_GIT_COMMIT "\"} 1\n"));
	assert_non_null(strstr(body, "kvpool_blocks{pool=\"tiny\"} 8\n"));
	assert_non_null(strstr(body, "kvpool_rpc_calls_total{pool=\"default\",call=\"free\",status=\"NOT_OWNER\"} "));
	assert_non_null(strstr(body, "kvpool_rpc_calls_total{pool=\"default\",call=\"allocate\",status=\"OK\"}"));
	assert_non_null(strstr(body, "kvpool_rpc_latency_seconds_bucket{pool=\"default\","
	                             "call=\"allocate\",le=\"+Inf\"} "));
	assert_non_null(strstr(body, "kvpool_rpc_latency_seconds_count{pool=\"default\","
	                             "call=\"free\"} "));
	/* The calls above held the pool's lock for some time; every pool has the series. */
	const char *held = strstr(body, "kvpool_pool_lock_held_seconds_total{pool=\"default\"} ");
	assert_non_null(held);
	assert_true(strtod(strchr(held, '}') + 2, NULL) > 0);
	assert_non_null(strstr(body, "kvpool_pool_lock_held_seconds_total{pool=\"tiny\"} "));
	assert_non_null(strstr(body, "kvpool_pool_lock_wait_seconds_total{pool=\"default\"} "));
	/* The standard process metrics, with values that can be true of a live daemon. */
	const char *rss = strstr(body, "\nprocess_resident_memory_bytes ");
	assert_non_null(rss);
	assert_true(strtod(rss + 31, NULL) > 1e6);
	const char *fds = strstr(body, "\nprocess_open_fds ");
	assert_non_null(fds);
	assert_true(strtod(fds + 18, NULL) >= 3);
	const char *start = strstr(body, "\nprocess_start_time_seconds ");
	assert_non_null(start);
	double age = (double)time(NULL) - strtod(start + 28, NULL);
	assert_true(age > -5 && age < 600);
	assert_non_null(strstr(body, "\nprocess_cpu_seconds_total "));
	assert_non_null(strstr(body, "\nprocess_max_fds "));
	assert_non_null(strstr(body, "kvpool_sessions{pool=\"default\"} "));
	kvp_client_close(c);
}

/* Eight clients at once, random valid and invalid calls; the pool stays consistent. */
struct worker_arg {
	int index;
	unsigned seed;
	int calls, errors, bad_status;
	char first_bad[256];
};

#define BAD(w, op, rv)                                                                       \
	do {                                                                                 \
		if ((w)->bad_status++ == 0)                                                  \
			snprintf((w)->first_bad, sizeof((w)->first_bad), "%s: %s: %s", (op),   \
			         kvp_status_name(rv), kvp_client_last_detail(c));            \
	} while (0)

static void *
worker(void *arg)
{
	struct worker_arg *w = arg;
	struct kvp_client_options o = {.url = w->index % 2 ? tcp_url : ipc_url, .pool = "secure",
	                               .timeout_ms = 5000, .retries = 3};
	struct kvp_client *c = NULL;
	int32_t held[64], ids[8];
	int nheld = 0;
	unsigned seed = w->seed;

	int orv = kvp_client_open(&o, &c);
	if (orv != KVP_OK) {
		snprintf(w->first_bad, sizeof(w->first_bad), "open: %s", kvp_status_name(orv));
		w->bad_status++;
		return NULL;
	}
	for (int i = 0; i < 300; i++) {
		int rv, op = rand_r(&seed) % 5;
		if (op == 0 && nheld < 56) {
			uint32_t n = 1 + (uint32_t)(rand_r(&seed) % 3);
			rv = kvp_client_allocate(c, n, ids);
			if (rv == KVP_OK)
				for (uint32_t k = 0; k < n; k++)
					held[nheld++] = ids[k];
			else if (rv != KVP_ENOSPACE)
				BAD(w, "allocate", rv);
		} else if (op == 1 && nheld > 0) {
			int k = rand_r(&seed) % nheld;
			rv = kvp_client_free(c, &held[k], 1);
			if (rv != KVP_OK)
				BAD(w, "free", rv);
			held[k] = held[--nheld];
		} else if (op == 2) {
			int64_t tok[8];
			for (int t = 0; t < 8; t++)
				tok[t] = rand_r(&seed) % 4; /* few distinct prefixes: real sharing */
			uint32_t nh = 0, ht = 0;
			struct kvp_client_lookup q = {.tokens = tok, .num_tokens = 8};
			rv = kvp_client_lookup(c, &q, ids, 8, &nh, &ht);
			if (rv == KVP_OK && nh > 0 && nheld + (int)nh <= 64) {
				/* Another client may free and reuse a hit block meanwhile:
				 * touching it is still valid, its contents may just differ. */
				if (kvp_client_touch(c, ids, nh) == KVP_OK)
					for (uint32_t k = 0; k < nh; k++)
						held[nheld++] = ids[k];
			} else if (rv != KVP_OK) {
				BAD(w, "lookup", rv);
			}
		} else if (op == 3 && nheld >= 2) {
			int64_t tok[8];
			for (int t = 0; t < 8; t++)
				tok[t] = rand_r(&seed) % 4;
			struct kvp_client_cache ca = {.block_ids = held + nheld - 2, .num_block_ids = 2,
			                              .num_full_blocks = 2, .tokens = tok, .num_tokens = 8};
			rv = kvp_client_cache(c, &ca, NULL);
			if (rv != KVP_OK && rv != KVP_ESTATE) /* ESTATE: already cached */
				BAD(w, "cache", rv);
		} else {
			rv = kvp_client_free(c, (int32_t[]){40}, 1); /* out of range */
			if (rv != KVP_ERANGE)
				BAD(w, "free out of range", rv);
			w->errors++;
		}
		w->calls++;
	}
	kvp_client_close(c); /* releases what is still held */
	return NULL;
}

static void
test_service_eight_concurrent_clients_keep_invariants(void **state)
{
	pthread_t th[8];
	struct worker_arg args[8];
	unsigned seed = (unsigned)time(NULL);

	(void)state;
	printf("concurrent: seed %u\n", seed);
	for (int i = 0; i < 8; i++) {
		args[i] = (struct worker_arg){.index = i, .seed = seed + (unsigned)i};
		assert_int_equal(pthread_create(&th[i], NULL, worker, &args[i]), 0);
	}
	int calls = 0;
	for (int i = 0; i < 8; i++) {
		pthread_join(th[i], NULL);
		if (args[i].bad_status != 0)
			fail_msg("worker %d: %d unexpected statuses, first: %s", i, args[i].bad_status,
			         args[i].first_bad);
		calls += args[i].calls;
	}
	assert_int_equal(calls, 8 * 300);
	struct kvp_client *c = open_on(ipc_url, "secure", 0);
	struct kvp_client_stats st;
	assert_ok(kvp_client_stats(c, &st));
	assert_int_equal(st.num_free, 31); /* every session released everything */
	kvp_client_close(c);
}

/* A client process that dies without Goodbye: its blocks come back after its lease. */
static void
test_service_dead_client_process_blocks_released_after_lease(void **state)
{
	char cmd[512], sid[64] = "";
	FILE *f;
	struct kvp_client *w = open_on(ipc_url, "secure", 0);
	struct kvp_client_stats st;

	(void)state;
	snprintf(cmd, sizeof(cmd), "%s --url %s --pool secure --lease-ms 400 session", KVPOOLCTL_PATH,
	         ipc_url);
	assert_non_null(f = popen(cmd, "r"));
	assert_non_null(fgets(sid, sizeof(sid), f));
	assert_int_equal(pclose(f), 0);
	sid[strcspn(sid, "\n")] = '\0';
	snprintf(cmd, sizeof(cmd), "%s --url %s --pool secure --session %s alloc 6 >/dev/null",
	         KVPOOLCTL_PATH, ipc_url, sid);
	assert_int_equal(system(cmd), 0);
	assert_ok(kvp_client_stats(w, &st));
	assert_int_equal(st.num_free, 31 - 6);
	for (int i = 0; i < 100 && st.num_free != 31; i++) {
		sleep_ms(50);
		assert_ok(kvp_client_stats(w, &st));
	}
	assert_int_equal(st.num_free, 31);
	kvp_client_close(w);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_service_hello_describes_pool),
		cmocka_unit_test(test_service_block_calls_match_engine_scenarios_ipc),
		cmocka_unit_test(test_service_block_calls_match_engine_scenarios_tcp),
		cmocka_unit_test(test_service_token_is_checked_per_pool),
		cmocka_unit_test(test_service_refusals_say_why),
		cmocka_unit_test(test_service_no_daemon_is_unavailable_not_busy),
		cmocka_unit_test(test_service_cache_from_parent_hash_matches_full_chain),
		cmocka_unit_test(test_service_batch_builder_runs_a_scheduler_step),
		cmocka_unit_test(test_service_ownership_is_per_session),
		cmocka_unit_test(test_service_bad_calls_get_clear_statuses),
		cmocka_unit_test(test_service_hostile_bytes_are_answered_and_serving_continues),
		cmocka_unit_test(test_service_overlong_extra_keys_are_refused),
		cmocka_unit_test(test_service_retried_call_id_is_applied_once),
		cmocka_unit_test(test_service_batch_runs_in_order_and_stops_at_failure),
		cmocka_unit_test(test_service_lease_expiry_releases_blocks),
		cmocka_unit_test(test_service_requested_lease_is_capped_by_the_operator),
		cmocka_unit_test(test_service_session_limit_is_busy),
		cmocka_unit_test(test_service_request_level_calls_share_prefixes),
		cmocka_unit_test(test_service_refused_first_allocate_slots_leaves_no_request),
		cmocka_unit_test(test_service_batch_continues_past_refused_calls),
		cmocka_unit_test(test_service_kvpoolctl_version_and_help_do_not_dial),
		cmocka_unit_test(test_service_kvpoolctl_exit_codes_and_json_errors),
		cmocka_unit_test(test_service_admin_endpoints_serve_health_and_metrics),
		cmocka_unit_test(test_service_eight_concurrent_clients_keep_invariants),
		cmocka_unit_test(test_service_dead_client_process_blocks_released_after_lease),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
