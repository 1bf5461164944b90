/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Hybrid pools over the wire: a real kvpoold started with gpt-oss-like,
 * Llama-4-like, Qwen3-Next-like, caching-off and coarse-block pools from
 * its configuration, driven through libkvpool on ipc://, with vLLM's exact
 * block ids, hits and event annotations (the engine-level cases are in
 * test_hybrid.c).
 */
#include "daemon_util.h"

#include <string.h>

#include "kvp_test.h"

#include "clients/c/kvpool.h"
#include "clients/c/subscriber.h"
#include "common/block_hash.h"

static char ipc_url[256], tcp_url[256], events_url[96];
static pid_t daemon_pid;

static int
setup(void **state)
{
	(void)state;
	daemon_urls(ipc_url, sizeof(ipc_url), tcp_url, sizeof(tcp_url));
	snprintf(events_url, sizeof(events_url), "ipc:///tmp/kvpool-hybrid-events-%d.ipc",
	         (int)getpid());
	const char *args[] = {
		"--rpc", ipc_url, "--admin", "none", "--events", events_url,
		/* vLLM's test_prefill_hybrid_model: 1 full + 2 sliding-window groups. */
		"--pool", "name=gptoss,blocks=21,seed=0,"
		          "groups=full:16+sliding_window:16:32+sliding_window:16:32",
		"--pool", "name=llama4,blocks=64,seed=0,groups=full:16+chunked_local:16:32",
		"--pool", "name=qwen3next,blocks=40,seed=0,groups=full:4+mamba:8",
		"--pool", "name=nocache,blocks=12,caching=off,groups=full:4+mamba:64",
		"--pool", "name=coarse,blocks=16,seed=0,groups=full:8,hash_block_size=4",
		"--pool", "name=pickle,blocks=16,seed=0,hash_algo=sha256",
		"--pool", "name=bulk,blocks=32,seed=0,groups=full:4+sliding_window:4:8",
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
	for (int i = 0; i < 50 && rv == KVP_EBUSY; i++)
		rv = kvp_client_open(&o, &c);
	if (rv != KVP_OK)
		fail_msg("open %s: %s", pool, kvp_status_name(rv));
	return c;
}

/* One AllocateSlots with a prompt; new blocks and their split by group. */
static void
prefill(struct kvp_client *c, uint64_t id, const int64_t *tok, size_t n, int32_t *ids,
        struct kvp_client_slots_result *res)
{
	struct kvp_client_slots a = {.request_id = id, .prompt = tok, .num_prompt = n,
	                             .use_prefix_cache = true};
	assert_ok(kvp_client_allocate_slots(c, &a, ids, 64, res));
}

static void
test_service_hybrid_hello_reports_groups(void **state)
{
	struct kvp_client *c = open_pool("gptoss");
	const struct kvp_client_info *i = kvp_client_info(c);

	(void)state;
	assert_int_equal(i->num_groups, 3);
	assert_true(i->prefix_caching);
	assert_int_equal(i->hash_block_size, 16);
	assert_int_equal(i->groups[0].kind, KVP_GROUP_FULL);
	assert_int_equal(i->groups[1].kind, KVP_GROUP_SLIDING_WINDOW);
	assert_int_equal(i->groups[2].window, 32);
	kvp_client_close(c);

	c = open_pool("nocache");
	i = kvp_client_info(c);
	assert_false(i->prefix_caching);
	assert_int_equal(i->groups[1].kind, KVP_GROUP_MAMBA);
	assert_int_equal(i->groups[1].mamba_mode, KVP_MAMBA_NONE); /* vLLM's default off */
	assert_int_equal(i->hash_block_size, 4);                  /* the GCD of 4 and 64 */
	kvp_client_close(c);

	c = open_pool("qwen3next");
	i = kvp_client_info(c);
	assert_int_equal(i->groups[1].mamba_mode, KVP_MAMBA_ALIGN);
	assert_int_equal(i->executor.block_size, 8); /* the largest group's block */
	kvp_client_close(c);
}

struct seen {
	char kinds[8][32];
	int64_t windows[8];
	size_t n;
};

static void
on_reset(void *ctx, const char *pool, uint64_t epoch, uint64_t next_seq,
         const struct kvp_snapshot_entry *e, size_t n)
{
	(void)ctx, (void)pool, (void)epoch, (void)next_seq, (void)e, (void)n;
}

static void
on_batch(void *ctx, const char *pool, uint64_t epoch, uint64_t seq, uint64_t ts,
         const struct kvp_event_batch *b)
{
	struct seen *s = ctx;
	(void)pool, (void)epoch, (void)seq, (void)ts;
	for (size_t i = 0; i < kvp_event_batch_count(b) && s->n < 8; i++) {
		struct kvp_event ev;
		if (kvp_event_batch_get(b, i, &ev) != KVP_OK || ev.type != KVP_EVENT_BLOCK_STORED)
			continue;
		snprintf(s->kinds[s->n], sizeof(s->kinds[0]), "%s", ev.spec_kind ? ev.spec_kind : "");
		s->windows[s->n++] = ev.has_sliding_window ? ev.sliding_window : -1;
	}
}

/* test_prefill_hybrid_model through the daemon, and its events' annotations. */
static void
test_service_hybrid_gptoss_ids_hits_and_events(void **state)
{
	struct seen seen = {0};
	struct kvp_sub_options so = {.events_url = events_url, .rpc_url = ipc_url, .pool = "gptoss"};
	struct kvp_sub_handler h = {.ctx = &seen, .reset = on_reset, .batch = on_batch};
	struct kvp_sub *sub = NULL;
	struct kvp_client *c = open_pool("gptoss");
	struct kvp_client_slots_result res;
	int32_t ids[64];
	int64_t all[55];
	size_t n = 0;
	uint32_t hit = 0;

	(void)state;
	assert_ok(kvp_sub_open(&so, &h, &sub));
	for (int i = 0; i < 55; i++)
		all[i] = i < 48 ? i / 16 : 3;
	prefill(c, 0, all, 55, ids, &res);
	assert_int_equal(res.hit_tokens, 0);
	assert_int_equal(res.num_groups, 3);
	assert_ids(ids, res.num_new_blocks, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12);
	assert_int_equal(res.new_blocks_per_group[1], 4);

	prefill(c, 1, all, 53, ids, &res);
	assert_int_equal(res.hit_tokens, 48);
	assert_ids(ids, res.num_new_blocks, 13, 14, 15);
	/* Preempted, the request keeps its hit: group after group, nulls included. */
	assert_ok(kvp_client_free_request(c, 1, true));
	assert_ok(kvp_client_get_computed_blocks(c, 1, ids, 64, &n, &hit));
	assert_int_equal(hit, 48);
	assert_ids(ids, n, 1, 2, 3, 0, 6, 7, 0, 10, 11);
	/*
	 * The same hit for a request the daemon does not hold (a scheduler's
	 * waiting one): the coordinator lookup over its hashes, each group's
	 * blocks at its own offset, capped at the tokens asked.
	 */
	struct kvp_hasher *hs = NULL;
	enum kvp_hash_algo algo;
	uint8_t fine[4 * KVP_HASH_LEN];
	size_t nf = 0;
	int32_t rows[3 * 8];
	uint32_t per[KVP_MAX_GROUPS], refs[3 * 8], unc = 99;
	assert_ok(kvp_hash_algo_parse(kvp_client_info(c)->hash_algorithm, &algo));
	assert_ok(kvp_hasher_create_algo("0", algo, &hs));
	assert_ok(kvp_hash_request(hs, NULL, all, 53, 16, NULL, 0, fine, 4, &nf));
	assert_ok(kvp_client_find_hit(c, fine, nf, 0, 52, rows, refs, 8, per, &hit, &unc));
	assert_int_equal(hit, 48);
	assert_int_equal(unc, 0);
	assert_int_equal(per[0], 3);
	assert_int_equal(per[1], 3);
	assert_int_equal(per[2], 3);
	assert_int_equal(per[3], 0);
	assert_ids(rows, 3, 1, 2, 3);
	assert_ids(rows + 8, 3, 0, 6, 7);
	assert_ids(rows + 16, 3, 0, 10, 11);
	assert_int_equal(refs[8], 0); /* the null block */
	assert_ok(kvp_client_find_hit(c, fine, nf, 0, 20, rows, refs, 8, per, &hit, &unc));
	assert_int_equal(hit, 16); /* capped: one block of each */
	assert_status(kvp_client_find_hit(c, fine, nf, 0, 52, rows, refs, 2, per, &hit, &unc),
	              KVP_EINVAL); /* a group's hit does not fit */
	kvp_hasher_destroy(hs);
	assert_ok(kvp_client_free_request(c, 1, false));
	assert_ok(kvp_client_free_request(c, 0, false));

	/* BlockStored events carry each group's kind and window. */
	for (int i = 0; i < 100 && seen.n < 3; i++)
		(void)kvp_sub_poll(sub, 20);
	assert_true(seen.n >= 3);
	assert_string_equal(seen.kinds[0], "full_attention");
	assert_int_equal(seen.windows[0], -1);
	assert_string_equal(seen.kinds[1], "sliding_window");
	assert_int_equal(seen.windows[1], 32);
	kvp_sub_close(sub);
	kvp_client_close(c);
}

/* Llama 4: chunked-local blocks before the current chunk come back as nulls. */
static void
test_service_hybrid_llama4_chunked_local(void **state)
{
	struct kvp_client *c = open_pool("llama4");
	struct kvp_client_slots_result res;
	int32_t ids[64];
	int64_t tok[50];
	size_t n = 0;
	uint32_t hit = 0;

	(void)state;
	for (int i = 0; i < 50; i++)
		tok[i] = 1000 + i;
	prefill(c, 1, tok, 48, ids, &res);
	assert_ids(ids, res.num_new_blocks, 1, 2, 3, 4, 5, 6);
	assert_ok(kvp_client_free_request(c, 1, false));
	prefill(c, 2, tok, 50, ids, &res);
	/* 48 tokens hit: full [1, 2, 3]; chunked local: chunk 0 done, block 3 of chunk 1. */
	assert_int_equal(res.hit_tokens, 48);
	assert_ok(kvp_client_free_request(c, 2, true));
	assert_ok(kvp_client_get_computed_blocks(c, 2, ids, 64, &n, &hit));
	assert_int_equal(hit, 48);
	assert_ids(ids, n, 1, 2, 3, 0, 0, 6);
	assert_ok(kvp_client_free_request(c, 2, false));
	kvp_client_close(c);
}

/* Qwen3-Next: full + Mamba align; the hit is where a Mamba state was cached. */
static void
test_service_hybrid_qwen3next_mamba(void **state)
{
	struct kvp_client *c = open_pool("qwen3next");
	struct kvp_client_slots_result res;
	int32_t ids[64];
	int64_t tok[40];

	(void)state;
	for (int i = 0; i < 40; i++)
		tok[i] = i;
	prefill(c, 1, tok, 24, ids, &res);
	/* full: 6 blocks; mamba: nulls up to the running state block. */
	assert_ids(ids, res.num_new_blocks, 1, 2, 3, 4, 5, 6, 0, 0, 7);
	assert_int_equal(res.new_blocks_per_group[1], 3);
	assert_ok(kvp_client_free_request(c, 1, false));
	prefill(c, 2, tok, 30, ids, &res);
	assert_int_equal(res.hit_tokens, 24);
	assert_ok(kvp_client_free_request(c, 2, false));
	kvp_client_close(c);
}

/* Caching off: no hit, vLLM's allocation order; coarse blocks: 8-token hits. */
static void
test_service_hybrid_caching_off_and_coarse_blocks(void **state)
{
	struct kvp_client *c = open_pool("nocache");
	struct kvp_client_slots_result res;
	struct kvp_client_stats st;
	int32_t ids[64];
	int64_t tok[20];

	(void)state;
	for (int i = 0; i < 20; i++)
		tok[i] = i;
	prefill(c, 1, tok, 10, ids, &res);
	assert_ids(ids, res.num_new_blocks, 1, 2, 3, 4);
	prefill(c, 2, tok, 10, ids, &res);
	assert_int_equal(res.hit_tokens, 0);
	assert_ids(ids, res.num_new_blocks, 5, 6, 7, 8);
	assert_ok(kvp_client_stats(c, &st));
	assert_int_equal(st.num_cached_blocks, 0);
	assert_ok(kvp_client_free_request(c, 1, false));
	assert_ok(kvp_client_free_request(c, 2, false));
	kvp_client_close(c);

	c = open_pool("coarse");
	prefill(c, 1, tok, 17, ids, &res);
	assert_ids(ids, res.num_new_blocks, 1, 2, 3);
	assert_ok(kvp_client_free_request(c, 1, false));
	prefill(c, 2, tok, 20, ids, &res);
	assert_int_equal(res.hit_tokens, 16);
	assert_ok(kvp_client_stats(c, &st));
	assert_int_equal(st.num_cached_keys, 2); /* 64-byte keys of 2 fine hashes each */
	assert_ok(kvp_client_free_request(c, 2, false));
	kvp_client_close(c);
}

/* hash_algo=sha256: the daemon hashes pickle bytes (scenarios H1, H2), not CBOR. */
static void
test_service_hybrid_sha256_pickle_pool_hashes_as_vllm(void **state)
{
	struct kvp_client *c = open_pool("pickle");
	struct kvp_client_slots_result res;
	int32_t ids[64];
	int64_t tok[33];
	uint8_t h[2 * 32];
	uint32_t nb = 0, nt = 0;

	(void)state;
	assert_string_equal(kvp_client_info(c)->hash_algorithm, "sha256");
	for (int i = 0; i < 33; i++)
		tok[i] = i;
	prefill(c, 1, tok, 33, ids, &res);
	assert_ids(ids, res.num_new_blocks, 1, 2, 3);
	kvp_test_unhex("6358e31578a64b75ebe28cdb99d3beae65de82a2087321dc6ec84ae048faaaa6"
	               "3c3c50f324aefbdfbb124dfdc541efac3e94e59c40f4be08afe70601eeca92c8",
	               h, sizeof(h));
	struct kvp_client_lookup q = {.hashes = h, .num_hashes = 2};
	assert_ok(kvp_client_lookup(c, &q, ids, 64, &nb, &nt));
	assert_int_equal(nt, 32);
	assert_ids(ids, nb, 1, 2);
	/* sha256_cbor's H1 is not what this pool stored. */
	kvp_test_unhex("d830de3d42c00f25a2949b5d12d98642664a44872c1614c5b0147556276afc9c", h, 32);
	q.num_hashes = 1;
	assert_ok(kvp_client_lookup(c, &q, ids, 64, &nb, &nt));
	assert_int_equal(nb, 0);
	assert_ok(kvp_client_free_request(c, 1, false));
	kvp_client_close(c);
}

/* Lookup reports each hit's ref count (vLLM's callers read blk.ref_cnt);
 * Cache takes vLLM's block_mask. */
static void
test_service_lookup_reports_ref_counts(void **state)
{
	struct kvp_client *c = open_pool("pickle"), *d = open_pool("pickle");
	int64_t tok[40];
	int32_t ids[64], hit[8];
	uint32_t refs[8], nb, nt;
	struct kvp_client_slots_result res;
	(void)state;
	for (int i = 0; i < 40; i++)
		tok[i] = 1000 + i;
	prefill(c, 7, tok, 40, ids, &res); /* 2 full blocks cached, 1 partial */
	assert_int_equal(res.num_new_blocks, 3);
	struct kvp_client_slots a = {.request_id = 8, .prompt = tok, .num_prompt = 40,
	                             .use_prefix_cache = true};
	assert_ok(kvp_client_allocate_slots(d, &a, ids + 8, 56, &res));
	assert_int_equal(res.hit_tokens, 32);
	struct kvp_client_lookup q = {.tokens = tok, .num_tokens = 40};
	assert_ok(kvp_client_lookup_refs(c, &q, hit, refs, 8, &nb, &nt));
	assert_int_equal(nb, 2);
	assert_int_equal(refs[0], 2); /* both requests hold the shared prefix */
	assert_int_equal(refs[1], 2);
	assert_ok(kvp_client_free_request(d, 8, false));
	assert_ok(kvp_client_lookup_refs(c, &q, hit, refs, 8, &nb, &nt));
	assert_int_equal(refs[0], 1);
	assert_ok(kvp_client_free_request(c, 7, false));
	assert_ok(kvp_client_lookup_refs(c, &q, hit, refs, 8, &nb, &nt));
	assert_int_equal(nb, 2); /* evictable cached blocks: still hit, held by none */
	assert_int_equal(refs[0], 0);
	assert_int_equal(refs[1], 0);
	/* Cache with vLLM's block_mask: the masked-out block is not stored. */
	int64_t t2[48];
	const uint8_t mask[3] = {1, 0, 1};
	uint32_t stored = 99;
	for (int i = 0; i < 48; i++)
		t2[i] = 5000 + i;
	assert_ok(kvp_client_allocate(c, 3, ids));
	struct kvp_client_cache ca = {.block_ids = ids, .num_block_ids = 3, .num_full_blocks = 3,
	                              .tokens = t2, .num_tokens = 48, .block_mask = mask};
	assert_ok(kvp_client_cache(c, &ca, &stored));
	assert_int_equal(stored, 2);
	assert_ok(kvp_client_free(c, ids, 3));
	kvp_client_close(d);
	kvp_client_close(c);
}

/* The bulk batch path (a decode step in one adder call, its results in one
 * reader call) says what the call-by-call path says. */
static void
test_service_batch_bulk_decode_matches_per_call(void **state)
{
	struct kvp_client *c = open_pool("bulk");
	struct kvp_batch *b = NULL;
	const int64_t p1[4] = {1, 2, 3, 4}, p2[4] = {5, 6, 7, 8}, next[2] = {9, 10};
	const uint64_t rid[3] = {1, 2, 99};
	const uint32_t nnew[3] = {1, 1, 1}, ntok[3] = {1, 1, 0};
	int32_t st[5], ids[16];
	uint32_t comp[5], rows[10];
	size_t run, nids;
	(void)state;
	assert_ok(kvp_batch_create(&b));
	assert_ok(kvp_batch_set_flags(b, KVP_BATCH_CONTINUE));
	struct kvp_client_slots a = {.request_id = 1, .prompt = p1, .num_prompt = 4};
	assert_ok(kvp_batch_allocate_slots(b, &a));
	a.request_id = 2;
	a.prompt = p2;
	assert_ok(kvp_batch_allocate_slots(b, &a));
	/* A bad call adds nothing. */
	assert_int_equal(kvp_batch_allocate_slots_n(b, 3, NULL, nnew, ntok, next, 0, false),
	                 KVP_EINVAL);
	assert_int_equal(kvp_batch_allocate_slots_n(b, 3, rid, nnew, ntok, NULL, 0, false),
	                 KVP_EINVAL);
	assert_int_equal(kvp_batch_count(b), 2);
	/* Request 99 was never registered: refused alone. */
	assert_ok(kvp_batch_allocate_slots_n(b, 3, rid, nnew, ntok, next, 0, false));
	assert_int_equal(kvp_batch_count(b), 5);
	assert_int_not_equal(kvp_client_batch(c, b, &run), KVP_OK);
	assert_int_equal(run, 5);
	/* Too few groups, too small a buffer, a range past the end: nothing written. */
	assert_int_equal(kvp_batch_slots_results(b, 0, 5, 1, st, comp, rows, ids, 16, &nids),
	                 KVP_EINVAL);
	assert_int_equal(kvp_batch_slots_results(b, 0, 5, 2, st, comp, rows, ids, 7, &nids),
	                 KVP_EINVAL);
	assert_int_equal(kvp_batch_slots_results(b, 3, 3, 2, st, comp, rows, ids, 16, &nids),
	                 KVP_EINVAL);
	assert_ok(kvp_batch_slots_results(b, 0, 5, 2, st, comp, rows, ids, 16, &nids));
	assert_int_equal(nids, 8); /* one block per group: 2 prefills, 2 decodes into slot 5 */
	size_t off = 0;
	for (size_t i = 0; i < 5; i++) {
		struct kvp_batch_result r;
		kvp_batch_result(b, i, &r);
		assert_int_equal(st[i], r.status);
		if (i == 4) {
			assert_int_not_equal(st[i], KVP_OK);
			assert_int_equal(rows[8] + rows[9], 0);
			continue;
		}
		assert_int_equal(st[i], KVP_OK);
		assert_int_equal(comp[i], r.slots.num_computed_tokens);
		assert_int_equal(rows[i * 2], r.slots.new_blocks_per_group[0]);
		assert_int_equal(rows[i * 2 + 1], r.slots.new_blocks_per_group[1]);
		assert_int_equal(rows[i * 2] + rows[i * 2 + 1], r.num_block_ids);
		assert_memory_equal(ids + off, r.block_ids, r.num_block_ids * sizeof(int32_t));
		off += r.num_block_ids;
	}
	assert_int_equal(comp[2], 5);
	assert_int_equal(comp[3], 5);
	assert_ok(kvp_client_free_request(c, 1, false));
	assert_ok(kvp_client_free_request(c, 2, false));
	kvp_batch_destroy(b);
	kvp_client_close(c);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_service_hybrid_hello_reports_groups),
		cmocka_unit_test(test_service_hybrid_gptoss_ids_hits_and_events),
		cmocka_unit_test(test_service_hybrid_llama4_chunked_local),
		cmocka_unit_test(test_service_hybrid_qwen3next_mamba),
		cmocka_unit_test(test_service_hybrid_caching_off_and_coarse_blocks),
		cmocka_unit_test(test_service_hybrid_sha256_pickle_pool_hashes_as_vllm),
		cmocka_unit_test(test_service_lookup_reports_ref_counts),
		cmocka_unit_test(test_service_batch_bulk_decode_matches_per_call),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
