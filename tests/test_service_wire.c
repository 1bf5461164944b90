/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvpoold end to end, continued (service_fixture.c starts the same daemon
 * as test_service): raw bytes on its socket, retried and ordered batches,
 * its admin endpoints, eight concurrent clients, and a client process that
 * dies holding blocks.
 */
#include "daemon_util.h"

#include <pthread.h>

#include "kvp_test.h"

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/util/platform.h>

#include "common/block_hash.h"
#include "common/kvp_version.h"
#include "clients/c/kvpool.h"
#include "kvpool.pb-c.h"
#include "proto/wire.h"
#include "service_fixture.h"

/* Speaks the wire directly: garbage, truncations, versions, retries. */
static nng_socket raw_sock;

static void
raw_open(void)
{
	assert_int_equal(nng_req0_open(&raw_sock), 0);
	assert_int_equal(nng_socket_set_ms(raw_sock, NNG_OPT_RECVTIMEO, 3000), 0);
	/* The daemon may still be starting (this can be the program's first dial). */
	int rv = NNG_ECONNREFUSED;
	for (int i = 0; i < 50 && (rv == NNG_ECONNREFUSED || rv == NNG_ENOENT); i++)
		if ((rv = nng_dial(raw_sock, ipc_url, NULL, 0)) != 0)
			nng_msleep(100);
	assert_int_equal(rv, 0);
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

/* Opens a session with a raw Hello on raw_sock; its id, and (if asked) PoolInfo.prompt_u32. */
static uint64_t
raw_hello(const char *pool, uint8_t *buf, bool *prompt_u32)
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
	if (prompt_u32)
		*prompt_u32 = r->hello->pool->prompt_u32;
	kvpool__v1__reply__free_unpacked(r, NULL);
	return sid;
}

/* Ends session sid with a raw Goodbye. */
static void
raw_goodbye(const char *pool, uint64_t sid, uint8_t *buf)
{
	Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
	Kvpool__V1__GoodbyeRequest g = KVPOOL__V1__GOODBYE_REQUEST__INIT;
	rq.pool = (char *)pool;
	rq.session_id = sid;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_GOODBYE;
	rq.goodbye = &g;
	Kvpool__V1__Reply *r = raw_call(buf, pack_req(&rq, buf));
	assert_int_equal(r->status, KVP_OK);
	kvpool__v1__reply__free_unpacked(r, NULL);
}

/* One raw AllocateSlots of a new request with its prompt as given; the reply (caller frees). */
static Kvpool__V1__Reply *
raw_prompt(uint64_t sid, uint64_t req_id, const int64_t *p64, const uint32_t *p32, size_t n,
           uint8_t *buf)
{
	Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
	Kvpool__V1__AllocateSlotsRequest a = KVPOOL__V1__ALLOCATE_SLOTS_REQUEST__INIT;
	a.request_id = req_id;
	a.prompt_token_ids = (int64_t *)p64;
	a.n_prompt_token_ids = p64 ? n : 0;
	a.prompt_token_ids_u32 = (uint32_t *)p32;
	a.n_prompt_token_ids_u32 = p32 ? n : 0;
	a.use_prefix_cache = true;
	rq.pool = "default";
	rq.session_id = sid;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_ALLOCATE_SLOTS;
	rq.allocate_slots = &a;
	return raw_call(buf, pack_req(&rq, buf));
}

/*
 * A prompt sent as 32-bit ids is the same prompt: a request sent as varints
 * hits the blocks it cached, ids past 2^31 included. Both forms at once are
 * refused, and the pool says it reads the 32-bit form.
 */
static void
test_service_prompt_as_32_bit_ids_is_the_same_prompt(void **state)
{
	uint8_t buf[4096];
	int64_t p64[9] = {4294967295ll, 2147483648ll, 0, 7, 151642, 65536, 128, 127, 3};
	uint32_t p32[9];
	(void)state;
	for (int i = 0; i < 9; i++)
		p32[i] = (uint32_t)p64[i];
	bool prompt_u32 = false;
	raw_open();
	uint64_t sid = raw_hello("default", buf, &prompt_u32);
	assert_true(prompt_u32);

	Kvpool__V1__Reply *r = raw_prompt(sid, 1, NULL, p32, 9, buf); /* caches two blocks of 4 */
	assert_int_equal(r->status, 0);
	assert_int_equal(r->allocate_slots->hit_tokens, 0);
	kvpool__v1__reply__free_unpacked(r, NULL);
	r = raw_prompt(sid, 2, p64, NULL, 9, buf);
	assert_int_equal(r->status, 0);
	assert_int_equal(r->allocate_slots->hit_tokens, 8);
	kvpool__v1__reply__free_unpacked(r, NULL);
	r = raw_prompt(sid, 3, p64, p32, 9, buf);
	assert_int_equal(r->status, KVP_EINVAL);
	assert_non_null(strstr(r->detail, "prompt given twice"));
	kvpool__v1__reply__free_unpacked(r, NULL);

	raw_goodbye("default", sid, buf);
	nng_close(raw_sock);
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

/* A raw Lookup of n tokens with these keys on pool "default": the daemon's reply. */
static Kvpool__V1__Reply *
raw_lookup(uint64_t sid, Kvpool__V1__RequestKeys *k, int64_t *tokens, size_t n, uint8_t *buf)
{
	Kvpool__V1__LookupRequest lm = KVPOOL__V1__LOOKUP_REQUEST__INIT;
	Kvpool__V1__Request q = KVPOOL__V1__REQUEST__INIT;
	lm.token_ids = tokens;
	lm.n_token_ids = n;
	lm.keys = k;
	q.pool = "default";
	q.session_id = sid;
	q.call_case = KVPOOL__V1__REQUEST__CALL_LOOKUP;
	q.lookup = &lm;
	return raw_call(buf, pack_req(&q, buf));
}

/*
 * Every extra key is bounded (KVP_MAX_KEY_LEN bytes): a LoRA name or path,
 * salt or mm identifier one byte over is refused before anything is hashed.
 * A LoRA name without its path is refused too, naming the field: this pool
 * hashes as vLLM 0.33, which hashes both. Sent as raw wire messages, so the
 * daemon's own check is what answers.
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
	uint64_t sid = raw_hello("default", buf, NULL);

	Kvpool__V1__MmFeature mf = KVPOOL__V1__MM_FEATURE__INIT;
	Kvpool__V1__MmFeature *mfp = &mf;
	mf.offset = 0;
	mf.length = 4;
	for (int which = 0; which < 4; which++) {
		for (size_t len = KVP_MAX_KEY_LEN; len <= KVP_MAX_KEY_LEN + 1; len++) {
			Kvpool__V1__RequestKeys k = KVPOOL__V1__REQUEST_KEYS__INIT;
			memset(key, 'k', len);
			key[len] = '\0';
			if (which == 0) {
				k.lora_name = key;
				k.lora_path = "/adapters/k";
			} else if (which == 3) {
				k.lora_name = "k";
				k.lora_path = key;
			} else if (which == 1)
				k.cache_salt = key;
			else {
				mf.identifier = key;
				k.mm = &mfp;
				k.n_mm = 1;
			}
			r = raw_lookup(sid, &k, tokens, 16, buf);
			if (len > KVP_MAX_KEY_LEN) {
				assert_int_equal(r->status, KVP_EINVAL);
				assert_non_null(strstr(r->detail, "over 1024 bytes"));
			} else {
				assert_int_equal(r->status, KVP_OK);
			}
			kvpool__v1__reply__free_unpacked(r, NULL);
		}
	}
	Kvpool__V1__RequestKeys k = KVPOOL__V1__REQUEST_KEYS__INIT;
	k.lora_name = "adapter";
	r = raw_lookup(sid, &k, tokens, 16, buf);
	assert_int_equal(r->status, KVP_EINVAL);
	assert_non_null(strstr(r->detail, "LoRA adapter has no lora_path"));
	kvpool__v1__reply__free_unpacked(r, NULL);
	raw_goodbye("default", sid, buf);
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
	uint64_t sid = raw_hello("tiny", buf, NULL);

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
	uint64_t sid = raw_hello("tiny", buf, NULL);

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
	uint32_t free0 = tiny_free(c);
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
	wait_free(w, 31, &st);
	assert_int_equal(st.num_free, 31);
	kvp_client_close(w);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_service_hostile_bytes_are_answered_and_serving_continues),
		cmocka_unit_test(test_service_prompt_as_32_bit_ids_is_the_same_prompt),
		cmocka_unit_test(test_service_overlong_extra_keys_are_refused),
		cmocka_unit_test(test_service_retried_call_id_is_applied_once),
		cmocka_unit_test(test_service_batch_runs_in_order_and_stops_at_failure),
		cmocka_unit_test(test_service_batch_continues_past_refused_calls),
		cmocka_unit_test(test_service_admin_endpoints_serve_health_and_metrics),
		cmocka_unit_test(test_service_eight_concurrent_clients_keep_invariants),
		cmocka_unit_test(test_service_dead_client_process_blocks_released_after_lease),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
