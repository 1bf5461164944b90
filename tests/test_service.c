/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvpoold end to end: a real daemon (fork+exec), real nng sockets on
 * ipc:// and tcp://127.0.0.1, the real client library. Every status code the
 * service produces comes out of at least one call here or in
 * test_service_wire.c (service_fixture.c starts the daemon for both).
 */
#include "daemon_util.h"

#include "kvp_test.h"

#include "common/block_hash.h"
#include "common/kvp_version.h"
#include "clients/c/kvpool.h"
#include "service_fixture.h"

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
		if (strstr(log, "\"references_released\":2") != NULL)
			break;
		sleep_ms(50);
	}
	assert_non_null(strstr(log, "\"msg\":\"lease expired; session ended and its blocks released\""));
	assert_non_null(strstr(log, "\"references_released\":2"));
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

/*
 * A prompt with RequestKeys (LoRA, salt) in a Batch, written by the client's
 * own packer with its prompt as 32-bit ids, is the prompt a lone call sends:
 * it hits what that call cached, and the same tokens without the keys do not.
 */
static void
test_service_keyed_prompts_in_a_batch_hit_as_alone(void **state)
{
	struct kvp_client *c = open_on(ipc_url, "secure", 0);
	struct kvp_request_keys k = {.lora_name = "L", .lora_path = "/adapters/L", .cache_salt = "S"};
	struct kvp_client_slots_result res;
	struct kvp_batch_result br;
	struct kvp_batch *b = NULL;
	int32_t blocks[8];
	int64_t prompt[12];
	size_t run;

	(void)state;
	for (int i = 0; i < 12; i++)
		prompt[i] = 3000000000ll + i; /* past 2^31: still 32-bit ids */
	struct kvp_client_slots a = {.request_id = 21, .prompt = prompt, .num_prompt = 12,
	                             .keys = &k, .use_prefix_cache = true};
	assert_ok(kvp_client_allocate_slots(c, &a, blocks, 8, &res));
	assert_int_equal(res.hit_tokens, 0);
	assert_ok(kvp_batch_create(&b));
	a.request_id = 22;
	assert_ok(kvp_batch_allocate_slots(b, &a));
	a.request_id = 23;
	a.keys = NULL;
	assert_ok(kvp_batch_allocate_slots(b, &a));
	assert_ok(kvp_client_batch(c, b, &run));
	assert_int_equal(run, 2);
	assert_ok(kvp_batch_result(b, 0, &br));
	assert_int_equal(br.slots.hit_tokens, 8); /* 11 tokens before the last: 2 blocks of 4 */
	assert_ok(kvp_batch_result(b, 1, &br));
	assert_int_equal(br.slots.hit_tokens, 0);
	for (uint64_t r = 21; r <= 23; r++)
		assert_ok(kvp_client_free_request(c, r, false));
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
	wait_free(watcher, 31, &st);
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
	uint32_t free0 = tiny_free(c);
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
	char cmd[2048];
	size_t n = 0;
	if ((size_t)snprintf(cmd, sizeof(cmd), "%s %s 2>/dev/null", program, args) >= sizeof(cmd))
		return -1; /* a command we would cut short is not the one asked for */
	FILE *f = popen(cmd, "r");
	if (f == NULL)
		return -1;
	n = fread(out, 1, cap - 1, f);
	out[n] = '\0';
	int st = pclose(f);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
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
		 "\"status\":\"UNAVAILABLE\",\"error\":\"unreachable\",\"exit_code\":3"},
		{"alloc -3", 2, "\"error\":\"usage\",\"exit_code\":2,\"detail\":\"alloc: '-3' is "
		                "not a count"},
		{"alloc abc", 2, "\"command\":\"alloc\",\"status\":\"INVALID_ARGUMENT\""},
		{"-u x stats", 2, "unknown option -u"},
		{"stats --tokens 1", 2, "stats does not take --tokens"},
		{"free 1,-2", 2, "not a list of non-negative integers"},
		{"--timeout-ms -1 stats", 2, "--timeout-ms: '-1' is not a whole number"},
		{"frobnicate", 2, "unknown command 'frobnicate'"},
		/* a URL no transport dials is a usage error; a host that does not resolve says so */
		{"--url http://x stats", 2, "\"error\":\"usage\",\"exit_code\":2"},
		{"--url tcp://no-such-host.invalid:7470 --connect-timeout-ms 200 stats", 3,
		 "its host name does not resolve"},
		{"--url %s --pool locked stats", 1,
		 "\"status\":\"UNAUTHENTICATED\",\"error\":\"refused\",\"exit_code\":1"},
		{"--url %s --pool nosuch stats", 1, "\"status\":\"UNKNOWN_POOL\""},
		{"--url %s --pool default write --blocks 1 --in /nonexistent/in", 4,
		 "\"error\":\"local\",\"exit_code\":4"},
		{"--url %s --pool default stats", 0, "\"command\":\"stats\",\"num_blocks\":10"},
		/* vLLM 0.33 hashes a LoRA's name and path: a name alone is refused, saying so */
		{"--url %s --pool default lookup --tokens 1,2,3,4 --lora L", 1,
		 "\"status\":\"INVALID_ARGUMENT\""},
		{"--url %s --pool default lookup --tokens 1,2,3,4 --lora L --lora-path /a/L", 0,
		 "\"hit_tokens\":0"},
		{"--url %s --pool default lookup --tokens 1,2,3,4 --lora-path /a/L", 2,
		 "--lora-path needs --lora"},
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
		cmocka_unit_test(test_service_keyed_prompts_in_a_batch_hit_as_alone),
		cmocka_unit_test(test_service_ownership_is_per_session),
		cmocka_unit_test(test_service_bad_calls_get_clear_statuses),
		cmocka_unit_test(test_service_lease_expiry_releases_blocks),
		cmocka_unit_test(test_service_requested_lease_is_capped_by_the_operator),
		cmocka_unit_test(test_service_session_limit_is_busy),
		cmocka_unit_test(test_service_request_level_calls_share_prefixes),
		cmocka_unit_test(test_service_refused_first_allocate_slots_leaves_no_request),
		cmocka_unit_test(test_service_kvpoolctl_version_and_help_do_not_dial),
		cmocka_unit_test(test_service_kvpoolctl_exit_codes_and_json_errors),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
