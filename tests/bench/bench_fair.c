/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvp-bench-fair: an honest client's latency beside busy neighbours (issue
 * #60 item 9). One kvpoold, one region pool (cpu executor, shared region);
 * the honest client looks up 4 stored keys (LookupAndLock) and unlocks
 * them every 2 ms over ipc, each lookup timed (and stores them again when
 * the others' stores evicted them). Three phases:
 *
 *   alone:    the honest client only (the baseline)
 *   region:   beside 50 connections, each its own client and session in
 *             another process, running region cycles back to back (Reserve
 *             64 fresh keys, Commit, LookupAndLock them, Unlock; --keys N):
 *             busy peers that read every reply, as a fleet of engines at
 *             full tilt
 *   stats:    beside the same 50 sending Stats back to back (the control:
 *             the cheapest call)
 *
 * Prints each phase's honest p50 and p99 and the ratio of each p99 to the
 * baseline's (the aim: within 3x). --quick: shorter phases. --peers N.
 * The attackers are this program again (--attack), so nothing forks after
 * nng has started threads.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../spawn.h"
#include "bench_util.h"
#include "clients/c/kvpool.h"

#define KL 36
#define KEYS 4
#define MAX_SAMPLES 20000

static atomic_bool stop;
static atomic_ulong attack_calls, attack_errors;

static void
mkkey(uint8_t *k, uint64_t g)
{
	uint64_t x = 0x9e3779b97f4a7c15ull * (g + 7);
	for (int j = 0; j < 32; j++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		k[j] = (uint8_t)x;
	}
	memset(k + 32, 0, 4);
}

static struct kvp_client *
open_client(const char *url)
{
	struct kvp_client_options o = {.url = url, .pool = "kv", .timeout_ms = 10000,
	                               .connect_timeout_ms = 10000};
	struct kvp_client *c = NULL;
	return kvp_client_open(&o, &c) == KVP_OK ? c : NULL;
}

struct attacker {
	const char *url;
	int id;
	bool stats;
	int keys; /* per region call */
};

/* One busy peer: region cycles (or Stats) back to back until the process is killed. */
static void *
attacker_main(void *arg)
{
	struct attacker *a = arg;
	struct kvp_client *c = open_client(a->url);
	const int nk = a->keys;
	uint8_t *keys = malloc((size_t)nk * KL);
	int32_t *rows = malloc((size_t)nk * sizeof(*rows));
	struct kvp_client_stats st;
	if (c == NULL || keys == NULL || rows == NULL) {
		atomic_fetch_add(&attack_errors, 1);
		kvp_client_close(c);
		free(keys);
		free(rows);
		return NULL;
	}
	for (uint64_t n = 0; !atomic_load(&stop); n++) {
		int rv;
		if (a->stats) {
			rv = kvp_client_stats(c, &st);
		} else {
			for (int i = 0; i < nk; i++)
				mkkey(keys + i * KL,
				      ((uint64_t)a->id << 40) + n * (uint64_t)nk + (uint64_t)i + 1000);
			if ((rv = kvp_client_reserve(c, keys, (size_t)nk, rows, NULL, NULL)) == KVP_OK &&
			    (rv = kvp_client_commit(c, keys, (size_t)nk, NULL, false)) == KVP_OK &&
			    (rv = kvp_client_lookup_lock(c, keys, (size_t)nk, false, rows, NULL, NULL,
			                                 NULL)) == KVP_OK)
				rv = kvp_client_unlock(c, keys, (size_t)nk);
		}
		atomic_fetch_add(rv == KVP_OK ? &attack_calls : &attack_errors, 1);
	}
	kvp_client_close(c);
	free(keys);
	free(rows);
	return NULL;
}

/* --attack URL N MODE: N busy peers until killed; prints "ready" once all are connected. */
static int
attack(const char *url, int n, bool stats, int keys)
{
	pthread_t th[512];
	struct attacker a[512];
	if (n < 1 || n > 512)
		return 2;
	for (int i = 0; i < n; i++) {
		a[i] = (struct attacker){.url = url, .id = i + 1, .stats = stats, .keys = keys};
		pthread_create(&th[i], NULL, attacker_main, &a[i]);
	}
	/* Ready once every peer has made a call. */
	for (int i = 0; i < 2000 && atomic_load(&attack_calls) < (unsigned long)n; i++)
		usleep(5000);
	printf("ready %lu\n", atomic_load(&attack_calls));
	fflush(stdout);
	for (;;)
		pause();
}

static int
cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return (x > y) - (x < y);
}

struct phase {
	const char *name;
	int keys;   /* the peers' region calls' keys */
	bool stats; /* the peers send Stats */
	uint32_t p50, p99, max, n;
};

/* The honest client for secs: a timed lookup of its keys and an unlock every 2 ms. */
static int
honest(struct kvp_client *c, double secs, struct phase *out)
{
	static uint32_t lat[MAX_SAMPLES];
	uint8_t keys[KEYS * KL];
	int32_t rows[KEYS];
	uint32_t n = 0;
	for (int i = 0; i < KEYS; i++)
		mkkey(keys + i * KL, (uint64_t)i);
	double end = now() + secs;
	while (now() < end && n < MAX_SAMPLES) {
		double t0 = now();
		if (kvp_client_lookup_lock(c, keys, KEYS, false, rows, NULL, NULL, NULL) != KVP_OK)
			return -1;
		double t1 = now();
		/* The peers' stores may have evicted them: stored again (untimed). */
		if (rows[0] <= 0 ? kvp_client_reserve(c, keys, KEYS, rows, NULL, NULL) != KVP_OK ||
		                       kvp_client_commit(c, keys, KEYS, NULL, false) != KVP_OK
		                 : kvp_client_unlock(c, keys, KEYS) != KVP_OK)
			return -1;
		lat[n++] = (uint32_t)((t1 - t0) * 1e6);
		double next = t0 + 0.002;
		while (now() < next)
			usleep(200);
	}
	qsort(lat, n, sizeof(*lat), cmp_u32);
	out->n = n;
	out->p50 = lat[n / 2];
	out->p99 = lat[(size_t)((double)n * 0.99)];
	out->max = lat[n - 1];
	return 0;
}

/* Starts the attackers (this program with --attack) and waits for their "ready". */
static pid_t
start_attackers(const char *self, const char *url, int peers, bool stats, int keys, FILE **out)
{
	int fds[2];
	char n[16], k[16];
	snprintf(n, sizeof(n), "%d", peers);
	snprintf(k, sizeof(k), "%d", keys);
	if (pipe(fds) != 0)
		return -1;
	pid_t pid = fork();
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		dup2(fds[1], 1);
		close(fds[0]);
		close(fds[1]);
		execl(self, self, "--attack", url, n, stats ? "stats" : "region", k, (char *)NULL);
		_exit(127);
	}
	close(fds[1]);
	*out = fdopen(fds[0], "r");
	char line[64];
	if (pid < 0 || *out == NULL || fgets(line, sizeof(line), *out) == NULL ||
	    strncmp(line, "ready", 5) != 0) {
		if (pid > 0)
			kill(pid, SIGKILL);
		return -1;
	}
	return pid;
}

int
main(int argc, char **argv)
{
	double secs = 8;
	int peers = 50;
	if (argc == 6 && strcmp(argv[1], "--attack") == 0)
		return attack(argv[2], atoi(argv[3]), strcmp(argv[4], "stats") == 0, atoi(argv[5]));
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--quick") == 0)
			secs = 2;
		else if (strcmp(argv[i], "--peers") == 0 && i + 1 < argc)
			peers = atoi(argv[++i]);
		else {
			fprintf(stderr, "usage: kvp-bench-fair [--quick] [--peers N]\n");
			return 2;
		}
	}
	if (peers < 1 || peers > 512) {
		fprintf(stderr, "kvp-bench-fair: --peers: 1 to 512\n");
		return 2;
	}
	char url[128], admin[64], self[4096];
	ssize_t sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (sl <= 0)
		return 1;
	self[sl] = '\0';
	snprintf(url, sizeof(url), "ipc:///tmp/kvp-bench-fair-%d.ipc", (int)getpid());
	snprintf(admin, sizeof(admin), "http://127.0.0.1:%d", bench_tcp_port(0));
	const char *dargv[] = {KVPOOLD_PATH, "--quiet", "--rpc", url, "--admin", admin,
	                       "--events", "none", "--region-dir", "/dev/shm", "--kv-layers", "1",
	                       "--kv-heads", "1", "--kv-head-size", "64", "--pool",
	                       "name=kv,blocks=65536,block_size=16,executor=cpu", NULL};
	pid_t d = kvp_spawn(dargv, NULL);
	struct kvp_client *c = NULL;
	for (int i = 0; i < 100 && c == NULL; i++) {
		usleep(50000);
		c = open_client(url);
	}
	/* alone; region cycles of 64 and of 256 keys (a 1,024- and a 4,096-token prompt); Stats. */
	struct phase ph[4] = {{.name = "alone"}, {.name = "region64", .keys = 64},
	                      {.name = "region256", .keys = 256}, {.name = "stats", .stats = true}};
	int status = 1;
	uint8_t keys[KEYS * KL];
	int32_t rows[KEYS];
	for (int i = 0; i < KEYS; i++)
		mkkey(keys + i * KL, (uint64_t)i);
	if (c == NULL || kvp_client_reserve(c, keys, KEYS, rows, NULL, NULL) != KVP_OK ||
	    kvp_client_commit(c, keys, KEYS, NULL, false) != KVP_OK) {
		fprintf(stderr, "kvp-bench-fair: no daemon: %s\n", kvp_client_open_detail());
		goto out;
	}
	for (int k = 0; k < 4; k++) {
		FILE *f = NULL;
		pid_t a = -1;
		if (k > 0 && (a = start_attackers(self, url, peers, ph[k].stats, ph[k].keys, &f)) < 0) {
			fprintf(stderr, "kvp-bench-fair: the attackers did not start\n");
			goto out;
		}
		int rv = honest(c, secs, &ph[k]);
		if (a > 0) {
			kill(a, SIGKILL);
			waitpid(a, NULL, 0);
			fclose(f);
		}
		if (rv != 0) {
			fprintf(stderr, "kvp-bench-fair: an honest call failed: %s\n",
			        kvp_client_last_detail(c));
			goto out;
		}
		printf("%-9s honest lookups %u: p50 %u us p99 %u us max %u us (p99 %.2fx of alone)\n",
		       ph[k].name, ph[k].n, ph[k].p50, ph[k].p99, ph[k].max,
		       (double)ph[k].p99 / (double)ph[0].p99);
		sleep(1); /* the killed peers' connections go */
	}
	char row[200];
	for (int k = 1; k < 4; k++) {
		if (ph[k].stats)
			snprintf(row, sizeof(row), "honest lookup p99 beside %d peers sending Stats back "
			         "to back", peers);
		else
			snprintf(row, sizeof(row), "honest lookup p99 beside %d peers running region "
			         "cycles of %d keys back to back", peers, ph[k].keys);
		bench_json("fair", row, ph[k].p99 / 1000.0, "ms", "the same client alone, same run",
		           ph[0].p99 / 1000.0, "lower");
	}
	status = 0;
out:
	kvp_client_close(c);
	if (d > 0)
		kvp_reap(d, 30000);
	return status;
}
