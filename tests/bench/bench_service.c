/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvp-bench-service: kvpoold's calls over real sockets, beside raw nng
 * REQ/REP round trips of a small message measured in the same run (an
 * in-process REP echo on the same transport), so the ratio is our overhead.
 *
 * usage: kvp-bench-service [--quick | --only-batch] [PATH_TO_KVPOOLD]
 *   --only-batch  the batched cycle alone over ipc://, 3 s, for a profiler
 * Starts its own kvpoold (fork+exec before touching nng) on ipc:// and
 * tcp://127.0.0.1, with a 100,000-block pool of block size 16.
 */
#define _POSIX_C_SOURCE 200809L

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "../spawn.h"
#include "bench_cycle_b.h"
#include "bench_util.h"
#include <unistd.h>

#include "clients/c/kvpool.h"
#include "kvpool.pb-c.h"

#define MAX_CLIENTS 8
#define VLLM_B_CYCLES_PER_S 27000.0

static double seconds = 1.0;
static char ipc_url[128], tcp_url[128], echo_ipc[128], echo_tcp[128];

/* ---- one measurement: N threads each running an operation until time is up ---- */

enum kind { RAW, STATS, ALLOC_FREE, CYCLE, CYCLE_BATCH };

struct job {
	enum kind kind;
	const char *url;
	int index;
	long ops;          /* round trips */
	long units;        /* what the row counts: calls, or request cycles */
	double *lat;       /* per round trip, seconds */
	size_t nlat, caplat;
	int failed;
};

static void
record(struct job *j, double dt)
{
	if (j->nlat == j->caplat) {
		size_t cap = j->caplat ? j->caplat * 2 : 4096;
		double *n = realloc(j->lat, cap * sizeof(*n));
		if (n == NULL) {
			j->failed = 1;
			return;
		}
		j->lat = n;
		j->caplat = cap;
	}
	j->lat[j->nlat++] = dt;
}

static void
run_raw(struct job *j)
{
	nng_socket s;
	char msg[64] = "ping";
	if (nng_req0_open(&s) != 0 || nng_dial(s, j->url, NULL, 0) != 0) {
		j->failed = 1;
		return;
	}
	double end = now() + seconds;
	while (now() < end) {
		void *buf = NULL;
		size_t len = 0;
		double t0 = now();
		if (nng_send(s, msg, sizeof(msg), 0) != 0 ||
		    nng_recv(s, &buf, &len, NNG_FLAG_ALLOC) != 0) {
			j->failed = 1;
			break;
		}
		nng_free(buf, len);
		record(j, now() - t0);
		j->ops++;
		j->units++;
	}
	nng_close(s);
}

/* Unique 32-byte hashes per thread and cycle. */
static void
fill_hashes(uint8_t *h, int thread, uint64_t cycle)
{
	for (int i = 0; i < 16; i++) {
		memset(h + i * 32, 0x5a, 32);
		uint64_t v = cycle * 16 + (uint64_t)i;
		memcpy(h + i * 32, &v, 8);
		h[i * 32 + 8] = (uint8_t)thread;
	}
}

static void
rev16(int32_t *a)
{
	for (int i = 0; i < 8; i++) {
		int32_t t = a[i];
		a[i] = a[15 - i];
		a[15 - i] = t;
	}
}

#define TIMED(j, expr)                                        \
	do {                                                  \
		double t0_ = now();                           \
		if ((expr) != KVP_OK) {                       \
			(j)->failed = 1;                      \
			goto out;                             \
		}                                             \
		record((j), now() - t0_);                     \
		(j)->ops++;                                   \
	} while (0)

static void
run_calls(struct job *j)
{
	struct kvp_client_options o = {.url = j->url, .pool = "bench", .timeout_ms = 10000};
	struct kvp_client *c = NULL;
	struct kvp_client_stats st;
	int32_t ids[16], rev[16], hits[16];
	uint8_t h[16 * 32];
	uint64_t cycle = 0;

	if (kvp_client_open(&o, &c) != KVP_OK) {
		j->failed = 1;
		return;
	}
	double end = now() + seconds;
	while (now() < end && !j->failed) {
		switch (j->kind) {
		case STATS:
			TIMED(j, kvp_client_stats(c, &st));
			j->units++;
			break;
		case ALLOC_FREE:
			TIMED(j, kvp_client_allocate(c, 16, ids));
			TIMED(j, kvp_client_free(c, ids, 16));
			j->units += 2;
			break;
		case CYCLE: {
			/* The engine's loop (b), one call per round trip. */
			uint32_t nh = 0, ht = 0;
			fill_hashes(h, j->index, cycle++);
			TIMED(j, kvp_client_allocate(c, 16, ids));
			struct kvp_client_cache ca = {.block_ids = ids, .num_block_ids = 16,
			                              .num_full_blocks = 16, .hashes = h,
			                              .num_hashes = 16};
			TIMED(j, kvp_client_cache(c, &ca, NULL));
			memcpy(rev, ids, sizeof(ids));
			rev16(rev);
			TIMED(j, kvp_client_free(c, rev, 16));
			struct kvp_client_lookup q = {.hashes = h, .num_hashes = 16};
			TIMED(j, kvp_client_lookup(c, &q, hits, 16, &nh, &ht));
			TIMED(j, kvp_client_touch(c, hits, nh));
			memcpy(rev, hits, nh * sizeof(*hits));
			if (nh == 16)
				rev16(rev);
			TIMED(j, kvp_client_free(c, rev, nh));
			j->units++;
			break;
		}
		default:
			break;
		}
	}
out:
	kvp_client_close(c);
}

/*
 * Loop (b) in Batches of 64 cycles per round trip, pipelined: each batch
 * caches, frees, looks up, touches and frees the blocks the previous batch
 * allocated, then allocates the next cycle's blocks.
 */
static void
run_batch(struct job *j)
{
	enum { B = 64 };
	struct kvp_client_options o = {.url = j->url, .pool = "bench", .timeout_ms = 10000};
	struct kvp_client *c = NULL;
	struct batch_state {
		int32_t ids[B][16], rev[B][16];
		uint8_t hashes[B][16 * 32];
		Kvpool__V1__BatchCall calls[B * 6], *ptrs[B * 6];
		Kvpool__V1__CacheRequest cache[B];
		Kvpool__V1__FreeRequest fr1[B], fr2[B];
		Kvpool__V1__LookupRequest lk[B];
		Kvpool__V1__TouchRequest tc[B];
	} *bs = malloc(sizeof(*bs));
	int32_t(*ids)[16] = bs ? bs->ids : NULL, (*rev)[16] = bs ? bs->rev : NULL;
	uint8_t(*hashes)[16 * 32] = bs ? bs->hashes : NULL;
	Kvpool__V1__BatchCall *calls = bs ? bs->calls : NULL, **ptrs = bs ? bs->ptrs : NULL;
	Kvpool__V1__CacheRequest *cache = bs ? bs->cache : NULL;
	Kvpool__V1__FreeRequest *fr1 = bs ? bs->fr1 : NULL, *fr2 = bs ? bs->fr2 : NULL;
	Kvpool__V1__LookupRequest *lk = bs ? bs->lk : NULL;
	Kvpool__V1__TouchRequest *tc = bs ? bs->tc : NULL;
	Kvpool__V1__AllocateRequest al = KVPOOL__V1__ALLOCATE_REQUEST__INIT;
	uint64_t cycle = 0, call_id = 1;
	uint8_t *buf = malloc(1 << 20);

	if (bs == NULL || buf == NULL || kvp_client_open(&o, &c) != KVP_OK) {
		j->failed = 1;
		free(buf);
		free(bs);
		return;
	}
	uint64_t sid = kvp_client_info(c)->session_id;
	al.num_blocks = 16;
	for (int i = 0; i < B; i++) /* the first batch's blocks */
		if (kvp_client_allocate(c, 16, ids[i]) != KVP_OK)
			j->failed = 1;
	double end = now() + seconds;
	while (now() < end && !j->failed) {
		size_t n = 0;
		for (int i = 0; i < B; i++) {
			fill_hashes(hashes[i], j->index, cycle++);
			memcpy(rev[i], ids[i], sizeof(ids[i]));
			rev16(rev[i]);
			kvpool__v1__cache_request__init(&cache[i]);
			cache[i].block_ids = ids[i];
			cache[i].n_block_ids = 16;
			cache[i].num_full_blocks = 16;
			cache[i].block_hashes.data = hashes[i];
			cache[i].block_hashes.len = 16 * 32;
			kvpool__v1__free_request__init(&fr1[i]);
			fr1[i].block_ids = rev[i];
			fr1[i].n_block_ids = 16;
			kvpool__v1__lookup_request__init(&lk[i]);
			lk[i].block_hashes = cache[i].block_hashes;
			kvpool__v1__touch_request__init(&tc[i]);
			tc[i].block_ids = ids[i];
			tc[i].n_block_ids = 16;
			fr2[i] = fr1[i];
			for (int k = 0; k < 6; k++) {
				kvpool__v1__batch_call__init(&calls[n + k]);
				ptrs[n + k] = &calls[n + k];
			}
			calls[n].call_case = KVPOOL__V1__BATCH_CALL__CALL_CACHE;
			calls[n++].cache = &cache[i];
			calls[n].call_case = KVPOOL__V1__BATCH_CALL__CALL_FREE;
			calls[n++].free = &fr1[i];
			calls[n].call_case = KVPOOL__V1__BATCH_CALL__CALL_LOOKUP;
			calls[n++].lookup = &lk[i];
			calls[n].call_case = KVPOOL__V1__BATCH_CALL__CALL_TOUCH;
			calls[n++].touch = &tc[i];
			calls[n].call_case = KVPOOL__V1__BATCH_CALL__CALL_FREE;
			calls[n++].free = &fr2[i];
			calls[n].call_case = KVPOOL__V1__BATCH_CALL__CALL_ALLOCATE;
			calls[n++].allocate = &al;
		}
		Kvpool__V1__BatchRequest br = KVPOOL__V1__BATCH_REQUEST__INIT;
		br.calls = ptrs;
		br.n_calls = n;
		Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
		rq.pool = "bench";
		rq.session_id = sid;
		rq.call_id = call_id++;
		rq.call_case = KVPOOL__V1__REQUEST__CALL_BATCH;
		rq.batch = &br;
		size_t len = kvpool__v1__request__pack(&rq, buf);
		uint8_t *reply = NULL;
		size_t rlen = 0;
		double t0 = now();
		if (kvp_client_raw(c, buf, len, &reply, &rlen) != KVP_OK) {
			j->failed = 1;
			break;
		}
		Kvpool__V1__Reply *r = kvpool__v1__reply__unpack(NULL, rlen, reply);
		free(reply);
		record(j, now() - t0);
		if (r == NULL || r->status != 0 || r->batch->n_replies != n) {
			fprintf(stderr, "batch failed: %s\n", r ? r->detail : "undecodable");
			j->failed = 1;
			kvpool__v1__reply__free_unpacked(r, NULL);
			break;
		}
		for (int i = 0; i < B; i++)
			memcpy(ids[i], r->batch->replies[i * 6 + 5]->allocate->block_ids, sizeof(ids[i]));
		kvpool__v1__reply__free_unpacked(r, NULL);
		j->ops++;
		j->units += B;
	}
	for (int i = 0; i < B; i++)
		(void)kvp_client_free(c, ids[i], 16);
	free(buf);
	free(bs);
	kvp_client_close(c);
}

static void *
thread_main(void *arg)
{
	struct job *j = arg;
	if (j->kind == RAW)
		run_raw(j);
	else if (j->kind == CYCLE_BATCH)
		run_batch(j);
	else
		run_calls(j);
	return NULL;
}

struct result {
	double units_per_s, p50_us, p99_us;
	int failed;
};

static struct result
measure(enum kind kind, const char *url, int clients)
{
	pthread_t th[MAX_CLIENTS];
	struct job jobs[MAX_CLIENTS];
	struct result r = {0};
	size_t total = 0;

	memset(jobs, 0, sizeof(jobs));
	double t0 = now();
	for (int i = 0; i < clients; i++) {
		jobs[i].kind = kind;
		jobs[i].url = url;
		jobs[i].index = i;
		pthread_create(&th[i], NULL, thread_main, &jobs[i]);
	}
	for (int i = 0; i < clients; i++)
		pthread_join(th[i], NULL);
	double dt = now() - t0;
	long units = 0;
	for (int i = 0; i < clients; i++) {
		units += jobs[i].units;
		total += jobs[i].nlat;
		r.failed |= jobs[i].failed;
	}
	double *all = malloc((total ? total : 1) * sizeof(*all));
	size_t k = 0;
	for (int i = 0; i < clients; i++) {
		memcpy(all + k, jobs[i].lat, jobs[i].nlat * sizeof(*all));
		k += jobs[i].nlat;
		free(jobs[i].lat);
	}
	qsort(all, total, sizeof(*all), cmp_d);
	r.units_per_s = (double)units / dt;
	r.p50_us = total ? all[total / 2] * 1e6 : 0;
	r.p99_us = total ? all[total * 99 / 100] * 1e6 : 0;
	free(all);
	return r;
}

/* ---- the raw echo server ---- */

struct echo {
	nng_socket sock;
	nng_ctx ctx[MAX_CLIENTS];
	nng_aio *aio[MAX_CLIENTS];
	int state[MAX_CLIENTS];
};
static struct echo echo;

static void
echo_cb(void *arg)
{
	int i = (int)(intptr_t)arg;
	if (nng_aio_result(echo.aio[i]) != 0)
		return;
	if (echo.state[i] == 0) {
		echo.state[i] = 1;
		nng_ctx_send(echo.ctx[i], echo.aio[i]); /* the received message, back */
	} else {
		echo.state[i] = 0;
		nng_ctx_recv(echo.ctx[i], echo.aio[i]);
	}
}

static int
echo_start(void)
{
	if (nng_rep0_open(&echo.sock) != 0 || nng_listen(echo.sock, echo_ipc, NULL, 0) != 0 ||
	    nng_listen(echo.sock, echo_tcp, NULL, 0) != 0)
		return -1;
	for (int i = 0; i < MAX_CLIENTS; i++) {
		if (nng_aio_alloc(&echo.aio[i], echo_cb, (void *)(intptr_t)i) != 0 ||
		    nng_ctx_open(&echo.ctx[i], echo.sock) != 0)
			return -1;
		nng_ctx_recv(echo.ctx[i], echo.aio[i]);
	}
	return 0;
}

/*
 * The engine's loop (b) in this process on a pool like the daemon's (the
 * same cycle the request-cycle rows send): cycles/s, or 0 if the pool
 * cannot be made. The baseline the batched cycle is set against.
 */
static double
engine_b_rate(double secs)
{
	struct kvp_pool_config cfg = {.num_blocks = 100000, .hash_block_size = 16,
	                              .enable_caching = true};
	struct kvp_pool *p;
	struct bstate st;
	long n = 0;

	if (kvp_pool_create(&cfg, &p) != KVP_OK)
		return 0;
	warm_b(&st, p, 100000);
	double t0 = now(), t;
	do {
		for (int i = 0; i < 1000; i++)
			cycle_b(&st, true);
		n += 1000;
	} while ((t = now() - t0) < secs);
	kvp_pool_destroy(p);
	return (double)n / t;
}

int
main(int argc, char **argv)
{
	const char *daemon = KVPOOLD_PATH;
	int only_batch = 0;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--quick") == 0)
			seconds = 0.2;
		else if (strcmp(argv[i], "--only-batch") == 0)
			only_batch = 1, seconds = 3.0; /* one row, for a profiler */
		else
			daemon = bench_daemon_arg("kvp-bench-service", "[--quick] [--only-batch] [KVPOOLD]", argv[i]);
	}
	int pid = (int)getpid();
	snprintf(ipc_url, sizeof(ipc_url), "ipc:///tmp/kvpool-bench-%d.ipc", pid);
	snprintf(tcp_url, sizeof(tcp_url), "tcp://127.0.0.1:%d", bench_tcp_port(0));
	snprintf(echo_ipc, sizeof(echo_ipc), "ipc:///tmp/kvpool-bench-echo-%d.ipc", pid);
	snprintf(echo_tcp, sizeof(echo_tcp), "tcp://127.0.0.1:%d", bench_tcp_port(1));

	/* fork+exec before the first nng call: nng is not fork-safe. */
	const char *dargv[] = {daemon, "--quiet", "--rpc", ipc_url, "--rpc", tcp_url, "--admin",
	                       "none", "--events", "none", "--pool",
	                       "name=bench,blocks=100000,block_size=16", "--contexts", "8",
	                       "--lease-ms", "60000", NULL};
	pid_t child = kvp_spawn(dargv, NULL);
	if (echo_start() != 0) {
		fprintf(stderr, "bench: cannot start the echo server\n");
		kill(child, SIGTERM);
		return 1;
	}
	nanosleep(&(struct timespec){0, 300000000}, NULL);

	printf("kvp-bench-service: %.1f s per row; pool of 100,000 blocks, block size 16; "
	       "latency per round trip\n\n", seconds);
	double eng_b = engine_b_rate(seconds);
	printf("engine loop (b) in this process, this run: %.0f cycles/s (the batched cycle's "
	       "baseline; aim: a quarter)\n\n", eng_b);
	printf("| transport | clients | workload | rate | p50 | p99 | p50 / raw p50 |\n");
	printf("|---|---|---|---|---|---|---|\n");
	const char *names[] = {"raw nng REQ/REP, 64 B (baseline)", "Stats", "Allocate(16) + Free",
	                       "request cycle, one call per round trip",
	                       "request cycle, Batches of 64 cycles"};
	const char *units[] = {"round trips/s", "calls/s", "calls/s", "cycles/s", "cycles/s"};
	int failed = 0;
	if (only_batch) {
		struct result r = measure(CYCLE_BATCH, ipc_url, 1);
		printf("ipc, 1 client, batches: %.0f cycles/s (%.3f of engine (b)), p50 %.0f us\n",
		       r.units_per_s, eng_b > 0 ? r.units_per_s / eng_b : 0, r.p50_us);
		failed = r.failed;
	}
	for (int t = 0; t < 2 && !only_batch; t++) {
		const char *url = t ? tcp_url : ipc_url, *eurl = t ? echo_tcp : echo_ipc;
		for (int clients = 1; clients <= 8; clients += 7) {
			struct result raw = measure(RAW, eurl, clients);
			for (int k = RAW; k <= CYCLE_BATCH; k++) {
				struct result r = k == RAW ? raw : measure((enum kind)k, url, clients);
				failed |= r.failed;
				char extra[96] = "";
				if (k == CYCLE)
					snprintf(extra, sizeof(extra), " (%.1fx vLLM)",
					         r.units_per_s / VLLM_B_CYCLES_PER_S);
				else if (k == CYCLE_BATCH)
					snprintf(extra, sizeof(extra), " (%.1fx vLLM, %.3f of engine (b))",
					         r.units_per_s / VLLM_B_CYCLES_PER_S,
					         eng_b > 0 ? r.units_per_s / eng_b : 0);
				printf("| %s | %d | %s | %.0f %s%s | %.0f us | %.0f us | %.2f |\n",
				       t ? "tcp" : "ipc", clients, names[k], r.units_per_s, units[k], extra,
				       r.p50_us, r.p99_us, raw.p50_us > 0 ? r.p50_us / raw.p50_us : 0);
			}
		}
	}
	int status = kvp_reap(child, 10000);
	nng_close(echo.sock);
	if (failed || status != 0) {
		fprintf(stderr, "bench: a call failed or the daemon did not stop cleanly\n");
		return 1;
	}
	return 0;
}
