/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvp-bench-service: kvpoold's calls over real sockets, beside raw nng
 * REQ/REP round trips of a small message measured in the same run (an
 * in-process REP echo on the same transport), so the ratio is our overhead.
 * The batched cycle also has, in the same run, the daemon's handler alone
 * in this process and a raw round trip carrying its Batch's bytes out and
 * its reply's bytes back: the two costs a remote Batch cannot avoid.
 *
 * usage: kvp-bench-service [--quick | --only-batch[=CLIENTS] | --only-core] [--pin C,D]
 *                          [PATH_TO_KVPOOLD]
 *   --only-batch  the batched cycle alone over ipc://, 3 s, for a profiler,
 *                 from 1 client (or CLIENTS, 1 to 8)
 *   --only-core   the batched cycle handed to the daemon's handler in this
 *                 process (no daemon, no sockets), beside engine loop (b)
 *   --pin C,D     this process (its clients, its in-process echo, engine
 *                 loop (b)) on CPU C, kvpoold on CPU D, as kvp-bench-step --pin
 *                 places them; the raw rows' echo stays in this process, and
 *                 three more rows send a Batch's bytes to kvp-bench-echo on
 *                 CPU D, served as kvpoold serves: idle (nng's own cost), and
 *                 busy for engine (b)'s and for the handler's time per Batch
 *                 (the rates a daemon whose only costs beyond nng were those
 *                 would reach)
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
#include "bench_raw.h"
#include "bench_cycle_batch.h"
#include "bench_util.h"
#include <unistd.h>

#include "clients/c/kvpool.h"
#include "common/crc32c.h"
#include "kvpool.pb-c.h"
#include "service/config/config.h"
#include "service/pool/server.h"

#define MAX_CLIENTS 8

static double seconds = 1.0;
static char ipc_url[128], tcp_url[128], echo_ipc[128], echo_tcp[128], echo_placed[128];

/* ---- one measurement: N threads each running an operation until time is up ---- */

enum kind { RAW, STATS, ALLOC_FREE, CYCLE, CYCLE_BATCH, RAW_BATCH };

/*
 * The batched cycle's request and reply sizes, from the in-process handler:
 * RAW_BATCH sends that many bytes to the echo server, which replies with
 * the size the request names (echo_cb).
 */
static size_t batch_req_len, batch_rep_len;
/* In process, per Batch: the daemon's handler, and the client's packing and reply reading. */
static double core_batch_us, core_rate, client_batch_us;

struct job {
	enum kind kind;
	const char *url;
	int index;
	double spin_us;    /* RAW_BATCH: how long kvp-bench-echo works before each reply */
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
	char small[64] = {0}, *msg = small;
	size_t len = sizeof(small);
	uint64_t echo64[2] = {sizeof(small), 0}; /* 64 B back, at once */

	memcpy(small, echo64, sizeof(echo64));
	if (j->kind == RAW_BATCH) { /* the Batch's bytes, led by kvp-bench-echo's header */
		uint64_t hdr[2] = {batch_rep_len, (uint64_t)(j->spin_us * 1e3)};
		len = batch_req_len > BENCH_ECHO_HDR ? batch_req_len : BENCH_ECHO_HDR;
		if ((msg = calloc(1, len)) == NULL) {
			j->failed = 1;
			return;
		}
		memcpy(msg, hdr, sizeof(hdr)); /* little-endian hosts only, as the echoes read it */
	}
	if (nng_req0_open(&s) != 0 || nng_dial(s, j->url, NULL, 0) != 0) {
		j->failed = 1;
		if (msg != small)
			free(msg);
		return;
	}
	double end = now() + seconds;
	while (now() < end) {
		void *buf = NULL;
		size_t rlen = 0;
		double t0 = now();
		if (nng_send(s, msg, len, 0) != 0 ||
		    nng_recv(s, &buf, &rlen, NNG_FLAG_ALLOC) != 0) {
			j->failed = 1;
			break;
		}
		nng_free(buf, rlen);
		record(j, now() - t0);
		j->ops++;
		j->units += j->kind == RAW_BATCH ? CB_CYCLES : 1;
	}
	nng_close(s);
	if (msg != small)
		free(msg);
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
			cyc_fill_hashes(h, j->index, cycle++);
			TIMED(j, kvp_client_allocate(c, 16, ids));
			struct kvp_client_cache ca = {.block_ids = ids, .num_block_ids = 16,
			                              .num_full_blocks = 16, .hashes = h,
			                              .num_hashes = 16};
			TIMED(j, kvp_client_cache(c, &ca, NULL));
			memcpy(rev, ids, sizeof(ids));
			bench_rev16(rev);
			TIMED(j, kvp_client_free(c, rev, 16));
			struct kvp_client_lookup q = {.hashes = h, .num_hashes = 16};
			TIMED(j, kvp_client_lookup(c, &q, hits, 16, &nh, &ht));
			TIMED(j, kvp_client_touch(c, hits, nh));
			memcpy(rev, hits, nh * sizeof(*hits));
			if (nh == 16)
				bench_rev16(rev);
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

/* Loop (b) in Batches of 64 cycles per round trip (bench_cycle_batch.h). */
static void
run_batch(struct job *j)
{
	struct kvp_client_options o = {.url = j->url, .pool = "bench", .timeout_ms = 10000};
	struct kvp_client *c = NULL;
	struct cyc_batch *cb = cyc_batch_new(j->index);
	uint8_t *buf = malloc(cyc_batch_max_len());
	uint64_t call_id = 1;

	if (cb == NULL || buf == NULL || kvp_client_open(&o, &c) != KVP_OK) {
		j->failed = 1;
		goto out;
	}
	uint64_t sid = kvp_client_info(c)->session_id;
	for (int i = 0; i < CB_CYCLES; i++) /* the first batch's blocks */
		if (kvp_client_allocate(c, 16, cyc_batch_ids(cb, i)) != KVP_OK)
			j->failed = 1;
	double end = now() + seconds;
	while (now() < end && !j->failed) {
		size_t len = cyc_batch_pack(cb, "bench", sid, call_id++, buf);
		uint8_t *reply = NULL;
		size_t rlen = 0;
		double t0 = now();
		if (kvp_client_raw(c, buf, len, &reply, &rlen) != KVP_OK) {
			j->failed = 1;
			break;
		}
		int rv = cyc_batch_take(cb, reply, rlen);
		free(reply);
		record(j, now() - t0);
		if (rv != 0) {
			j->failed = 1;
			break;
		}
		j->ops++;
		j->units += CB_CYCLES;
	}
	for (int i = 0; i < CB_CYCLES && c != NULL; i++)
		(void)kvp_client_free(c, cyc_batch_ids(cb, i), 16);
out:
	free(buf);
	cyc_batch_free(cb);
	kvp_client_close(c);
}

static void *
thread_main(void *arg)
{
	struct job *j = arg;
	if (j->kind == RAW || j->kind == RAW_BATCH)
		run_raw(j);
	else if (j->kind == CYCLE_BATCH)
		run_batch(j);
	else
		run_calls(j);
	return NULL;
}

struct result {
	double units_per_s, p50_us, p99_us;
	double daemon_cpu_us, self_cpu_us; /* per round trip: kvpoold's, and this process's */
	int failed;
};

static pid_t daemon_pid;

/* server: the process whose CPU the row reports (kvpoold, or kvp-bench-echo). */
static struct result
measure_on(enum kind kind, const char *url, int clients, double spin_us, pid_t server)
{
	pthread_t th[MAX_CLIENTS];
	struct job jobs[MAX_CLIENTS];
	struct result r = {0};
	size_t total = 0;

	memset(jobs, 0, sizeof(jobs));
	double d0 = server > 0 ? proc_cpu(server) : 0, c0 = cpu_now();
	double t0 = now();
	for (int i = 0; i < clients; i++) {
		jobs[i].spin_us = spin_us;
		jobs[i].kind = kind;
		jobs[i].url = url;
		jobs[i].index = i;
		pthread_create(&th[i], NULL, thread_main, &jobs[i]);
	}
	for (int i = 0; i < clients; i++)
		pthread_join(th[i], NULL);
	double dt = now() - t0;
	double d1 = server > 0 ? proc_cpu(server) : 0, c1 = cpu_now();
	long units = 0, ops = 0;
	for (int i = 0; i < clients; i++) {
		units += jobs[i].units;
		ops += jobs[i].ops;
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
	r.daemon_cpu_us = ops ? (d1 - d0) / (double)ops * 1e6 : 0;
	r.self_cpu_us = ops ? (c1 - c0) / (double)ops * 1e6 : 0;
	r.p50_us = total ? all[total / 2] * 1e6 : 0;
	r.p99_us = total ? all[total * 99 / 100] * 1e6 : 0;
	free(all);
	return r;
}

static struct result
measure(enum kind kind, const char *url, int clients)
{
	return measure_on(kind, url, clients, 0, daemon_pid);
}

/*
 * --pin's floor rows: a Batch's bytes each way to kvp-bench-echo (echo_pid,
 * on kvpoold's CPU), idle; busy for the engine's own time for 64 cycles (a
 * daemon with no cost beyond the engine's and nng's); and busy for the
 * handler's time in process. Nonzero if a round trip failed.
 */
static int
placed_rows(pid_t echo_pid, int clients, double eng_b, double raw_p50, struct result kvpoold)
{
	int failed = 0;
	char ours[160], note[320];
	snprintf(ours, sizeof(ours), "kvpoold, Batches of 64 request cycles, ipc, %d clients",
	         clients);
	snprintf(note, sizeof(note), "kvpoold's CPU per Batch: %.0f µs. kvp-bench-echo serves a "
	         "Batch's bytes as kvpoold serves them (a REP socket, eight contexts), on kvpoold's "
	         "CPU, idle or busy for a given CPU time per Batch: what nng leaves a daemon.",
	         kvpoold.daemon_cpu_us);
	bench_note("floors", note);
	bench_json("floors", ours, kvpoold.units_per_s, "cycles/s",
	           "engine loop (b) in this process (no service at all)", eng_b, "higher");
	char base[160];
	snprintf(base, sizeof(base), "the daemon's handler alone, in this process (%.0f µs per "
	         "Batch)", core_batch_us);
	bench_json("floors", ours, kvpoold.units_per_s, "cycles/s", base, core_rate, "higher");
	for (int busy = 0; busy < 3; busy++) {
		double spin = busy == 0 ? 0 : busy == 1 ? (eng_b > 0 ? CB_CYCLES * 1e6 / eng_b : 0)
		                                        : core_batch_us;
		struct result r = measure_on(RAW_BATCH, echo_placed, clients, spin, echo_pid);
		char what[128];
		snprintf(what, sizeof(what), busy == 0 ? "raw nng, a Batch's bytes each way, to "
		                                         "kvp-bench-echo beside kvpoold (floor)"
		                             : busy == 1 ? "the same, the echo busy %.0f us of CPU per "
		                                           "Batch (engine (b)'s time for its cycles)"
		                                         : "the same, the echo busy %.0f us of CPU per "
		                                           "Batch (the handler's time in process)",
		         spin);
		char vs_raw[32] = "-"; /* --only-batch measures no 64 B round trip */
		if (raw_p50 > 0)
			snprintf(vs_raw, sizeof(vs_raw), "%.2f", r.p50_us / raw_p50);
		printf("| ipc | %d | %s | %.0f cycles/s (%.3f of engine (b); echo CPU per Batch %.0f "
		       "us) | %.0f us | %.0f us | %s |\n", clients, what, r.units_per_s,
		       eng_b > 0 ? r.units_per_s / eng_b : 0, r.daemon_cpu_us, r.p50_us, r.p99_us,
		       vs_raw);
		failed |= r.failed;
		snprintf(base, sizeof(base), busy == 0 ? "kvp-bench-echo on kvpoold's CPU, idle: a "
		                                         "Batch's bytes each way (%.0f µs per Batch)"
		                             : "kvp-bench-echo on kvpoold's CPU, busy %.0f µs per Batch "
		                               "(%s)",
		         busy == 0 ? r.daemon_cpu_us : spin,
		         busy == 1 ? "engine (b)'s time for 64 cycles" : "the handler's time");
		bench_json("floors", ours, kvpoold.units_per_s, "cycles/s", base, r.units_per_s,
		           "higher");
	}
	return failed;
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
		nng_msg *m = nng_aio_get_msg(echo.aio[i]);
		uint64_t want;
		/* The received message, back; resized to what a RAW_BATCH request names. */
		if (nng_msg_len(m) >= BENCH_ECHO_HDR) {
			memcpy(&want, nng_msg_body(m), sizeof(want));
			(void)nng_msg_realloc(m, want > BENCH_ECHO_MAX ? BENCH_ECHO_MAX : want);
		}
		echo.state[i] = 1;
		nng_ctx_send(echo.ctx[i], echo.aio[i]);
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

/*
 * The batched cycle handed to the daemon's handler in this process: the
 * daemon's own work per cycle (decode, calls, encode) without the transport,
 * on a server configured like the spawned daemon. Cycles/s, or 0 on failure.
 * Under callgrind, --toggle-collect=kvpd_server_handle counts its instructions.
 */
static double
core_b_rate(double secs, long *cycles)
{
	char *argv[] = {"kvpoold", "--quiet", "--executor", "none", "--admin", "none", "--events",
	                "none", "--pool", "name=bench,blocks=100000,block_size=16", "--lease-ms",
	                "600000", NULL};
	struct kvpd_config cfg;
	struct kvpd_server *srv = NULL;
	struct cyc_batch *cb = cyc_batch_new(0);
	uint8_t *buf = malloc(cyc_batch_max_len()), *rep = NULL;
	size_t rlen = 0;
	char err[256];
	double rate = 0, t0 = 0, t = 0;
	FILE *devnull = fopen("/dev/null", "w");
	int rv = devnull ? kvpd_config_load(&cfg, (int)(sizeof(argv) / sizeof(argv[0])) - 1, argv,
	                                    NULL, devnull, devnull)
	                 : -1;
	if (devnull)
		fclose(devnull);
	(void)kvp_crc32c(0, (const uint8_t *)"", 0); /* its one-time tables, outside the count */
	if (rv != 0 || cb == NULL || buf == NULL ||
	    kvpd_server_create(&cfg, &srv, err, sizeof(err)) != KVP_OK)
		goto out;
	/* A session, and the first batch's blocks. */
	Kvpool__V1__HelloRequest hello = KVPOOL__V1__HELLO_REQUEST__INIT;
	Kvpool__V1__AllocateRequest al = KVPOOL__V1__ALLOCATE_REQUEST__INIT;
	Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
	Kvpool__V1__Reply *r = NULL;
	hello.protocol_version = 1;
	rq.pool = "bench";
	rq.call_case = KVPOOL__V1__REQUEST__CALL_HELLO;
	rq.hello = &hello;
	if (kvpd_server_handle(srv, buf, kvpool__v1__request__pack(&rq, buf), 1000, &rep, &rlen) !=
	        KVP_OK ||
	    (r = kvpool__v1__reply__unpack(NULL, rlen, rep)) == NULL || r->status != 0)
		goto out;
	rq.session_id = r->hello->session_id;
	kvpool__v1__reply__free_unpacked(r, NULL);
	al.num_blocks = 16;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_ALLOCATE;
	rq.allocate = &al;
	for (int i = 0; i < CB_CYCLES; i++) {
		free(rep);
		rep = NULL;
		rq.call_id = (uint64_t)i + 1;
		if (kvpd_server_handle(srv, buf, kvpool__v1__request__pack(&rq, buf), 1000, &rep,
		                       &rlen) != KVP_OK ||
		    (r = kvpool__v1__reply__unpack(NULL, rlen, rep)) == NULL)
			goto out;
		int ok = r->status == 0 && r->allocate->n_block_ids == 16;
		if (ok)
			memcpy(cyc_batch_ids(cb, i), r->allocate->block_ids, 16 * sizeof(int32_t));
		kvpool__v1__reply__free_unpacked(r, NULL);
		if (!ok)
			goto out;
	}
	/* Timed: the handler alone, over batches until secs have passed. */
	uint64_t call_id = CB_CYCLES + 1;
	double t_client = 0; /* the client's side: packing the Batch, reading its reply */
	do {
		double t2 = now();
		size_t len = cyc_batch_pack(cb, "bench", rq.session_id, call_id++, buf);
		t_client += now() - t2;
		free(rep);
		rep = NULL;
		double t1 = now();
		if (kvpd_server_handle(srv, buf, len, 1000, &rep, &rlen) != KVP_OK)
			goto out;
		t += now() - t1;
		batch_req_len = len;
		batch_rep_len = rlen;
		if (t0 == 0)
			t0 = t1;
		t2 = now();
		if (cyc_batch_take(cb, rep, rlen) != 0)
			goto out;
		t_client += now() - t2;
		*cycles += CB_CYCLES;
	} while (now() - t0 < secs);
	rate = (double)*cycles / t;
	client_batch_us = t_client * 1e6 / (double)(*cycles / CB_CYCLES);
	core_batch_us = t * 1e6 / (double)(*cycles / CB_CYCLES);
out:
	if (rate == 0)
		fprintf(stderr, "bench: core: %s\n", srv ? "a call failed" : err);
	free(rep);
	free(buf);
	cyc_batch_free(cb);
	kvpd_server_destroy(srv);
	return rate;
}

int
main(int argc, char **argv)
{
	const char *daemon = KVPOOLD_PATH;
	int only_batch = 0, only_core = 0, pin[2] = {-1, -1};
	const char *usage = "[--quick | --only-batch[=CLIENTS] | --only-core] [--pin C,D] [KVPOOLD]";
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--pin") == 0) {
			if (i + 1 >= argc || sscanf(argv[i + 1], "%d,%d", &pin[0], &pin[1]) != 2 ||
			    pin[0] < 0 || pin[1] < 0 || pin[0] >= 1024 || pin[1] >= 1024) {
				fprintf(stderr, "usage: kvp-bench-service %s\n", usage);
				return 2;
			}
			i++;
		} else if (strcmp(argv[i], "--quick") == 0)
			seconds = 0.2;
		else if (strcmp(argv[i], "--only-batch") == 0)
			only_batch = 1, seconds = 3.0; /* one row, for a profiler */
		else if (strncmp(argv[i], "--only-batch=", 13) == 0 && argv[i][13] >= '1' &&
		         argv[i][13] <= '8' && argv[i][14] == '\0')
			only_batch = argv[i][13] - '0', seconds = 3.0;
		else if (strcmp(argv[i], "--only-core") == 0)
			only_core = 1;
		else
			daemon = bench_daemon_arg("kvp-bench-service", usage, argv[i]);
	}
	/* Before any thread: nng's and the clients' inherit the CPU. */
	if (pin[0] >= 0 && bench_pin_self(pin[0]) != 0) {
		fprintf(stderr, "kvp-bench-service: cannot run on CPU %d\n", pin[0]);
		return 1;
	}
	if (only_core) { /* no daemon, no sockets: the engine and the handler, in process */
		long cycles = 0;
		double eng_b = engine_b_rate(1.0), core = core_b_rate(1.0, &cycles);
		printf("in process, this run: engine loop (b) %.0f cycles/s; the daemon's handler on "
		       "the batched cycle %.0f cycles/s (%ld cycles), %.3f of engine (b), %.0f us per "
		       "Batch; the client's packing and reply reading %.0f us per Batch\n",
		       eng_b, core, cycles, eng_b > 0 ? core / eng_b : 0, core_batch_us,
		       client_batch_us);
		return core > 0 && eng_b > 0 ? 0 : 1;
	}
	int pid = (int)getpid();
	snprintf(ipc_url, sizeof(ipc_url), "ipc:///tmp/kvpool-bench-%d.ipc", pid);
	snprintf(tcp_url, sizeof(tcp_url), "tcp://127.0.0.1:%d", bench_tcp_port(0));
	snprintf(echo_ipc, sizeof(echo_ipc), "ipc:///tmp/kvpool-bench-echo-%d.ipc", pid);
	snprintf(echo_tcp, sizeof(echo_tcp), "tcp://127.0.0.1:%d", bench_tcp_port(1));

	/* fork+exec before the first nng call: nng is not fork-safe. */
	char cpu[16];
	snprintf(cpu, sizeof(cpu), "%d", pin[1]);
	const char *dargv[] = {"/usr/bin/taskset", "-c", cpu, daemon, "--quiet", "--rpc", ipc_url,
	                       "--rpc", tcp_url, "--admin", "none", "--events", "none", "--pool",
	                       "name=bench,blocks=100000,block_size=16", "--contexts", "8",
	                       "--lease-ms", "60000", NULL};
	pid_t child = kvp_spawn(pin[1] >= 0 ? dargv : dargv + 3, NULL);
	daemon_pid = child;
	snprintf(echo_placed, sizeof(echo_placed), "ipc:///tmp/kvpool-bench-echop-%d.ipc", pid);
	pid_t echo_pid = pin[1] >= 0 ? bench_echo_start(ECHO_PATH, echo_placed, pin[1]) : -1;
	if (echo_start() != 0) {
		fprintf(stderr, "bench: cannot start the echo server\n");
		kill(child, SIGTERM);
		return 1;
	}
	nanosleep(&(struct timespec){0, 300000000}, NULL);

	printf("kvp-bench-service: %.1f s per row; pool of 100,000 blocks, block size 16; "
	       "latency per round trip\n", seconds);
	if (pin[0] >= 0)
		printf("placed: this process (clients, echo, engine) on CPU %d, kvpoold on CPU %d; "
		       "the raw rows' echo shares the clients' CPU, so placed they are no floor\n",
		       pin[0], pin[1]);
	printf("\n");
	double eng_b = engine_b_rate(seconds);
	long core_cycles = 0;
	double core = core_rate = core_b_rate(seconds, &core_cycles);
	printf("engine loop (b) in this process, this run: %.0f cycles/s (the batched cycle's "
	       "baseline; aim: a quarter)\n", eng_b);
	printf("the daemon's handler alone on the batched cycle, in this process: %.0f cycles/s, "
	       "%.3f of engine (b), %.0f us per Batch; a Batch is %zu B, its reply %zu B\n", core,
	       eng_b > 0 ? core / eng_b : 0, core_batch_us, batch_req_len, batch_rep_len);
	printf("the client's side alone (packing a Batch as libkvpool does, reading its reply), in "
	       "this process: %.0f us per Batch\n\n", client_batch_us);
	printf("| transport | clients | workload | rate | p50 | p99 | p50 / raw p50 |\n");
	printf("|---|---|---|---|---|---|---|\n");
	const char *names[] = {"raw nng REQ/REP, 64 B (baseline)", "Stats", "Allocate(16) + Free",
	                       "request cycle, one call per round trip",
	                       "request cycle, Batches of 64 cycles",
	                       "raw nng REQ/REP, a Batch's bytes each way (baseline)"};
	const char *units[] = {"round trips/s", "calls/s", "calls/s", "cycles/s", "cycles/s",
	                       "cycles/s"};
	int failed = 0;
	if (only_batch) {
		struct result r = measure(CYCLE_BATCH, ipc_url, only_batch);
		printf("ipc, %d client(s), batches: %.0f cycles/s (%.3f of engine (b)), p50 %.0f us, "
		       "kvpoold %.0f us of CPU per Batch\n", only_batch, r.units_per_s,
		       eng_b > 0 ? r.units_per_s / eng_b : 0, r.p50_us, r.daemon_cpu_us);
		failed = r.failed;
		if (echo_pid > 0)
			failed |= placed_rows(echo_pid, only_batch, eng_b, 0, r);
	}
	for (int t = 0; t < 2 && !only_batch; t++) {
		const char *url = t ? tcp_url : ipc_url, *eurl = t ? echo_tcp : echo_ipc;
		for (int clients = 1; clients <= 8; clients += 7) {
			struct result raw = measure(RAW, eurl, clients), batch = {0};
			for (int k = RAW; k <= RAW_BATCH; k++) {
				if (k == RAW_BATCH && batch_req_len == 0)
					continue;
				struct result r = k == RAW ? raw
				                           : measure((enum kind)k, k == RAW_BATCH ? eurl : url,
				                                     clients);
				failed |= r.failed;
				char extra[160] = "";
				if (k == CYCLE)
					snprintf(extra, sizeof(extra), " (%.3f of engine (b))",
					         eng_b > 0 ? r.units_per_s / eng_b : 0);
				else if (k == RAW_BATCH)
					snprintf(extra, sizeof(extra),
					         " (%.3f of engine (b); CPU per round trip %.0f us, both ends)",
					         eng_b > 0 ? r.units_per_s / eng_b : 0, r.self_cpu_us);
				else if (k == CYCLE_BATCH)
					snprintf(extra, sizeof(extra),
					         " (%.3f of engine (b); CPU per Batch: kvpoold %.0f "
					         "us, clients %.0f us)",
					         eng_b > 0 ? r.units_per_s / eng_b : 0, r.daemon_cpu_us,
					         r.self_cpu_us);
				printf("| %s | %d | %s | %.0f %s%s | %.0f us | %.0f us | %.2f |\n",
				       t ? "tcp" : "ipc", clients, names[k], r.units_per_s, units[k], extra,
				       r.p50_us, r.p99_us, raw.p50_us > 0 ? r.p50_us / raw.p50_us : 0);
				char row[160];
				snprintf(row, sizeof(row), "%s over %s, %d client%s: p50 round trip", names[k],
				         t ? "tcp" : "ipc", clients, clients > 1 ? "s" : "");
				if (k >= STATS && k <= CYCLE)
					bench_json("service", row, r.p50_us, "µs",
					           "raw nng REQ/REP of 64 B, same transport and clients",
					           raw.p50_us, "lower");
				if (k == CYCLE_BATCH)
					batch = r;
				if (k == RAW_BATCH) {
					snprintf(row, sizeof(row), "request cycle, Batches of 64 cycles, over %s, "
					         "%d client%s", t ? "tcp" : "ipc", clients, clients > 1 ? "s" : "");
					bench_json("service", row, batch.units_per_s, "cycles/s",
					           "raw nng REQ/REP of a Batch's bytes each way, same clients",
					           r.units_per_s, "higher");
				}
			}
			if (t == 0 && clients == 8 && echo_pid > 0 && batch_req_len > 0)
				failed |= placed_rows(echo_pid, clients, eng_b, raw.p50_us, batch);
		}
	}
	int status = kvp_reap(child, 10000);
	if (echo_pid > 0 && kvp_reap(echo_pid, 2000) != 0)
		failed = 1; /* it runs until SIGTERM, then ends with 0 */
	nng_close(echo.sock);
	if (failed || status != 0) {
		fprintf(stderr, "bench: a call failed or the daemon did not stop cleanly\n");
		return 1;
	}
	return 0;
}
