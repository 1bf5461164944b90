/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvp-bench-client: the C client's side of the Python package's benchmark
 * (clients/python/bench/bench_python.py runs both in one run against one
 * kvpoold and prints the ratios). Against a running daemon:
 *
 *   kvp-bench-client URL POOL stats N   N Stats calls
 *   kvp-bench-client URL POOL alloc N   N x (Allocate 16 + Free)
 *   kvp-bench-client URL POOL prompt N  a prefill: AllocateSlots of an 8,192-token prompt
 *                                       (a new request each time, its prefix cached after
 *                                       the first) and FreeRequest, N pairs
 *   kvp-bench-client URL POOL step N    the step workload below, N steps
 *   kvp-bench-client URL POOL step-cold N   the same, walking a 4 MiB buffer
 *                                       before each call, as an interpreter's
 *                                       work between calls would evict the
 *                                       client's and nng's code and data
 *   kvp-bench-client URL POOL step-gap N    the same, busy for KVP_BENCH_GAP_US
 *                                       (350) µs before each call, as a
 *                                       client working between calls is
 *   kvp-bench-client URL POOL step-prefetch N   the same, the 8 Lookups as one
 *                                       Batch (RemoteKVCacheManager's
 *                                       prefetch_computed_blocks): two round
 *                                       trips a step
 *
 * Prints "MODE US_PER_OP CPU_US_PER_OP" (wall time, and the process's CPU
 * time over all its threads, nng's included). Built also as a module
 * (libkvp_bench_client.so, kvp_bench_client_run) that bench_python.py loads,
 * so both clients are timed in one process on one machine state. The step workload (the same in bench_python.py):
 * 4 system prompts of 128 tokens; request r's prompt is system prompt r%4
 * then 32 tokens of its own (160 tokens). 8 warm-up steps admit 32
 * requests each (256 running). Each timed step then frees the 8 oldest
 * requests, decodes one token for the other 248 (AllocateSlots with one new
 * token) and admits 8 new ones: a Lookup of each one's hashes (vLLM's
 * get_computed_blocks, one round trip each) and an AllocateSlots taking
 * that hit. The 264 request calls go as one Batch (keep going, borrowed
 * arrays; the decodes added with one kvp_batch_allocate_slots_n, the
 * cheapest way the C client has). Hashes are computed before timing, as vLLM's Request does.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "clients/c/kvpool.h"
#include "common/block_hash.h"

#define SYS_TOKENS 128
#define OWN_TOKENS 32
#define PROMPT (SYS_TOKENS + OWN_TOKENS)
#define BS 16
#define RUNNING 256
#define TURNOVER 8
#define MAXB (PROMPT / BS)

struct req {
	int64_t prompt[PROMPT];
	uint8_t hashes[MAXB * KVP_HASH_LEN];
	size_t nh;
};

static int
die(struct kvp_client *c, const char *what, int rv)
{
	fprintf(stderr, "kvp-bench-client: %s: %s (%s)\n", what, kvp_status_name(rv),
	        c ? kvp_client_last_detail(c) : "");
	return 1;
}

static void
make_req(struct kvp_hasher *h, uint64_t r, struct req *q)
{
	for (int i = 0; i < SYS_TOKENS; i++)
		q->prompt[i] = (int64_t)(r % 4) * 100000 + i;
	for (int j = 0; j < OWN_TOKENS; j++)
		q->prompt[SYS_TOKENS + j] = 10000000 + (int64_t)r * OWN_TOKENS + j;
	(void)kvp_hash_request(h, NULL, q->prompt, PROMPT, BS, NULL, 0, q->hashes, MAXB, &q->nh);
}

/* Seconds the timed steps of the last step run spent in their Lookups and
 * inside kvp_client_batch; µs per step once the run ends. */
static double lookup_s, batch_s;

/* step-cold's buffer (NULL: plain step) and its walk, outside the timed calls. */
enum { COLD_BYTES = 4 << 20 };
static uint8_t *cold;

/* step-gap: spin this long before each call (KVP_BENCH_GAP_US, default 350:
 * about what the Python step spends between its Batch and its next Lookup) */
static double gap_s;
/* step-prefetch: the step's Lookups go as one Batch before its calls' Batch */
static bool prefetch;

static void
disturb(void)
{
	if (gap_s > 0) {
		double until = now() + gap_s;
		while (now() < until)
			;
	}
	if (cold == NULL)
		return;
	for (size_t i = 0; i < COLD_BYTES; i += 64)
		cold[i]++;
}

/* One step: free the oldest, decode the rest, admit `admit` new ones. */
static int
step(struct kvp_client *c, struct kvp_batch *b, struct req *reqs, uint64_t *first, uint64_t *next,
     int admit, int finish)
{
	static const int64_t tok = 7;
	static uint64_t dec_ids[RUNNING];
	static uint32_t dec_one[RUNNING];
	static int64_t dec_tok[RUNNING];
	int32_t ids[MAXB];
	uint32_t refs[MAXB], nb, ht;
	uint32_t hit[64];
	int rv;

	if (prefetch)
		kvp_batch_clear(b);
	for (int k = 0; k < admit; k++) {
		struct req *q = &reqs[*next + (uint64_t)k];
		/* vLLM's get_computed_blocks: at most (160 - 1) / 16 blocks. */
		size_t n = (PROMPT - 1) / BS < q->nh ? (PROMPT - 1) / BS : q->nh;
		struct kvp_client_lookup l = {.hashes = q->hashes, .num_hashes = n};
		if (prefetch) {
			if ((rv = kvp_batch_lookup(b, &l)) != KVP_OK)
				return die(c, "lookup", rv);
			continue;
		}
		disturb();
		double t = now();
		if ((rv = kvp_client_lookup_refs(c, &l, ids, refs, MAXB, &nb, &ht)) != KVP_OK)
			return die(c, "lookup", rv);
		lookup_s += now() - t;
		hit[k] = ht;
	}
	if (prefetch && admit > 0) {
		size_t ran;
		disturb();
		double t = now();
		rv = kvp_client_batch(c, b, &ran);
		lookup_s += now() - t;
		if (rv != KVP_OK)
			return die(c, "lookup batch", rv);
		for (int k = 0; k < admit; k++) {
			struct kvp_batch_result r;
			if ((rv = kvp_batch_result(b, (size_t)k, &r)) != KVP_OK || r.status != KVP_OK)
				return die(c, "lookup result", rv != KVP_OK ? rv : r.status);
			hit[k] = r.slots.hit_tokens;
		}
	}
	kvp_batch_clear(b);
	for (int k = 0; k < finish; k++)
		kvp_batch_free_request(b, *first + (uint64_t)k + 1, false);
	*first += (uint64_t)finish;
	size_t nd = (size_t)(*next - *first);
	for (size_t i = 0; i < nd; i++) {
		dec_ids[i] = *first + i + 1;
		dec_one[i] = 1;
		dec_tok[i] = tok;
	}
	if ((rv = kvp_batch_allocate_slots_n(b, nd, dec_ids, dec_one, dec_one, dec_tok, 0, false)) !=
	    KVP_OK)
		return die(c, "decodes", rv);
	for (int k = 0; k < admit; k++) {
		struct req *q = &reqs[*next];
		struct kvp_client_slots a = {.request_id = *next + 1, .prompt = q->prompt,
		                             .num_prompt = PROMPT, .num_new_tokens = PROMPT - hit[k],
		                             .use_prefix_cache = hit[k] > 0};
		kvp_batch_allocate_slots(b, &a);
		(*next)++;
	}
	size_t run;
	disturb();
	double t = now();
	rv = kvp_client_batch(c, b, &run);
	batch_s += now() - t;
	if (rv != KVP_OK)
		return die(c, "step batch", rv);
	return 0;
}

/*
 * One measurement: n ops of mode against pool at url. 0 and *us, *cpu_us
 * (wall and process CPU µs per op); 2: bad arguments; 1: a call failed.
 * Exported for bench_python.py, which loads this file as a module to time
 * the C client in its own process.
 */
int kvp_bench_client_run(const char *url, const char *pool, const char *mode, long n, double *us,
                         double *cpu_us);
/* The mean µs per timed step of the last step run spent in its 8 Lookups
 * (which 0) or inside kvp_client_batch (which 1, the Batch's round trip), for
 * bench_python.py's split of the step. */
double kvp_bench_client_phase_us(int which);

double
kvp_bench_client_phase_us(int which)
{
	return which == 0 ? lookup_s : batch_s;
}

int
kvp_bench_client_run(const char *url, const char *pool, const char *mode, long n, double *us,
                     double *cpu_us)
{
	struct kvp_client *c = NULL;
	int rv;

	if (url == NULL || pool == NULL || mode == NULL || us == NULL || cpu_us == NULL || n <= 0 ||
	    (strcmp(mode, "stats") && strcmp(mode, "alloc") && strcmp(mode, "prompt") &&
	     strcmp(mode, "step") && strcmp(mode, "step-cold") && strcmp(mode, "step-gap") &&
	     strcmp(mode, "step-prefetch"))) {
		fprintf(stderr, "kvp-bench-client: bad mode or count\n");
		return 2;
	}
	struct kvp_client_options o = {.url = url, .pool = pool, .timeout_ms = 10000};
	if ((rv = kvp_client_open(&o, &c)) != KVP_OK) {
		fprintf(stderr, "kvp-bench-client: open: %s\n", kvp_client_open_detail());
		return 1;
	}
	double t0 = 0, t1 = 0, c0 = 0, c1 = 0;
	int err = 0;
	if (strcmp(mode, "stats") == 0) {
		struct kvp_client_stats st;
		t0 = now();
		c0 = cpu_now();
		for (long i = 0; i < n && !err; i++)
			if ((rv = kvp_client_stats(c, &st)) != KVP_OK)
				err = die(c, "stats", rv);
		t1 = now();
		c1 = cpu_now();
	} else if (strcmp(mode, "alloc") == 0) {
		int32_t ids[16];
		t0 = now();
		c0 = cpu_now();
		for (long i = 0; i < n && !err; i++)
			if ((rv = kvp_client_allocate(c, 16, ids)) != KVP_OK ||
			    (rv = kvp_client_free(c, ids, 16)) != KVP_OK)
				err = die(c, "allocate+free", rv);
		t1 = now();
		c1 = cpu_now();
	} else if (strcmp(mode, "prompt") == 0) {
		/* A prefill as one AllocateSlots: the request's whole prompt, then FreeRequest. */
		enum { LONG = 8192 };
		static int64_t prompt[LONG];
		static int32_t blocks[LONG / BS + 2];
		struct kvp_client_slots_result res;
		for (int i = 0; i < LONG; i++)
			prompt[i] = (int64_t)((uint64_t)i * 2654435761u % 151643);
		t0 = now();
		c0 = cpu_now();
		for (long i = 0; i < n && !err; i++) {
			struct kvp_client_slots a = {.request_id = (uint64_t)i + 1, .prompt = prompt,
			                             .num_prompt = LONG, .use_prefix_cache = true};
			if ((rv = kvp_client_allocate_slots(c, &a, blocks, LONG / BS + 2, &res)) != KVP_OK ||
			    (rv = kvp_client_free_request(c, (uint64_t)i + 1, false)) != KVP_OK)
				err = die(c, "allocate_slots+free_request", rv);
		}
		t1 = now();
		c1 = cpu_now();
	} else {
		const char *gap = getenv("KVP_BENCH_GAP_US");
		gap_s = strcmp(mode, "step-gap") == 0 ? (gap ? atof(gap) : 350) * 1e-6 : 0;
		prefetch = strcmp(mode, "step-prefetch") == 0;
		if (strcmp(mode, "step-cold") == 0 && (cold = calloc(1, COLD_BYTES)) == NULL) {
			kvp_client_close(c);
			return 1;
		}
		struct kvp_hasher *h = NULL;
		struct kvp_batch *b = NULL;
		enum kvp_hash_algo algo;
		size_t total = (size_t)RUNNING + (size_t)n * TURNOVER;
		struct req *reqs = calloc(total, sizeof(*reqs));
		if (reqs == NULL || kvp_batch_create(&b) != KVP_OK ||
		    kvp_hash_algo_parse(kvp_client_info(c)->hash_algorithm, &algo) != KVP_OK ||
		    kvp_hasher_create_algo("0", algo, &h) != KVP_OK) {
			fprintf(stderr, "kvp-bench-client: setup failed\n");
			return 1;
		}
		for (size_t r = 0; r < total; r++)
			make_req(h, r, &reqs[r]);
		kvp_batch_set_flags(b, KVP_BATCH_CONTINUE | KVP_BATCH_BORROW);
		uint64_t first = 0, next = 0;
		for (int w = 0; w < RUNNING / 32 && !err; w++)
			err = step(c, b, reqs, &first, &next, 32, 0);
		lookup_s = batch_s = 0;
		t0 = now();
		c0 = cpu_now();
		for (long s = 0; s < n && !err; s++)
			err = step(c, b, reqs, &first, &next, TURNOVER, TURNOVER);
		t1 = now();
		c1 = cpu_now();
		lookup_s = lookup_s / (double)n * 1e6;
		batch_s = batch_s / (double)n * 1e6;
		kvp_batch_destroy(b);
		kvp_hasher_destroy(h);
		free(reqs);
		free(cold);
		cold = NULL;
	}
	kvp_client_close(c);
	if (err)
		return 1;
	*us = (t1 - t0) / (double)n * 1e6;
	*cpu_us = (c1 - c0) / (double)n * 1e6;
	return 0;
}

#ifndef KVP_BENCH_CLIENT_MODULE
int
main(int argc, char **argv)
{
	double us, cpu;
	int rv;
	if (argc != 5) {
		fprintf(stderr,
		        "usage: kvp-bench-client URL POOL stats|alloc|prompt|step|step-cold|step-gap|"
		        "step-prefetch N\n");
		return 2;
	}
	if ((rv = kvp_bench_client_run(argv[1], argv[2], argv[3], strtol(argv[4], NULL, 10), &us,
	                               &cpu)) != 0)
		return rv;
	printf("%s %.3f %.3f\n", argv[3], us, cpu);
	return 0;
}
#endif
