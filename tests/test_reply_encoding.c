/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ReadBlocks replies are encoded by hand so the executor reads straight
 * into the outgoing message. These tests hold that encoding to protobuf-c's
 * own bytes for the same reply, in process (kvpd_core, no sockets), and
 * check the executor settings of the configuration.
 */
#include "kvp_test.h"

#include <stdlib.h>

#include "service/config/config.h"
#include "common/crc32c.h"
#include "kvpool.pb-c.h"
#include "service/rpc/dispatch.h"
#include "service/pool/server.h"

static struct kvpd_server *srv;
static uint64_t session;

static Kvpool__V1__Reply *
handle(Kvpool__V1__Request *rq, uint8_t **bytes, size_t *len)
{
	size_t n = kvpool__v1__request__get_packed_size(rq);
	uint8_t *req = malloc(n);
	kvpool__v1__request__pack(rq, req);
	assert_ok(kvpd_server_handle(srv, req, n, 1000, bytes, len));
	free(req);
	Kvpool__V1__Reply *r = kvpool__v1__reply__unpack(NULL, *len, *bytes);
	assert_non_null(r);
	return r;
}

static int
setup(void **state)
{
	(void)state;
	struct kvpd_config cfg;
	char err[512];
	char *argv[] = {"kvpoold", "--quiet", "--pool", "name=p,blocks=300,block_size=3",
	                "--kv-layers", "2", "--kv-heads", "1", "--kv-head-size", "5", "--kv-dtype",
	                "fp32", NULL};
	FILE *devnull = fopen("/dev/null", "w");
	int rv = kvpd_config_load(&cfg, 12, argv, NULL, devnull, devnull);
	fclose(devnull);
	if (rv != 0 || kvpd_server_create(&cfg, &srv, err, sizeof(err)) != KVP_OK)
		return -1;
	Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
	Kvpool__V1__HelloRequest h = KVPOOL__V1__HELLO_REQUEST__INIT;
	h.protocol_version = 1;
	rq.pool = "p";
	rq.call_case = KVPOOL__V1__REQUEST__CALL_HELLO;
	rq.hello = &h;
	uint8_t *b;
	size_t len;
	Kvpool__V1__Reply *r = handle(&rq, &b, &len);
	session = r->hello->session_id;
	/* 2 layers x K,V x 3 tokens x 1 head x 5 x fp32 = 240 bytes a block. */
	assert_int_equal(r->hello->pool->executor->block_bytes, 240);
	assert_string_equal(r->hello->pool->executor->dtype, "fp32");
	kvpool__v1__reply__free_unpacked(r, NULL);
	free(b);
	return 0;
}

static int
teardown(void **state)
{
	(void)state;
	kvpd_server_destroy(srv);
	return 0;
}

static void
read_reply_is_protobuf_c_bytes(void **state)
{
	(void)state;
	Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
	Kvpool__V1__AllocateRequest a = KVPOOL__V1__ALLOCATE_REQUEST__INIT;
	uint8_t *b, payload[200 * 240];
	size_t len;

	rq.pool = "p";
	rq.session_id = session;
	rq.call_id = 5;
	a.num_blocks = 200; /* varints of several bytes in every length */
	rq.call_case = KVPOOL__V1__REQUEST__CALL_ALLOCATE;
	rq.allocate = &a;
	Kvpool__V1__Reply *r = handle(&rq, &b, &len);
	assert_int_equal(r->status, 0);
	int32_t ids[200];
	memcpy(ids, r->allocate->block_ids, sizeof(ids));
	kvpool__v1__reply__free_unpacked(r, NULL);
	free(b);

	for (size_t i = 0; i < sizeof(payload); i++)
		payload[i] = (uint8_t)(i * 7 + 3);
	Kvpool__V1__WriteBlocksRequest w = KVPOOL__V1__WRITE_BLOCKS_REQUEST__INIT;
	w.block_ids = ids;
	w.n_block_ids = 200;
	w.payload.data = payload;
	w.payload.len = sizeof(payload);
	rq.call_id = 6;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_WRITE_BLOCKS;
	rq.write_blocks = &w;
	r = handle(&rq, &b, &len);
	assert_int_equal(r->status, 0);
	kvpool__v1__reply__free_unpacked(r, NULL);
	free(b);

	/* Call ids of one byte, several bytes, and 0 (omitted from the reply). */
	const uint64_t call_ids[] = {7, 300, 1ull << 40, 0};
	const size_t counts[] = {1, 2, 17, 200};
	for (size_t k = 0; k < N_ELEMS(call_ids); k++)
		for (size_t m = 0; m < N_ELEMS(counts); m++) {
			Kvpool__V1__ReadBlocksRequest rd = KVPOOL__V1__READ_BLOCKS_REQUEST__INIT;
			rd.block_ids = ids;
			rd.n_block_ids = counts[m];
			rq.call_id = call_ids[k];
			rq.call_case = KVPOOL__V1__REQUEST__CALL_READ_BLOCKS;
			rq.read_blocks = &rd;
			r = handle(&rq, &b, &len);
			assert_int_equal(r->status, 0);
			assert_int_equal(r->call_id, call_ids[k]);
			assert_int_equal(r->read_blocks->payload.len, counts[m] * 240);
			assert_memory_equal(r->read_blocks->payload.data, payload, counts[m] * 240);
			assert_int_equal(r->read_blocks->n_crc32c, counts[m]);
			for (size_t i = 0; i < counts[m]; i++)
				assert_int_equal(r->read_blocks->crc32c[i],
				                 kvp_crc32c(0, payload + i * 240, 240));
			/* protobuf-c packs the decoded reply into exactly the bytes we sent. */
			size_t n = kvpool__v1__reply__get_packed_size(r);
			uint8_t *again = malloc(n);
			assert_int_equal(kvpool__v1__reply__pack(r, again), len);
			assert_memory_equal(again, b, len);
			free(again);
			kvpool__v1__reply__free_unpacked(r, NULL);
			free(b);
		}
}

/* The executor's configuration: per-pool settings over global ones, and sizing. */
static uint64_t rng = 88172645463325252ull;

static uint64_t
next_rand(void)
{
	return kvp_test_rand(&rng);
}

/* A value of every varint width, zero and negative (int32 fields) included. */
static uint64_t
rand_wide(void)
{
	return kvp_test_rand_wide(&rng);
}

static void *
sink_malloc(void *ctx, size_t len)
{
	uint8_t **buf = ctx;
	free(*buf);
	*buf = malloc(len ? len : 1);
	return *buf;
}

/* Batch replies are written by hand (service/rpc/reply_pack.c): protobuf-c's bytes, exactly. */
static void
batch_reply_is_protobuf_c_bytes(void **state)
{
	enum { MAXSUB = 40, MAXIDS = 70 };
	static const char *details[] = {NULL, "", "no space", "a longer detail, well past one byte of "
	                                                      "length and then some more text to cross 127 "
	                                                      "bytes of length so the varint takes two"};
	(void)state;
	for (int iter = 0; iter < 1500; iter++) {
		Kvpool__V1__Reply top = KVPOOL__V1__REPLY__INIT, sub[MAXSUB], *subp[MAXSUB];
		Kvpool__V1__BatchReply batch = KVPOOL__V1__BATCH_REPLY__INIT;
		Kvpool__V1__AllocateSlotsReply as[MAXSUB];
		Kvpool__V1__GetComputedBlocksReply gc[MAXSUB];
		Kvpool__V1__FreeRequestReply fr = KVPOOL__V1__FREE_REQUEST_REPLY__INIT;
		Kvpool__V1__StatsReply st[MAXSUB];
		Kvpool__V1__AllocateReply al[MAXSUB];
		Kvpool__V1__TouchReply tc = KVPOOL__V1__TOUCH_REPLY__INIT;
		Kvpool__V1__FreeReply fe = KVPOOL__V1__FREE_REPLY__INIT;
		Kvpool__V1__CacheReply ca[MAXSUB];
		Kvpool__V1__EvictReply ev[MAXSUB];
		Kvpool__V1__LookupReply lk[MAXSUB];
		Kvpool__V1__SlotsRunReply ru[MAXSUB];
		Kvpool__V1__Status sts[MAXSUB][4];
		uint8_t hashes[MAXSUB][3 * 32];
		int32_t ids[MAXSUB][MAXIDS];
		uint32_t per[MAXSUB][4];
		size_t n = next_rand() % MAXSUB;

		top.call_id = rand_wide();
		top.status = (Kvpool__V1__Status)(next_rand() % 3 == 0 ? next_rand() % 14 : 0);
		top.detail = (char *)details[next_rand() % 4];
		top.result_case = KVPOOL__V1__REPLY__RESULT_BATCH;
		top.batch = &batch;
		batch.replies = subp;
		batch.n_replies = n;
		for (size_t i = 0; i < n; i++) {
			Kvpool__V1__Reply *r = &sub[i];
			kvpool__v1__reply__init(r);
			subp[i] = r;
			r->status = (Kvpool__V1__Status)(next_rand() % 4 == 0 ? next_rand() % 14 : 0);
			r->detail = (char *)details[next_rand() % 4];
			size_t nid = next_rand() % MAXIDS;
			for (size_t k = 0; k < nid; k++)
				ids[i][k] = (int32_t)(next_rand() % 7 == 0 ? -(int64_t)(next_rand() % 5) - 1
				                                           : (int64_t)(rand_wide() % 2147483647u));
			for (size_t k = 0; k < 4; k++)
				per[i][k] = (uint32_t)rand_wide();
			switch (next_rand() % 13) {
			case 0:
				break; /* a failed call: status and detail only */
			case 1:
			case 2:
				kvpool__v1__allocate_slots_reply__init(&as[i]);
				as[i].hit_tokens = (uint32_t)rand_wide();
				as[i].new_block_ids = ids[i];
				as[i].n_new_block_ids = nid;
				as[i].new_blocks_per_group = per[i];
				as[i].n_new_blocks_per_group = next_rand() % 5;
				as[i].num_scheduled_tokens = (uint32_t)rand_wide();
				as[i].num_computed_tokens = (uint32_t)rand_wide();
				as[i].external_blocks_per_group = per[i];
				as[i].n_external_blocks_per_group = next_rand() % 5;
				r->result_case = KVPOOL__V1__REPLY__RESULT_ALLOCATE_SLOTS;
				r->allocate_slots = &as[i];
				break;
			case 3:
				r->result_case = KVPOOL__V1__REPLY__RESULT_FREE_REQUEST;
				r->free_request = &fr;
				break;
			case 4:
				kvpool__v1__get_computed_blocks_reply__init(&gc[i]);
				gc[i].hit_tokens = (uint32_t)rand_wide();
				gc[i].block_ids = ids[i];
				gc[i].n_block_ids = nid;
				r->result_case = KVPOOL__V1__REPLY__RESULT_GET_COMPUTED_BLOCKS;
				r->get_computed_blocks = &gc[i];
				break;
			case 5:
				kvpool__v1__allocate_reply__init(&al[i]);
				al[i].block_ids = ids[i];
				al[i].n_block_ids = nid;
				r->result_case = KVPOOL__V1__REPLY__RESULT_ALLOCATE;
				r->allocate = &al[i];
				break;
			case 6:
				r->result_case = KVPOOL__V1__REPLY__RESULT_TOUCH;
				r->touch = &tc;
				break;
			case 7:
				r->result_case = KVPOOL__V1__REPLY__RESULT_FREE;
				r->free = &fe;
				break;
			case 8:
				kvpool__v1__cache_reply__init(&ca[i]);
				ca[i].num_stored = (uint32_t)rand_wide();
				r->result_case = KVPOOL__V1__REPLY__RESULT_CACHE;
				r->cache = &ca[i];
				break;
			case 9:
				kvpool__v1__evict_reply__init(&ev[i]);
				ev[i].num_evicted = (uint32_t)rand_wide();
				r->result_case = KVPOOL__V1__REPLY__RESULT_EVICT;
				r->evict = &ev[i];
				break;
			case 10:
				kvpool__v1__lookup_reply__init(&lk[i]);
				lk[i].num_hit_blocks = (uint32_t)rand_wide();
				lk[i].block_ids = ids[i];
				lk[i].n_block_ids = nid;
				lk[i].hit_tokens = (uint32_t)rand_wide();
				for (size_t k = 0; k < sizeof(hashes[i]); k++)
					hashes[i][k] = (uint8_t)next_rand();
				lk[i].block_hashes.data = hashes[i];
				lk[i].block_hashes.len = next_rand() % 2 ? 32 * (next_rand() % 4) : 0;
				lk[i].ref_cnts = per[i];
				lk[i].n_ref_cnts = next_rand() % 5;
				r->result_case = KVPOOL__V1__REPLY__RESULT_LOOKUP;
				r->lookup = &lk[i];
				break;
			case 11: {
				kvpool__v1__slots_run_reply__init(&ru[i]);
				size_t calls = next_rand() % 5;
				for (size_t k = 0; k < 4; k++)
					sts[i][k] = (Kvpool__V1__Status)(next_rand() % 3 ? 0 : next_rand() % 14);
				ru[i].statuses = sts[i];
				ru[i].n_statuses = calls;
				ru[i].num_scheduled_tokens = per[i];
				ru[i].n_num_scheduled_tokens = calls;
				ru[i].num_computed_tokens = per[i];
				ru[i].n_num_computed_tokens = next_rand() % 5;
				ru[i].num_groups = (uint32_t)(next_rand() % 3);
				ru[i].new_blocks_per_group = per[i];
				ru[i].n_new_blocks_per_group = next_rand() % 5;
				ru[i].new_block_ids = ids[i];
				ru[i].n_new_block_ids = nid;
				ru[i].details = (char **)details + 1; /* no NULL among them */
				ru[i].n_details = next_rand() % 4;
				r->result_case = KVPOOL__V1__REPLY__RESULT_SLOTS_RUN;
				r->slots_run = &ru[i];
				break;
			}
			default: /* a kind protobuf-c packs in place */
				kvpool__v1__stats_reply__init(&st[i]);
				st[i].num_free = (uint32_t)rand_wide();
				st[i].usage = 0.25;
				st[i].prefix_hits = rand_wide();
				r->result_case = KVPOOL__V1__REPLY__RESULT_STATS;
				r->stats = &st[i];
			}
		}
		/* Now and then more sub-replies than the packer keeps lengths for. */
		Kvpool__V1__Reply *many[700];
		if (iter % 50 == 0 && n > 0) {
			for (size_t i = 0; i < N_ELEMS(many); i++)
				many[i] = subp[i % n];
			batch.replies = many;
			batch.n_replies = N_ELEMS(many);
		}
		uint8_t *mine = NULL;
		struct kvpd_sink sink = {.alloc = sink_malloc, .ctx = &mine};
		assert_ok(kvpd_pack_reply(&top, &sink));
		size_t want_len = kvpool__v1__reply__get_packed_size(&top);
		uint8_t *want = malloc(want_len);
		assert_int_equal(kvpool__v1__reply__pack(&top, want), want_len);
		if (sink.len != want_len || memcmp(sink.buf, want, want_len) != 0)
			fail_msg("iteration %d: %zu bytes by hand, protobuf-c %zu", iter, sink.len, want_len);
		free(want);
		free(mine);
	}
}

static void
executor_settings(void **state)
{
	(void)state;
	struct kvpd_config c;
	FILE *devnull = fopen("/dev/null", "w");
	char *ok[] = {"kvpoold", "--kv-memory", "64M", "--kv-layers", "4",
	              "--pool", "name=a,memory=1G,heads=8,head_size=128",
	              "--pool", "name=b,blocks=10,executor=none",
	              "--pool", "name=c", NULL};
	assert_int_equal(kvpd_config_load(&c, 11, ok, NULL, devnull, devnull), 0);
	assert_int_equal(c.pools[0].num_blocks, 0); /* sized from its memory when created */
	assert_string_equal(c.pools[0].exec.memory, "1G");
	assert_int_equal(c.pools[0].exec.layers, 4);
	assert_int_equal(c.pools[0].exec.heads, 8);
	assert_string_equal(c.pools[1].exec.backend, "none");
	assert_string_equal(c.pools[2].exec.memory, "64M");
	assert_int_equal(c.pools[2].exec.head_size, 64);
	struct kvpd_server *s;
	char err[512];
	assert_ok(kvpd_server_create(&c, &s, err, sizeof(err)));
	/* 1 GiB / (16 x 8 x 128 x 2 x 2 per layer) / 4 layers = 4096 blocks, as vLLM sizes it. */
	assert_non_null(strstr(kvpd_server_pool_note(s, 0), "4096 blocks"));
	assert_non_null(strstr(kvpd_server_pool_note(s, 1), "no executor"));
	/* 64 MiB / (16 x 2 x 64 x 2 x 2) / 4 = 2048. */
	assert_non_null(strstr(kvpd_server_pool_note(s, 2), "2048 blocks"));
	kvpd_server_destroy(s);

	char *bad1[] = {"kvpoold", "--pool", "name=x,executor=gpu,blocks=4", NULL};
	assert_int_equal(kvpd_config_load(&c, 3, bad1, NULL, devnull, devnull), -1);
	char *bad2[] = {"kvpoold", "--pool", "name=x", NULL}; /* no blocks, no budget */
	assert_int_equal(kvpd_config_load(&c, 3, bad2, NULL, devnull, devnull), -1);
	char *bad3[] = {"kvpoold", "--kv-memory", "12Q", NULL};
	assert_int_equal(kvpd_config_load(&c, 3, bad3, NULL, devnull, devnull), -1);
	char *bad4[] = {"kvpoold", "--kv-dtype", "fp8", NULL};
	assert_int_equal(kvpd_config_load(&c, 3, bad4, NULL, devnull, devnull), -1);
	/* A budget too small for one usable block fails at creation, with the reason. */
	char *tiny[] = {"kvpoold", "--pool", "name=t,memory=1K", NULL};
	assert_int_equal(kvpd_config_load(&c, 3, tiny, NULL, devnull, devnull), 0);
	assert_status(kvpd_server_create(&c, &s, err, sizeof(err)), KVP_EINVAL);
	assert_non_null(strstr(err, "holds no usable block"));
	fclose(devnull);

	uint64_t bytes;
	double frac;
	assert_int_equal(kvpd_parse_memory("2G", &bytes, &frac), 0);
	assert_int_equal(bytes, 2ull << 30);
	assert_int_equal(kvpd_parse_memory("512MiB", &bytes, &frac), 0);
	assert_int_equal(bytes, 512ull << 20);
	assert_int_equal(kvpd_parse_memory("0.9", &bytes, &frac), 0);
	assert_true(frac > 0.89 && frac < 0.91);
	assert_int_equal(kvpd_parse_memory("1.5", &bytes, &frac), -1);
	assert_int_equal(kvpd_parse_memory("-3", &bytes, &frac), -1);
	assert_int_equal(kvpd_parse_memory("0", &bytes, &frac), -1);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(read_reply_is_protobuf_c_bytes),
		cmocka_unit_test(batch_reply_is_protobuf_c_bytes),
		cmocka_unit_test(executor_settings),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
