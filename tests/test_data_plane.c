/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The data plane through a real kvpoold over ipc and tcp (cpu executor, or
 * the one KVP_TEST_EXECUTOR names, e.g. cuda on a machine with a GPU):
 * a prefill client writes a prompt's KV and caches its blocks, a decode
 * client looks the prefix up, touches it and reads identical bytes with
 * valid checksums; copy-on-write; WriteTokens against a local executor as
 * the reference; transfers split below a small message limit; and every
 * refusal (ownership, state, sizes, checksums, ranges, no executor).
 */
#include "daemon_util.h"

#include "kvp_test.h"

#include "gpu/executor.h"
#include "clients/c/kvpool.h"
#include "kvpool.pb-c.h"

/* 2 layers x K,V x 16 tokens x 4 heads x 32 x fp16 = 16 KiB a block; 64 KiB messages carry 3. */
#define BS 16
#define BLOCK_BYTES (2u * 2 * BS * 4 * 32 * 2)

static char ipc_url[128], tcp_url[128], admin[64];
static const char *executor = "cpu";
static pid_t daemon_pid;

static int
setup(void **state)
{
	(void)state;
	daemon_urls(ipc_url, sizeof(ipc_url), tcp_url, sizeof(tcp_url));
	snprintf(admin, sizeof(admin), "http://127.0.0.1:%d", daemon_admin_port());
	char ev[128], pool[96];
	const char *env = getenv("KVP_TEST_EXECUTOR");
	if (env != NULL && *env != '\0')
		executor = env;
	snprintf(ev, sizeof(ev), "ipc:///tmp/kvpool-dptest-pub-%d.ipc", (int)getpid());
	snprintf(pool, sizeof(pool), "name=kv,blocks=64,block_size=16,seed=1,executor=%s", executor);
	const char *args[] = {"--rpc", ipc_url, "--rpc", tcp_url, "--events", ev, "--admin", admin,
	                      "--max-msg-bytes", "65536", "--kv-layers", "2", "--kv-heads", "4",
	                      "--kv-head-size", "32",
	                      "--pool", pool,
	                      "--pool", "name=bare,blocks=8,executor=none", NULL};
	daemon_pid = daemon_start(args);
	return daemon_pid > 0 ? 0 : -1;
}

static int
teardown(void **state)
{
	(void)state;
	/* Exit 0 only if the pool's invariants held at shutdown. */
	return daemon_stop(daemon_pid) == 0 ? 0 : -1;
}

static struct kvp_client *
client(const char *url, const char *pool)
{
	struct kvp_client_options o = {.url = url, .pool = pool, .timeout_ms = 5000, .retries = 2};
	struct kvp_client *c = NULL;
	int rv = KVP_EBUSY;
	for (int i = 0; i < 100 && rv != KVP_OK; i++)
		if ((rv = kvp_client_open(&o, &c)) != KVP_OK)
			sleep_ms(50);
	assert_ok(rv);
	return c;
}

static uint64_t rng = 0x1234;

static void
fill(void *p, size_t n)
{
	unsigned char *b = p;
	for (size_t i = 0; i < n; i++) {
		rng = rng * 6364136223846793005ull + 1442695040888963407ull;
		b[i] = (unsigned char)(rng >> 56);
	}
}

/* Sends one data request as raw bytes (what a client library would not send). */
static int
raw(struct kvp_client *c, Kvpool__V1__Request *rq)
{
	uint8_t *req, *rep = NULL;
	size_t len, rlen = 0;
	int st;

	rq->call_id = 900000 + (uint64_t)(rng & 0xffff);
	rq->pool = (char *)kvp_client_info(c)->pool;
	rq->session_id = kvp_client_info(c)->session_id;
	len = kvpool__v1__request__get_packed_size(rq);
	req = malloc(len);
	kvpool__v1__request__pack(rq, req);
	assert_ok(kvp_client_raw(c, req, len, &rep, &rlen));
	Kvpool__V1__Reply *r = kvpool__v1__reply__unpack(NULL, rlen, rep);
	assert_non_null(r);
	st = (int)r->status;
	kvpool__v1__reply__free_unpacked(r, NULL);
	free(req);
	free(rep);
	rng++;
	return st;
}

static void
hello_reports_the_executor(void **state)
{
	(void)state;
	struct kvp_client *c = client(ipc_url, "kv");
	const struct kvp_client_info *i = kvp_client_info(c);
	assert_string_equal(i->executor.backend, executor);
	assert_string_equal(i->medium, strcmp(executor, "cuda") == 0 ? "GPU" : "CPU");
	assert_int_equal(i->executor.num_layers, 2);
	assert_int_equal(i->executor.num_heads, 4);
	assert_int_equal(i->executor.head_size, 32);
	assert_int_equal(i->executor.block_size, BS);
	assert_string_equal(i->executor.dtype, "fp16");
	assert_string_equal(i->executor.layout, "nhd");
	assert_int_equal(i->executor.block_bytes, BLOCK_BYTES);
	assert_int_equal(i->executor.memory_bytes, 64ull * BLOCK_BYTES);
	assert_int_equal(i->max_msg_bytes, 65536);
	kvp_client_close(c);

	/* A pool without an executor: no layout, data calls refused. */
	c = client(ipc_url, "bare");
	assert_string_equal(kvp_client_info(c)->executor.backend, "");
	int32_t id;
	unsigned char b[16];
	assert_ok(kvp_client_allocate(c, 1, &id));
	assert_status(kvp_client_read_blocks(c, &id, 1, b, sizeof(b), NULL), KVP_ENOTSUP);
	/* The daemon says the same to a client that sends anyway. */
	Kvpool__V1__ReadBlocksRequest rd = KVPOOL__V1__READ_BLOCKS_REQUEST__INIT;
	Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_READ_BLOCKS;
	rq.read_blocks = &rd;
	rd.block_ids = &id;
	rd.n_block_ids = 1;
	assert_int_equal(raw(c, &rq), KVPOOL__V1__STATUS__STATUS_NOT_SUPPORTED);
	kvp_client_close(c);
}

/* Prefill writes and caches; decode (another client, over tcp) finds, touches and reads. */
static void
prefill_then_decode(void **state)
{
	(void)state;
	enum { NB = 10, NT = NB * BS + 3 }; /* 10 full blocks and 3 tokens more */
	struct kvp_client *pre = client(ipc_url, "kv"), *dec = client(tcp_url, "kv");
	int32_t ids[NB + 1], hit[NB + 1];
	int64_t tokens[NT];
	unsigned char *kv = malloc((NB + 1) * BLOCK_BYTES), *back = malloc(NB * BLOCK_BYTES);
	uint32_t crcs[NB], stored, nhit, hit_tokens;

	for (int i = 0; i < NT; i++)
		tokens[i] = 1000 + i;
	assert_ok(kvp_client_allocate(pre, NB + 1, ids));
	fill(kv, (NB + 1) * BLOCK_BYTES);
	/* 11 blocks of 16 KiB: four calls under the 64 KiB limit. */
	assert_ok(kvp_client_write_blocks(pre, ids, NB + 1, kv, (NB + 1) * BLOCK_BYTES));
	struct kvp_client_cache ca = {.block_ids = ids, .num_block_ids = NB + 1,
	                              .num_full_blocks = NB, .tokens = tokens, .num_tokens = NT};
	assert_ok(kvp_client_cache(pre, &ca, &stored));
	assert_int_equal(stored, NB);
	assert_ok(kvp_client_free(pre, ids, NB + 1));

	/* Decode: lookup by tokens, touch, read. */
	struct kvp_client_lookup q = {.tokens = tokens, .num_tokens = NT};
	assert_ok(kvp_client_lookup(dec, &q, hit, NB + 1, &nhit, &hit_tokens));
	assert_int_equal(nhit, NB);
	assert_int_equal(hit_tokens, NB * BS);
	kvp_test_ids_equal(hit, nhit, ids, NB, "hit", __FILE__, __LINE__);
	assert_ok(kvp_client_touch(dec, hit, nhit));
	assert_ok(kvp_client_read_blocks(dec, hit, nhit, back, nhit * BLOCK_BYTES, crcs));
	assert_memory_equal(back, kv, NB * BLOCK_BYTES);
	for (int i = 0; i < NB; i++)
		assert_int_equal(crcs[i], kvp_crc32c(0, kv + (size_t)i * BLOCK_BYTES, BLOCK_BYTES));
	/* Reading needs a reference: the prefill client, which freed its blocks, may not read
	 * them (they could be reused under it) until it takes one again. */
	assert_status(kvp_client_read_blocks(pre, hit, 1, back, BLOCK_BYTES, NULL), KVP_ENOTOWNER);
	assert_ok(kvp_client_touch(pre, hit, 1));
	assert_ok(kvp_client_read_blocks(pre, hit, 1, back, BLOCK_BYTES, NULL));
	assert_memory_equal(back, kv, BLOCK_BYTES);
	assert_ok(kvp_client_free(pre, hit, 1));
	assert_ok(kvp_client_free(dec, hit, nhit));

	/* The metrics count the bytes. */
	char body[65536];
	assert_int_equal(http_get(daemon_admin_port(), "/metrics", body, sizeof(body)), 200);
	assert_non_null(strstr(body, "kvpool_block_bytes_read_total{pool=\"kv\"}"));
	assert_non_null(strstr(body, "read_blocks"));
	free(kv);
	free(back);
	kvp_client_close(pre);
	kvp_client_close(dec);
}

static void
copy_on_write(void **state)
{
	(void)state;
	struct kvp_client *c = client(ipc_url, "kv");
	int32_t ids[2], copy[2];
	int64_t tokens[2 * BS];
	unsigned char *a = malloc(2 * BLOCK_BYTES), *b = malloc(2 * BLOCK_BYTES);
	uint32_t stored;

	for (int i = 0; i < 2 * BS; i++)
		tokens[i] = 77000 + i;
	assert_ok(kvp_client_allocate(c, 2, ids));
	fill(a, 2 * BLOCK_BYTES);
	assert_ok(kvp_client_write_blocks(c, ids, 2, a, 2 * BLOCK_BYTES));
	struct kvp_client_cache ca = {.block_ids = ids, .num_block_ids = 2, .num_full_blocks = 2,
	                              .tokens = tokens, .num_tokens = 2 * BS};
	assert_ok(kvp_client_cache(c, &ca, &stored));

	/* The cached blocks are shared: whole-block writes are refused, nothing changes. */
	fill(b, 2 * BLOCK_BYTES);
	assert_status(kvp_client_write_blocks(c, ids, 2, b, 2 * BLOCK_BYTES), KVP_ESTATE);
	assert_non_null(strstr(kvp_client_last_detail(c), "cached"));
	/* Copy, then write the copy. */
	assert_ok(kvp_client_allocate(c, 2, copy));
	assert_ok(kvp_client_copy_blocks(c, ids, copy, 2));
	assert_ok(kvp_client_read_blocks(c, copy, 2, b, 2 * BLOCK_BYTES, NULL));
	assert_memory_equal(a, b, 2 * BLOCK_BYTES);
	fill(b, BLOCK_BYTES);
	assert_ok(kvp_client_write_blocks(c, copy, 1, b, BLOCK_BYTES));
	unsigned char *check = malloc(2 * BLOCK_BYTES);
	assert_ok(kvp_client_read_blocks(c, ids, 2, check, 2 * BLOCK_BYTES, NULL));
	assert_memory_equal(check, a, 2 * BLOCK_BYTES); /* the originals are untouched */
	/* A copy onto a cached block, or onto a block both source and destination, is refused. */
	assert_status(kvp_client_copy_blocks(c, copy, ids, 1), KVP_ESTATE);
	int32_t src2[2] = {copy[0], copy[1]}, dst2[2] = {copy[1], copy[0]};
	assert_status(kvp_client_copy_blocks(c, src2, dst2, 2), KVP_EINVAL);
	/* Another session that Touches an uncached block it does not own may not write it. */
	struct kvp_client *other = client(ipc_url, "kv");
	assert_ok(kvp_client_touch(other, copy, 1));
	assert_status(kvp_client_write_blocks(other, copy, 1, b, BLOCK_BYTES), KVP_ENOTOWNER);
	assert_non_null(strstr(kvp_client_last_detail(other), "sole holder"));
	assert_status(kvp_client_write_blocks(c, copy, 1, b, BLOCK_BYTES), KVP_ENOTOWNER);
	assert_ok(kvp_client_free(other, copy, 1));
	assert_ok(kvp_client_write_blocks(c, copy, 1, b, BLOCK_BYTES)); /* sole holder again */
	kvp_client_close(other);
	assert_ok(kvp_client_free(c, copy, 2));
	assert_ok(kvp_client_free(c, ids, 2));
	free(a);
	free(b);
	free(check);
	kvp_client_close(c);
}

/* WriteTokens through the daemon equals WriteTokens on a local cpu executor. */
static void
write_tokens_matches_local_executor(void **state)
{
	(void)state;
	struct kvp_client *c = client(tcp_url, "kv");
	struct kvp_exec_config cfg = {.backend = KVP_EXEC_CPU,
	                              .shape = {64, BS, 2, 4, 32, KVP_DTYPE_FP16, KVP_LAYOUT_NHD}};
	struct kvp_exec *ref;
	int32_t ids[4];
	enum { NT = 50 };
	size_t tok = 4 * 32 * 2;
	int64_t slots[NT];
	unsigned char *k = malloc(2 * NT * tok), *v = malloc(2 * NT * tok);
	unsigned char *got = malloc(4 * BLOCK_BYTES), *want = malloc(4 * BLOCK_BYTES);

	assert_ok(kvp_exec_open(&cfg, &ref, NULL, 0));
	assert_ok(kvp_client_allocate(c, 4, ids));
	/* Start both from the same bytes. */
	fill(want, 4 * BLOCK_BYTES);
	assert_ok(kvp_client_write_blocks(c, ids, 4, want, 4 * BLOCK_BYTES));
	assert_ok(kvp_exec_write_blocks(ref, ids, 4, want, 4 * BLOCK_BYTES));
	/* A request's slot mapping over its block-table row, as the scheduler computes it. */
	int64_t pos[NT];
	int32_t qsl[2] = {0, NT};
	for (int i = 0; i < NT; i++)
		pos[i] = i + 5;
	struct kvp_slot_args sa = {.block_table = ids, .row_stride = 4, .num_reqs = 1,
	                           .query_start_loc = qsl, .positions = pos, .block_size = BS};
	assert_ok(kvp_compute_slot_mapping(&sa, slots, NT));
	slots[7] = KVP_PAD_SLOT;
	fill(k, 2 * NT * tok);
	fill(v, 2 * NT * tok);
	/* All layers ([2][50][4][32] = 25.6 KiB each of K, V: split into two calls), then layer 1. */
	assert_ok(kvp_client_write_tokens(c, true, 0, slots, NT, k, v, 2 * NT * tok));
	assert_ok(kvp_exec_write_tokens(ref, true, 0, slots, NT, k, v, 2 * NT * tok));
	assert_ok(kvp_client_write_tokens(c, false, 1, slots + 10, 20, v, k, 20 * tok));
	assert_ok(kvp_exec_write_tokens(ref, false, 1, slots + 10, 20, v, k, 20 * tok));
	assert_ok(kvp_client_read_blocks(c, ids, 4, got, 4 * BLOCK_BYTES, NULL));
	assert_ok(kvp_exec_read_blocks(ref, ids, 4, want, 4 * BLOCK_BYTES));
	assert_memory_equal(got, want, 4 * BLOCK_BYTES);

	/* A slot in a block this session does not hold; a slot past the pool; a repeated slot. */
	int64_t bad[1] = {0};
	assert_status(kvp_client_write_tokens(c, false, 0, bad, 1, k, v, tok), KVP_ENOTOWNER);
	bad[0] = 64 * BS;
	assert_status(kvp_client_write_tokens(c, false, 0, bad, 1, k, v, tok), KVP_ERANGE);
	int64_t twice[2] = {slots[0], slots[0]};
	assert_status(kvp_client_write_tokens(c, false, 0, twice, 2, k, v, 2 * tok), KVP_EINVAL);
	assert_status(kvp_client_write_tokens(c, false, 2, slots, 1, k, v, tok), KVP_ERANGE);
	assert_ok(kvp_client_free(c, ids, 4));
	kvp_exec_close(ref);
	free(k);
	free(v);
	free(got);
	free(want);
	kvp_client_close(c);
}

static void
refusals(void **state)
{
	(void)state;
	struct kvp_client *c = client(ipc_url, "kv"), *other = client(ipc_url, "kv");
	int32_t ids[2], theirs;
	unsigned char *buf = malloc(5 * BLOCK_BYTES);
	uint32_t crc[2];

	assert_ok(kvp_client_allocate(c, 2, ids));
	assert_ok(kvp_client_allocate(other, 1, &theirs));
	fill(buf, 5 * BLOCK_BYTES);

	/* Writing or reading a block another session holds: its private content is not ours. */
	assert_status(kvp_client_write_blocks(c, &theirs, 1, buf, BLOCK_BYTES), KVP_ENOTOWNER);
	assert_status(kvp_client_read_blocks(c, &theirs, 1, buf, BLOCK_BYTES, NULL), KVP_ENOTOWNER);
	assert_ok(kvp_client_free(other, &theirs, 1));
	assert_status(kvp_client_read_blocks(c, &theirs, 1, buf, BLOCK_BYTES, NULL), KVP_ENOTOWNER);
	assert_status(kvp_client_read_blocks(other, ids, 1, buf, BLOCK_BYTES, NULL), KVP_ENOTOWNER);
	/* Nor through a copy: a copy's sources follow the reading rule. */
	int32_t mine;
	assert_ok(kvp_client_allocate(other, 1, &mine));
	assert_status(kvp_client_copy_blocks(other, ids, &mine, 1), KVP_ENOTOWNER);
	assert_ok(kvp_client_free(other, &mine, 1));
	/* The null block, and ids outside the pool. */
	int32_t null_id = 0, far = 64;
	assert_status(kvp_client_write_blocks(c, &null_id, 1, buf, BLOCK_BYTES), KVP_ENOTOWNER);
	assert_status(kvp_client_read_blocks(c, &far, 1, buf, BLOCK_BYTES, NULL), KVP_ERANGE);
	/* The library refuses a buffer of the wrong size before sending. */
	assert_status(kvp_client_write_blocks(c, ids, 2, buf, BLOCK_BYTES), KVP_EINVAL);

	/* On the wire: a payload that does not match the layout. */
	Kvpool__V1__WriteBlocksRequest w = KVPOOL__V1__WRITE_BLOCKS_REQUEST__INIT;
	Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_WRITE_BLOCKS;
	rq.write_blocks = &w;
	w.block_ids = ids;
	w.n_block_ids = 2;
	w.payload.data = buf;
	w.payload.len = 2 * BLOCK_BYTES - 1;
	assert_int_equal(raw(c, &rq), KVPOOL__V1__STATUS__STATUS_INVALID_ARGUMENT);
	/* A checksum that does not match: nothing of the call is written. */
	unsigned char before[BLOCK_BYTES];
	assert_ok(kvp_client_read_blocks(c, ids, 1, before, BLOCK_BYTES, NULL));
	w.payload.len = 2 * BLOCK_BYTES;
	crc[0] = kvp_crc32c(0, buf, BLOCK_BYTES);
	crc[1] = kvp_crc32c(0, buf + BLOCK_BYTES, BLOCK_BYTES) ^ 1;
	w.crc32c = crc;
	w.n_crc32c = 2;
	assert_int_equal(raw(c, &rq), KVPOOL__V1__STATUS__STATUS_INVALID_ARGUMENT);
	unsigned char after[BLOCK_BYTES];
	assert_ok(kvp_client_read_blocks(c, ids, 1, after, BLOCK_BYTES, NULL));
	assert_memory_equal(before, after, BLOCK_BYTES);
	/* The same id twice. */
	int32_t same[2] = {ids[0], ids[0]};
	w.block_ids = same;
	w.n_crc32c = 0;
	assert_int_equal(raw(c, &rq), KVPOOL__V1__STATUS__STATUS_INVALID_ARGUMENT);
	/* A request larger than the daemon's limit (5 blocks = 80 KiB > 64 KiB). */
	int32_t five[5] = {ids[0], ids[1], ids[0], ids[1], ids[0]};
	w.block_ids = five;
	w.n_block_ids = 5;
	w.payload.len = 5 * BLOCK_BYTES;
	assert_int_equal(raw(c, &rq), KVPOOL__V1__STATUS__STATUS_MESSAGE_TOO_LARGE);
	/* A read whose reply would pass the limit. */
	Kvpool__V1__ReadBlocksRequest rd = KVPOOL__V1__READ_BLOCKS_REQUEST__INIT;
	Kvpool__V1__Request rq2 = KVPOOL__V1__REQUEST__INIT;
	rq2.call_case = KVPOOL__V1__REQUEST__CALL_READ_BLOCKS;
	rq2.read_blocks = &rd;
	rd.block_ids = five;
	rd.n_block_ids = 5;
	assert_int_equal(raw(c, &rq2), KVPOOL__V1__STATUS__STATUS_MESSAGE_TOO_LARGE);
	/* The library splits the same read and it succeeds, repeats included. */
	assert_ok(kvp_client_read_blocks(c, five, 5, buf, 5 * BLOCK_BYTES, NULL));
	assert_memory_equal(buf + 2 * BLOCK_BYTES, buf, BLOCK_BYTES);
	/* A part that fails fails the transfer and names its range; the other part's reply,
	 * in flight at the same time, is dropped cleanly (ASan checks for leaks). */
	int32_t seven[7] = {ids[0], ids[1], ids[0], theirs, ids[0], ids[1], ids[0]};
	assert_status(kvp_client_read_blocks(c, seven, 7, buf, 5 * BLOCK_BYTES, NULL), KVP_EINVAL);
	unsigned char *big = malloc(7 * BLOCK_BYTES);
	assert_status(kvp_client_read_blocks(c, seven, 7, big, 7 * BLOCK_BYTES, NULL), KVP_ENOTOWNER);
	assert_non_null(strstr(kvp_client_last_detail(c), "part [3, 6) of 7"));
	free(big);
	/* The client still works after it. */
	assert_ok(kvp_client_read_blocks(c, five, 5, buf, 5 * BLOCK_BYTES, NULL));
	/* Copy with mismatched lists. */
	Kvpool__V1__CopyBlocksRequest cp = KVPOOL__V1__COPY_BLOCKS_REQUEST__INIT;
	Kvpool__V1__Request rq3 = KVPOOL__V1__REQUEST__INIT;
	rq3.call_case = KVPOOL__V1__REQUEST__CALL_COPY_BLOCKS;
	rq3.copy_blocks = &cp;
	cp.src_block_ids = ids;
	cp.n_src_block_ids = 2;
	cp.dst_block_ids = ids;
	cp.n_dst_block_ids = 1;
	assert_int_equal(raw(c, &rq3), KVPOOL__V1__STATUS__STATUS_INVALID_ARGUMENT);
	/* K and V of different sizes. */
	Kvpool__V1__WriteTokensRequest wt = KVPOOL__V1__WRITE_TOKENS_REQUEST__INIT;
	Kvpool__V1__Request rq4 = KVPOOL__V1__REQUEST__INIT;
	int64_t slot = (int64_t)ids[0] * BS;
	rq4.call_case = KVPOOL__V1__REQUEST__CALL_WRITE_TOKENS;
	rq4.write_tokens = &wt;
	wt.slot_mapping = &slot;
	wt.n_slot_mapping = 1;
	wt.key.data = buf;
	wt.key.len = 256;
	wt.value.data = buf;
	wt.value.len = 255;
	assert_int_equal(raw(c, &rq4), KVPOOL__V1__STATUS__STATUS_INVALID_ARGUMENT);
	wt.value.len = 256;
	assert_int_equal(raw(c, &rq4), KVPOOL__V1__STATUS__STATUS_OK);
	wt.key.len = wt.value.len = 100;
	assert_int_equal(raw(c, &rq4), KVPOOL__V1__STATUS__STATUS_INVALID_ARGUMENT);

	assert_ok(kvp_client_free(c, ids, 2));
	free(buf);
	kvp_client_close(c);
	kvp_client_close(other);
}

/* kvpoolctl write --in / read --out round-trips a file through a kept session. */
static void
kvpoolctl_read_write(void **state)
{
	(void)state;
	char cmd[1024], sid[64], in[128], out[128];
	unsigned char *a = malloc(2 * BLOCK_BYTES), *b = malloc(2 * BLOCK_BYTES);
	FILE *f;

	snprintf(in, sizeof(in), "/tmp/kvpool-dptest-in-%d.bin", (int)getpid());
	snprintf(out, sizeof(out), "/tmp/kvpool-dptest-out-%d.bin", (int)getpid());
	fill(a, 2 * BLOCK_BYTES);
	assert_non_null(f = fopen(in, "wb"));
	assert_int_equal(fwrite(a, 1, 2 * BLOCK_BYTES, f), 2 * BLOCK_BYTES);
	fclose(f);
	snprintf(cmd, sizeof(cmd), "%s --url %s --pool kv session", KVPOOLCTL_PATH, ipc_url);
	assert_non_null(f = popen(cmd, "r"));
	assert_non_null(fgets(sid, sizeof(sid), f));
	assert_int_equal(pclose(f), 0);
	sid[strcspn(sid, "\n")] = '\0';
	/* A resumed session knows the pool's layout (a Heartbeat brought it). */
	struct kvp_client_options o = {.url = ipc_url, .pool = "kv", .session_id = strtoull(sid, 0, 10)};
	struct kvp_client *c;
	assert_ok(kvp_client_open(&o, &c));
	assert_int_equal(kvp_client_info(c)->executor.block_bytes, BLOCK_BYTES);
	kvp_client_detach(c);
	/* Two blocks for the session; `alloc` prints their ids. */
	snprintf(cmd, sizeof(cmd), "%s --url %s --pool kv --session %s alloc 2 2>/dev/null",
	         KVPOOLCTL_PATH, ipc_url, sid);
	char ids[64] = "";
	assert_non_null(f = popen(cmd, "r"));
	assert_non_null(fgets(ids, sizeof(ids), f));
	assert_int_equal(pclose(f), 0);
	ids[strcspn(ids, "\n")] = '\0';
	for (char *p = ids; *p; p++)
		if (*p == ' ')
			*p = ',';
	snprintf(cmd, sizeof(cmd), "%s --url %s --pool kv --session %s write --blocks %s --in %s",
	         KVPOOLCTL_PATH, ipc_url, sid, ids, in);
	assert_int_equal(system(cmd), 0);
	snprintf(cmd, sizeof(cmd), "%s --url %s --pool kv --session %s read --blocks %s --out %s",
	         KVPOOLCTL_PATH, ipc_url, sid, ids, out);
	assert_int_equal(system(cmd), 0);
	assert_non_null(f = fopen(out, "rb"));
	assert_int_equal(fread(b, 1, 2 * BLOCK_BYTES, f), 2 * BLOCK_BYTES);
	fclose(f);
	assert_memory_equal(a, b, 2 * BLOCK_BYTES);
	/* Without the session, a fresh one reads the same blocks under a reference it takes
	 * for the read (the daemon serves only held blocks), and leaves nothing held. */
	snprintf(cmd, sizeof(cmd), "%s --url %s --pool kv read --blocks %s,%s --out %s",
	         KVPOOLCTL_PATH, ipc_url, ids, ids, out);
	assert_int_equal(system(cmd), 0);
	assert_non_null(f = fopen(out, "rb"));
	unsigned char *b2 = malloc(4 * BLOCK_BYTES);
	assert_int_equal(fread(b2, 1, 4 * BLOCK_BYTES, f), 4 * BLOCK_BYTES);
	fclose(f);
	assert_memory_equal(b2, a, 2 * BLOCK_BYTES);
	assert_memory_equal(b2 + 2 * BLOCK_BYTES, a, 2 * BLOCK_BYTES);
	free(b2);
	/* A file of the wrong size is refused before anything is sent. */
	snprintf(cmd, sizeof(cmd),
	         "%s --url %s --pool kv --session %s write --blocks %s --in %s 2>/dev/null",
	         KVPOOLCTL_PATH, ipc_url, sid, strchr(ids, ',') + 1, in);
	assert_int_not_equal(system(cmd), 0);
	snprintf(cmd, sizeof(cmd), "%s --url %s --pool kv --session %s end >/dev/null",
	         KVPOOLCTL_PATH, ipc_url, sid);
	assert_int_equal(system(cmd), 0);
	unlink(in);
	unlink(out);
	free(a);
	free(b);
}

/* A KV connector writes the blocks its requests got from AllocateSlots
 * (request-level references, not Allocate's): the session may write them
 * while the request holds them, and nobody else may. */
static void
request_blocks_are_writable(void **state)
{
	(void)state;
	struct kvp_client *c = client(ipc_url, "kv"), *other = client(ipc_url, "kv");
	int64_t prompt[20];
	int32_t ids[8];
	size_t tok = 4 * 32 * 2;
	unsigned char *buf = malloc(BLOCK_BYTES), *got = malloc(BLOCK_BYTES), *kv = malloc(2 * tok);
	struct kvp_client_slots_result res;

	for (int i = 0; i < 20; i++)
		prompt[i] = 777000 + i;
	struct kvp_client_slots a = {.request_id = 5, .prompt = prompt, .num_prompt = 20};
	assert_ok(kvp_client_allocate_slots(c, &a, ids, 8, &res));
	assert_int_equal(res.num_new_blocks, 2); /* ids[0] full (cached), ids[1] partial */
	fill(buf, BLOCK_BYTES);
	assert_ok(kvp_client_write_blocks(c, &ids[1], 1, buf, BLOCK_BYTES));
	assert_ok(kvp_client_read_blocks(c, &ids[1], 1, got, BLOCK_BYTES, NULL));
	assert_memory_equal(got, buf, BLOCK_BYTES);
	/* The cached block: shared content, so WriteBlocks refuses, and WriteTokens (vLLM's
	 * recomputed last token of a hit) is taken but leaves it as it is, for everyone. */
	assert_status(kvp_client_write_blocks(c, &ids[0], 1, buf, BLOCK_BYTES), KVP_ESTATE);
	int64_t slot = (int64_t)ids[0] * BS + 3;
	unsigned char *before = malloc(BLOCK_BYTES), *after = malloc(BLOCK_BYTES);
	assert_ok(kvp_client_read_blocks(c, &ids[0], 1, before, BLOCK_BYTES, NULL));
	fill(kv, 2 * tok);
	assert_ok(kvp_client_write_tokens(c, false, 0, &slot, 1, kv, kv + tok, tok));
	assert_ok(kvp_client_read_blocks(c, &ids[0], 1, after, BLOCK_BYTES, NULL));
	assert_memory_equal(before, after, BLOCK_BYTES);
	/* ...also for another session that Touched it. */
	assert_ok(kvp_client_touch(other, &ids[0], 1));
	assert_ok(kvp_client_write_tokens(other, false, 0, &slot, 1, kv, kv + tok, tok));
	assert_ok(kvp_client_read_blocks(other, &ids[0], 1, after, BLOCK_BYTES, NULL));
	assert_memory_equal(before, after, BLOCK_BYTES);
	assert_ok(kvp_client_free(other, &ids[0], 1));
	free(before);
	free(after);
	/* Another session, and this one after the request is freed. */
	assert_status(kvp_client_write_blocks(other, &ids[1], 1, buf, BLOCK_BYTES), KVP_ENOTOWNER);
	assert_status(kvp_client_write_tokens(other, false, 0, &slot, 1, kv, kv + tok, tok),
	              KVP_ENOTOWNER);
	assert_ok(kvp_client_free_request(c, 5, false));
	assert_status(kvp_client_write_blocks(c, &ids[1], 1, buf, BLOCK_BYTES), KVP_ENOTOWNER);
	free(buf);
	free(got);
	free(kv);
	kvp_client_close(other);
	kvp_client_close(c);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(hello_reports_the_executor),
		cmocka_unit_test(prefill_then_decode),
		cmocka_unit_test(copy_on_write),
		cmocka_unit_test(write_tokens_matches_local_executor),
		cmocka_unit_test(refusals),
		cmocka_unit_test(request_blocks_are_writable),
		cmocka_unit_test(kvpoolctl_read_write),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
