/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvp-bench-samehost: a same-host call against its floor (issue #63).
 *
 *   shm:   Stats through the C client over the same-host channel
 *          (common/shm_chan.h) of a kvpoold on ipc://
 *   ipc:   the same calls over nng ipc (KVPOOL_SHM=0), today's path
 *   floor: a raw futex ping-pong of as many bytes between two processes
 *          (a forked echo over a shared memfd, the channel's own protocol:
 *          the same spin, the same futex calls), nothing decoded
 *
 * Medians of 5 interleaved passes of N calls each (--quick: fewer).
 * Prints µs per call and the ratios; KVP_BENCH_JSON: area "samehost".
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../spawn.h"
#include "bench_util.h"
#include "clients/c/kvpool.h"
#include "common/shm_chan.h"

enum { REPS = 5, AREA = 1 << 16 };

static int
cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* The floor's other process: answers each request with rep_bytes (its first bytes echoed). */
static void
echo_main(unsigned char *map, size_t rep_bytes)
{
	struct kvp_chan_hdr *h = (struct kvp_chan_hdr *)map;
	uint32_t seen = 0;
	for (;;) {
		uint32_t now = atomic_load(&h->req_seq);
		for (int i = 0; now == seen && i < KVP_CHAN_SPIN; i++) {
			kvp_cpu_relax();
			now = atomic_load(&h->req_seq);
		}
		if (now == seen) {
			(void)kvp_futex_wait(&h->req_seq, seen, 100);
			continue;
		}
		seen = now;
		uint32_t len = atomic_load(&h->req_len);
		memcpy(kvp_chan_rep(map, AREA), kvp_chan_req(map), len < rep_bytes ? len : rep_bytes);
		atomic_store(&h->rep_len, (uint32_t)rep_bytes);
		atomic_store(&h->rep_seq, seen);
		kvp_futex_wake(&h->rep_seq);
	}
}

/* n ping-pongs of req_bytes out and rep_bytes back: seconds. */
static double
floor_pass(unsigned char *map, uint32_t *seq, int n, size_t req_bytes, size_t rep_bytes)
{
	struct kvp_chan_hdr *h = (struct kvp_chan_hdr *)map;
	static unsigned char out[AREA];
	double t0 = now();
	for (int k = 0; k < n; k++) {
		uint32_t s = ++*seq;
		memcpy(kvp_chan_req(map), out, req_bytes);
		atomic_store(&h->req_len, (uint32_t)req_bytes);
		atomic_store(&h->req_seq, s);
		kvp_futex_wake(&h->req_seq);
		uint32_t got = atomic_load(&h->rep_seq);
		for (int i = 0; got != s && i < KVP_CHAN_SPIN; i++) {
			kvp_cpu_relax();
			got = atomic_load(&h->rep_seq);
		}
		while (got != s) {
			(void)kvp_futex_wait(&h->rep_seq, got, 100);
			got = atomic_load(&h->rep_seq);
		}
		memcpy(out, kvp_chan_rep(map, AREA), rep_bytes);
	}
	return now() - t0;
}

static double
stats_pass(struct kvp_client *c, int n)
{
	struct kvp_client_stats st;
	double t0 = now();
	for (int k = 0; k < n; k++)
		if (kvp_client_stats(c, &st) != KVP_OK)
			return -1;
	return now() - t0;
}

int
main(int argc, char **argv)
{
	int n = 20000;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--quick") == 0)
			n = 2000;
		else {
			fprintf(stderr, "usage: kvp-bench-samehost [--quick]\n");
			return 2;
		}
	}
	/* The floor's echo first: forked before this process starts nng's threads. */
	size_t map_len = KVP_CHAN_HDR + 2 * (size_t)AREA;
	unsigned char *map = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
	                          -1, 0);
	if (map == MAP_FAILED)
		return 1;
	/*
	 * The floor's bytes: a Stats request with its envelope is shorter than
	 * 64 (a token makes it longer), its reply about 256.
	 */
	const size_t req_bytes = 64, rep_bytes = 256;
	int pfd[2];
	if (pipe(pfd) != 0)
		return 1;
	pid_t echo = fork();
	if (echo == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		size_t sz[2];
		close(pfd[1]);
		if (read(pfd[0], sz, sizeof(sz)) != (ssize_t)sizeof(sz))
			_exit(1);
		echo_main(map, sz[1]);
		_exit(0);
	}
	close(pfd[0]);

	char url[128];
	snprintf(url, sizeof(url), "ipc:///tmp/kvp-bench-samehost-%d.ipc", (int)getpid());
	const char *dargv[] = {KVPOOLD_PATH, "--quiet", "--rpc", url, "--admin", "none",
	                       "--events", "none", "--pool", "name=default,blocks=1024", NULL};
	pid_t d = kvp_spawn(dargv, NULL);
	struct kvp_client *shm = NULL, *ipc = NULL;
	struct kvp_client_options o = {.url = url, .timeout_ms = 10000, .connect_timeout_ms = 10000};
	int status = 1;
	if (kvp_client_open(&o, &shm) != KVP_OK) {
		fprintf(stderr, "kvp-bench-samehost: no daemon: %s\n", kvp_client_open_detail());
		goto out;
	}
	setenv("KVPOOL_SHM", "0", 1);
	if (kvp_client_open(&o, &ipc) != KVP_OK)
		goto out;
	unsetenv("KVPOOL_SHM");
	size_t sz[2] = {req_bytes, rep_bytes};
	if (write(pfd[1], sz, sizeof(sz)) != (ssize_t)sizeof(sz))
		goto out;
	double ts[REPS], ti[REPS], tf[REPS];
	uint32_t seq = 0;
	for (int k = 0; k < REPS; k++) {
		if ((ts[k] = stats_pass(shm, n)) < 0 || (ti[k] = stats_pass(ipc, n)) < 0) {
			fprintf(stderr, "kvp-bench-samehost: a call failed\n");
			goto out;
		}
		tf[k] = floor_pass(map, &seq, n, req_bytes, rep_bytes);
		printf("# pass %d: shm %.2f us, ipc %.2f us, futex floor %.2f us\n", k + 1,
		       ts[k] / n * 1e6, ti[k] / n * 1e6, tf[k] / n * 1e6);
	}
	qsort(ts, REPS, sizeof(double), cmp_double);
	qsort(ti, REPS, sizeof(double), cmp_double);
	qsort(tf, REPS, sizeof(double), cmp_double);
	double us_s = ts[REPS / 2] / n * 1e6, us_i = ti[REPS / 2] / n * 1e6,
	       us_f = tf[REPS / 2] / n * 1e6;
	printf("stats shm %.2f us ipc %.2f us floor %.2f us: shm/floor %.2fx, ipc/floor %.2fx\n",
	       us_s, us_i, us_f, us_s / us_f, us_i / us_f);
	bench_json("samehost", "Stats through the same-host channel (C client)", us_s, "µs",
	           "raw futex ping-pong of 64 bytes out, 256 back, two processes", us_f, "lower");
	bench_json("samehost", "Stats over nng ipc (C client, KVPOOL_SHM=0)", us_i, "µs",
	           "raw futex ping-pong of 64 bytes out, 256 back, two processes", us_f, "lower");
	status = 0;
out:
	kvp_client_close(shm);
	kvp_client_close(ipc);
	if (d > 0)
		kvp_reap(d, 30000);
	kill(echo, SIGKILL);
	waitpid(echo, NULL, 0);
	munmap(map, map_len);
	return status;
}
