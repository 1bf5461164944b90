/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvp-bench-engine: the engine's throughput on the loops used to measure
 * vLLM's Python BlockPool, each beside a baseline measured in the same run
 * (a raw intrusive list, raw OpenSSL SHA-256), so ratios survive a noisy
 * machine. Prints a Markdown table; BENCHMARKS.md records it.
 *
 * usage: kvp-bench-engine [--quick | --only-b SECONDS | --count-a CYCLES | --count-b CYCLES]
 *   --quick    fewer repetitions and no 10M-block pool (for a smoke run)
 *   --only-b   run loop (b) alone for SECONDS (for a profiler)
 *   --count-a  run exactly CYCLES cycles of loop (a) and of the raw list,
 *              for callgrind --toggle-collect=cycle_a --toggle-collect=cycle_raw
 *   --count-b  run exactly CYCLES cycles of loop (b) after its warm-up, for
 *              an instruction count: valgrind --tool=callgrind
 *              --toggle-collect=cycle_b counts the warm-up's cycles too, so
 *              take the difference of two CYCLES
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "bench_cycle_b.h"

#include "common/block_hash.h"
#include "common/kvp_status.h"
#include "engine/manager.h"
#include "engine/pool.h"

static int reps = 5;
static double min_seconds = 0.3;

static void
check(int rv, const char *what)
{
	if (rv != KVP_OK) {
		fprintf(stderr, "bench: %s: %s\n", what, kvp_strerror(rv));
		exit(1);
	}
}

static struct kvp_pool *
mkpool(uint32_t n, uint32_t bs)
{
	struct kvp_pool_config cfg = {.num_blocks = n, .hash_block_size = bs,
	                              .enable_caching = true};
	struct kvp_pool *p;
	check(kvp_pool_create(&cfg, &p), "pool create");
	return p;
}

/* Runs body until min_seconds pass; stores operations per second in out. */
#define RATE(out, ops_per_iter, body)                                   \
	do {                                                            \
		double t0_ = now(), t_;                                 \
		long it_ = 0;                                           \
		do {                                                    \
			for (int k_ = 0; k_ < 1000; k_++) {             \
				body;                                   \
			}                                               \
			it_ += 1000;                                    \
		} while ((t_ = now() - t0_) < min_seconds);             \
		(out) = (double)it_ * (ops_per_iter) / t_;              \
	} while (0)

/* ---- the raw floor: an intrusive list with nothing else ---- */
struct rnode {
	int32_t prev, next;
};

/* Pops 16 from the head and appends them reversed at the tail. */
#define RAW_CYCLE(b, head, tail, out)                      \
	do {                                               \
		int32_t cur = b[head].next;                \
		for (int i = 0; i < 16; i++) {             \
			out[i] = cur;                      \
			cur = b[cur].next;                 \
		}                                          \
		b[head].next = cur;                        \
		b[cur].prev = head;                        \
		int32_t last = b[tail].prev;               \
		for (int i = 15; i >= 0; i--) {            \
			b[last].next = out[i];             \
			b[out[i]].prev = last;             \
			last = out[i];                     \
		}                                          \
		b[last].next = tail;                       \
		b[tail].prev = last;                       \
	} while (0)

static struct rnode *
raw_list_make(uint32_t n)
{
	struct rnode *b = malloc(((size_t)n + 2) * sizeof(*b));
	int32_t head = (int32_t)n, tail = (int32_t)n + 1;
	if (b == NULL)
		return NULL;
	for (uint32_t i = 0; i < n; i++) {
		b[i].prev = i ? (int32_t)i - 1 : head;
		b[i].next = i + 1 < n ? (int32_t)i + 1 : tail;
	}
	b[head].next = 0;
	b[tail].prev = (int32_t)n - 1;
	return b;
}

static double
raw_list_blocks_per_s(uint32_t n)
{
	struct rnode *b = raw_list_make(n);
	int32_t head = (int32_t)n, tail = (int32_t)n + 1, out[16];
	volatile int32_t sink = 0;
	double r;

	if (b == NULL)
		return 0;
	RATE(r, 16, {
		RAW_CYCLE(b, head, tail, out);
		sink += out[0];
	});
	free(b);
	return r;
}

/* One cycle of each of loop (a)'s two sides, as functions callgrind can count (--count-a). */
static __attribute__((noinline)) void
cycle_raw(struct rnode *b, int32_t head, int32_t tail)
{
	int32_t out[16];
	RAW_CYCLE(b, head, tail, out);
}

static __attribute__((noinline)) void
cycle_a(struct kvp_pool *p)
{
	int32_t ids[16];
	kvp_pool_get_new_blocks(p, 16, ids);
	bench_rev16(ids);
	kvp_pool_free_blocks(p, ids, 16);
}

/* (a) get_new_blocks(16) then free reversed. */
static double
loop_a(void)
{
	struct kvp_pool *p = mkpool(100000, 16);
	int32_t ids[16];
	double r;
	(void)ids;
	RATE(r, 16, cycle_a(p));
	kvp_pool_destroy(p);
	return r;
}

static double
loop_b_n(uint32_t nblocks)
{
	struct bstate s;
	double r;

	warm_b(&s, mkpool(nblocks, 16), nblocks);
	RATE(r, 1, cycle_b(&s, true));
	check(kvp_pool_check(s.p, NULL, 0), "invariants after loop b");
	kvp_pool_destroy(s.p);
	return r;
}

static double
loop_b(void)
{
	return loop_b_n(100000);
}

/*
 * (m) the manager's request cycle, the same for every group layout: a
 * 256-token prompt (its first 128 tokens shared by every request), its
 * prefix hit, allocate_slots for the rest, 16 decode steps (append one
 * token, allocate_slots(1)), free. Hashing is part of the work.
 */
static const char *manager_groups = "full:16";

struct mcycle {
	struct kvp_mgr *m;
	int64_t prompt[256], tok;
	uint64_t id;
	int32_t rows[2][KVP_MAX_GROUPS][64];
};

static void
manager_cycle(struct mcycle *x)
{
	int32_t *hits[KVP_MAX_GROUPS], *fresh[KVP_MAX_GROUPS];
	size_t counts[KVP_MAX_GROUPS];
	uint32_t hit = 0;

	for (uint32_t i = 0; i < KVP_MAX_GROUPS; i++) {
		hits[i] = x->rows[0][i];
		fresh[i] = x->rows[1][i];
	}
	for (int i = 128; i < 256; i++)
		x->prompt[i] = ++x->tok;
	struct kvp_request_desc d = {.prompt = x->prompt, .num_prompt = 256};
	check(kvp_mgr_add_request(x->m, ++x->id, &d), "add");
	check(kvp_mgr_get_computed_blocks(x->m, x->id, hits, 64, &hit), "lookup");
	struct kvp_alloc_args a = {.num_new_tokens = 256 - hit, .num_new_computed_tokens = hit,
	                           .computed_blocks = (const int32_t *const *)hits};
	check(kvp_mgr_allocate_slots(x->m, x->id, &a, fresh, 64, counts), "allocate");
	for (int s = 0; s < 16; s++) {
		int64_t t = ++x->tok;
		struct kvp_alloc_args one = {.num_new_tokens = 1};
		check(kvp_mgr_append_tokens(x->m, x->id, &t, 1), "append");
		check(kvp_mgr_allocate_slots(x->m, x->id, &one, fresh, 64, counts), "decode");
	}
	check(kvp_mgr_free_request(x->m, x->id), "free");
}

static double
loop_m(void)
{
	struct kvp_pool_config pc = {.num_blocks = 100000, .hash_block_size = 16,
	                             .enable_caching = true, .enable_events = false};
	struct kvp_group_spec g[KVP_MAX_GROUPS];
	size_t ng = 0;
	struct kvp_pool *p = NULL;
	struct kvp_hasher *h = NULL;
	static struct mcycle x;

	check(kvp_group_specs_parse(manager_groups, g, KVP_MAX_GROUPS, &ng, NULL, 0), "groups");
	struct kvp_mgr_config mc = {.num_groups = (uint32_t)ng, .groups = g,
	                            .max_model_len = 4096, .max_requests = 16};
	check(kvp_pool_create(&pc, &p), "pool");
	check(kvp_hasher_create("0", &h), "hasher");
	check(kvp_mgr_create(p, h, &mc, &x.m), "manager");
	for (int i = 0; i < 128; i++)
		x.prompt[i] = i;
	double r;
	RATE(r, 1, manager_cycle(&x));
	check(kvp_pool_check(p, NULL, 0), "invariants after loop m");
	kvp_mgr_destroy(x.m);
	kvp_hasher_destroy(h);
	kvp_pool_destroy(p);
	return r;
}

/* (c) touch + free of one cached block from the middle of a full free queue. */
static double
loop_c(void)
{
	enum { N = 100000 };
	struct kvp_pool *p = mkpool(N, 16);
	int32_t *all = malloc(N * sizeof(*all)), pick[1024];
	uint8_t *h = calloc(N, KVP_HASH_LEN);
	struct kvp_cache_args a = {.block_hashes = h, .num_block_hashes = N - 1,
	                           .num_full_blocks = N - 1, .block_size = 16};
	uint64_t x = 88172645463325252ull;
	unsigned k = 0;

	for (uint32_t i = 0; i < N - 1; i++)
		memcpy(h + (size_t)i * KVP_HASH_LEN, &i, sizeof(i));
	check(kvp_pool_get_new_blocks(p, N - 1, all), "fill");
	check(kvp_pool_cache_full_blocks(p, all, N - 1, &a), "cache all");
	check(kvp_pool_free_blocks(p, all, N - 1), "free all");
	for (int i = 0; i < 1024; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		pick[i] = (int32_t)(1 + N / 4 + x % (N / 2)); /* the middle half */
	}
	double r;
	RATE(r, 1, {
		int32_t id = pick[k++ & 1023];
		kvp_pool_touch(p, &id, 1);
		kvp_pool_free_blocks(p, &id, 1);
	});
	check(kvp_pool_check(p, NULL, 0), "invariants after loop c");
	free(all);
	free(h);
	kvp_pool_destroy(p);
	return r;
}

/* Where the previous block's digest (hlen bytes at prev) sits in block input e. */
static size_t
parent_at(const uint8_t *e, size_t len, const uint8_t *prev, size_t hlen)
{
	for (size_t o = 0; o + hlen <= len; o++)
		if (memcmp(e + o, prev, hlen) == 0)
			return o;
	fprintf(stderr, "bench: a block input without its parent\n");
	exit(1);
}

/*
 * (d) hashing a 32k-token prompt in 16-token blocks, against the algorithm's
 * raw digest (SHA-256 or XXH3-128) of the same bytes, digested one after
 * another as independent messages. chain_ms (if not NULL): the same raw
 * digests, each written into the next input before it is digested, as the
 * chain must (a digest cannot start before its parent's ends).
 */
static void
loop_hash(enum kvp_hash_algo algo, double *ours_ms, double *raw_ms, double *chain_ms, double *mb)
{
	enum { T = 32768, BS = 16, NB = T / BS };
	struct kvp_hasher *h;
	int64_t *tok = malloc(T * sizeof(*tok));
	uint8_t *out = malloc(NB * KVP_HASH_LEN), *enc = malloc((size_t)NB * 256);
	size_t *len = malloc(NB * sizeof(*len)), *at = malloc(NB * sizeof(*at)), n, total = 0;
	uint64_t x = 0x2545f4914f6cdd1dull;
	double a[16], b[16], c[16];

	check(kvp_hasher_create_algo("0", algo, &h), "hasher");
	for (int i = 0; i < T; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		tok[i] = (int64_t)(x % 151643);
	}
	check(kvp_hash_request(h, NULL, tok, T, BS, NULL, 0, out, NB, &n), "hash");
	for (int i = 0; i < NB; i++) {
		check(kvp_hash_block_input(h, i ? out + (size_t)(i - 1) * kvp_hasher_len(h) : NULL,
		                           tok + i * BS, BS, NULL, 0, enc + (size_t)i * 256, 256,
		                           &len[i]),
		      "encode");
		total += len[i];
		if (i > 0)
			at[i] = parent_at(enc + (size_t)i * 256, len[i],
			                  out + (size_t)(i - 1) * kvp_hasher_len(h), kvp_hasher_len(h));
	}
	for (int r = 0; r < reps * 3; r++) {
		double t0 = now();
		for (int k = 0; k < 20; k++)
			check(kvp_hash_request(h, NULL, tok, T, BS, NULL, 0, out, NB, &n), "hash");
		a[r] = (now() - t0) / 20;
		uint8_t d[KVP_HASH_LEN];
		t0 = now();
		for (int k = 0; k < 20; k++)
			for (int i = 0; i < NB; i++)
				check(kvp_hash_raw(h, enc + (size_t)i * 256, len[i], d), "raw");
		b[r] = (now() - t0) / 20;
		t0 = now();
		for (int k = 0; chain_ms && k < 20; k++)
			for (int i = 0; i < NB; i++) {
				uint8_t *e = enc + (size_t)i * 256;
				if (i > 0)
					memcpy(e + at[i], d, kvp_hasher_len(h));
				check(kvp_hash_raw(h, e, len[i], d), "raw");
			}
		c[r] = (now() - t0) / 20;
	}
	*ours_ms = median(a, reps * 3) * 1e3;
	*raw_ms = median(b, reps * 3) * 1e3;
	if (chain_ms)
		*chain_ms = median(c, reps * 3) * 1e3;
	*mb = (double)total / 1e6;
	kvp_hasher_destroy(h);
	free(tok);
	free(out);
	free(enc);
	free(len);
	free(at);
}

static void
creation(uint32_t n, double *ms, double *meta_per_block, double *map_per_block)
{
	double v[8];
	size_t meta = 0, map = 0;
	for (int r = 0; r < reps; r++) {
		double t0 = now();
		struct kvp_pool *p = mkpool(n, 16);
		v[r] = (now() - t0) * 1e3;
		meta = kvp_pool_metadata_bytes(p, &map);
		kvp_pool_destroy(p);
	}
	*ms = median(v, reps);
	*meta_per_block = (double)meta / n;
	*map_per_block = (double)map / n;
}

static double
median_of(double (*fn)(void))
{
	double v[16];
	for (int r = 0; r < reps; r++)
		v[r] = fn();
	return median(v, reps);
}

static double
raw_list_100k(void)
{
	return raw_list_blocks_per_s(100000);
}

int
main(int argc, char **argv)
{
	int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
	if (argc > 2 && strcmp(argv[1], "--only-b") == 0) { /* for profilers */
		min_seconds = atof(argv[2]);
		printf("(b) %.0f cycles/s\n", loop_b());
		if (argc > 3)
			printf("(b) %.0f cycles/s with %s blocks\n",
			       loop_b_n((uint32_t)atoi(argv[3])), argv[3]);
		return 0;
	}
	if (argc > 2 && strcmp(argv[1], "--count-a") == 0) { /* N cycles of (a) and of the raw list */
		long cycles = atol(argv[2]);
		struct kvp_pool *p = mkpool(100000, 16);
		struct rnode *b = raw_list_make(100000);
		if (b == NULL)
			return 1;
		for (long i = 0; i < cycles; i++) {
			cycle_a(p);
			cycle_raw(b, 100000, 100001);
		}
		kvp_pool_destroy(p);
		free(b);
		printf("(a) %ld cycles of 16 blocks, and of the raw list\n", cycles);
		return 0;
	}
	if (argc > 2 && strcmp(argv[1], "--count-b") == 0) { /* exactly N cycles, for callgrind */
		struct bstate st;
		long cycles = atol(argv[2]);
		warm_b(&st, mkpool(100000, 16), 100000);
		for (long i = 0; i < cycles; i++)
			cycle_b(&st, true);
		check(kvp_pool_check(st.p, NULL, 0), "invariants after loop b");
		kvp_pool_destroy(st.p);
		printf("(b) %ld cycles after %d warm-up cycles\n", cycles, 2 * 100000 / 16);
		return 0;
	}
	if (argc > 3 && strcmp(argv[1], "--only-m") == 0) { /* A/B runs of loop (m) */
		manager_groups = argv[2];
		min_seconds = atof(argv[3]);
		printf("(m) %s: %.0f cycles/s\n", manager_groups, median_of(loop_m));
		return 0;
	}
	if (quick) {
		reps = 3;
		min_seconds = 0.05;
	}
	printf("kvp-bench-engine: medians of %d runs, pool of 100,000 blocks, block_size 16\n\n",
	       reps);
	double floor = median_of(raw_list_100k);
	double a = median_of(loop_a);
	double b = median_of(loop_b);
	double c = median_of(loop_c);
	manager_groups = "full:16";
	double mf = median_of(loop_m);
	manager_groups = "full:16+sliding_window:16:128";
	double mh = median_of(loop_m);
	double ours_ms, raw_ms, chain_ms, mb, pk_ms, pk_raw_ms, pk_mb, xc_ms, xc_raw_ms, xc_mb, xp_ms,
		xp_raw_ms, xp_mb;
	loop_hash(KVP_HASH_SHA256_CBOR, &ours_ms, &raw_ms, &chain_ms, &mb);
	loop_hash(KVP_HASH_SHA256, &pk_ms, &pk_raw_ms, NULL, &pk_mb);
	loop_hash(KVP_HASH_XXHASH_CBOR, &xc_ms, &xc_raw_ms, NULL, &xc_mb);
	loop_hash(KVP_HASH_XXHASH, &xp_ms, &xp_raw_ms, NULL, &xp_mb);

	/*
	 * Only same-run baselines: vLLM's Python classes do not run here, and a
	 * ratio against a figure from another day is not a measurement
	 * (BENCHMARKS.md pairs vLLM's, measured beside these, where it has them).
	 */
	printf("| loop | kvpool | baseline in this run | ratio | target |\n");
	printf("|---|---|---|---|---|\n");
	printf("| (a) get_new_blocks(16) + free reversed | %.1fM blocks/s | raw list %.1fM blocks/s | %.2f | >= 0.50 |\n",
	       a / 1e6, floor / 1e6, a / floor);
	printf("| (b) request cycle (alloc, cache 16, free, 16 lookups, touch, free) | %.0fk cycles/s | | | < 8,000 instructions per cycle (callgrind) |\n",
	       b / 1e3);
	printf("| (c) touch + free, mid-queue cached block | %.1fM pairs/s | | | |\n", c / 1e6);
	printf("| (d) hash 32k tokens, 16-token blocks | %.3f ms (%.0f MB/s) | raw SHA-256 %.3f ms (%.0f MB/s) | %.2f | >= 0.80 |\n",
	       ours_ms, mb / (ours_ms / 1e3), raw_ms, mb / (raw_ms / 1e3), raw_ms / ours_ms);
	printf("| (d) the same, against raw SHA-256 chained (each digest written into the next input) | %.3f ms | raw SHA-256 chained %.3f ms (%.0f MB/s) | %.2f | |\n",
	       ours_ms, chain_ms, mb / (chain_ms / 1e3), chain_ms / ours_ms);
	printf("| (d) the same with hash_algo sha256 (pickle) | %.3f ms (%.0f MB/s) | raw SHA-256 %.3f ms (%.0f MB/s) | %.2f | |\n",
	       pk_ms, pk_mb / (pk_ms / 1e3), pk_raw_ms, pk_mb / (pk_raw_ms / 1e3), pk_raw_ms / pk_ms);
	printf("| (d) the same with hash_algo xxhash_cbor | %.3f ms (%.0f MB/s) | raw XXH3-128 %.3f ms (%.0f MB/s) | %.2f | |\n",
	       xc_ms, xc_mb / (xc_ms / 1e3), xc_raw_ms, xc_mb / (xc_raw_ms / 1e3), xc_raw_ms / xc_ms);
	printf("| (d) the same with hash_algo xxhash (pickle) | %.3f ms (%.0f MB/s) | raw XXH3-128 %.3f ms (%.0f MB/s) | %.2f | |\n\n",
	       xp_ms, xp_mb / (xp_ms / 1e3), xp_raw_ms, xp_mb / (xp_raw_ms / 1e3), xp_raw_ms / xp_ms);

	printf("| manager request cycle (256-token prompt, 128 shared; 16 decode steps; free) | cycles/s | vs full attention |\n");
	printf("|---|---|---|\n");
	printf("| full:16 | %.1fk | 1.00 |\n", mf / 1e3);
	printf("| full:16+sliding_window:16:128 (gpt-oss-like) | %.1fk | %.2f |\n\n", mh / 1e3,
	       mh / mf);

	printf("| pool | creation | metadata per block | map per block (buckets + keys) | target |\n");
	printf("|---|---|---|---|---|\n");
	const uint32_t sizes[] = {1000000, 10000000};
	for (int i = 0; i < (quick ? 1 : 2); i++) {
		double ms, meta, map;
		creation(sizes[i], &ms, &meta, &map);
		printf("| %uM blocks | %.1f ms | %.1f B | %.1f B | <= 64 B; 1M under 50 ms |\n",
		       sizes[i] / 1000000, ms, meta, map);
	}
	return 0;
}
