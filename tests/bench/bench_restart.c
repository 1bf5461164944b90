/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvp-bench-restart: restart=warm's restart-to-ready time. A real kvpoold
 * with a 4 GiB region (2048 rows of 2 MiB, a real model's blocks) in
 * /dev/shm, every row committed with its CRC32C, is killed with SIGKILL
 * and started again on the same settings; the time runs from the start of
 * the new process until it is ready.
 * Ready is when its log says it serves; the run also times a new client's
 * first lookup after that start, which hits. Baselines in the same run: a
 * raw CRC32C of the same 4 GiB on one thread (the check a warm start must
 * make, which it spreads over the CPUs) and a
 * cold start of the same pool (a fresh region allocated, nothing adopted),
 * also after a SIGKILL. Prints `restart warm S cold S crc S ... rows N`.
 * --quick: a 512 MiB region, fewer repetitions.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../spawn.h"
#include "bench_util.h"
#include "clients/c/kvpool.h"
#include "common/crc32c.h"

#define KL 36
#define BATCH 64

static char dir[256], url[320], pool_warm[256], pool_cold[256];

static void
mkkey(uint8_t *k, uint32_t serial)
{
	memset(k, 0, KL);
	memcpy(k, &serial, sizeof(serial));
	k[8] = 0x72;
}

static pid_t
spawn(const char *pool, const char *log)
{
	const char *argv[] = {KVPOOLD_PATH, "--quiet", "--rpc", url, "--admin", "none",
	                      "--events", "none", "--region-dir", dir, "--kv-layers", "32",
	                      "--kv-heads", "8", "--kv-head-size", "128", "--kv-dtype", "bf16",
	                      "--pool", pool, NULL};
	return kvp_spawn(argv, log);
}

/* Whether the daemon's log says it is ready (its last start's log: the file is rewritten). */
static bool
logged_ready(const char *log)
{
	char buf[8192];
	FILE *f = fopen(log, "r");
	bool ready = false;
	if (f == NULL)
		return false;
	while (!ready && fgets(buf, sizeof(buf), f) != NULL)
		ready = strstr(buf, " main: ready ") != NULL;
	fclose(f);
	return ready;
}

/*
 * Seconds from a spawn until the daemon logs that it serves (its pools made,
 * a warm one's rows checked and adopted), into *ready; returns the seconds
 * until a client's first lookup of the first key is answered (a hit when
 * want_hit), or -1.
 */
static double
until_ready(const char *pool, bool want_hit, pid_t *out, double *ready)
{
	struct kvp_client_options o = {.url = url, .pool = "kv", .timeout_ms = 10000};
	char log[400];
	uint8_t key[KL];
	int32_t row = -1;
	mkkey(key, 0);
	snprintf(log, sizeof(log), "%s/kvpoold.log", dir);
	unlink(log);
	double t0 = now();
	*out = spawn(pool, log);
	while (!logged_ready(log)) {
		if (now() - t0 > 60)
			return -1;
		usleep(500);
	}
	*ready = now() - t0;
	struct kvp_client *c = NULL;
	if (kvp_client_open(&o, &c) != KVP_OK)
		return -1;
	int rv = kvp_client_lookup_lock(c, key, 1, false, &row, NULL, NULL, NULL);
	double t = now() - t0;
	kvp_client_close(c);
	return rv != KVP_OK || (want_hit && row <= 0) ? -1 : t;
}

/* Commits every row but the null block's, each with its CRC32C. */
static int
fill(uint32_t rows)
{
	struct kvp_client_options o = {.url = url, .pool = "kv", .timeout_ms = 30000,
	                               .connect_timeout_ms = 10000};
	struct kvp_client *c = NULL;
	struct kvp_region *r = NULL;
	uint8_t keys[BATCH * KL];
	int32_t ids[BATCH];
	uint32_t crcs[BATCH];
	int rv = KVP_EINTERNAL;

	if (kvp_client_open(&o, &c) != KVP_OK || kvp_region_open(c, &r) != KVP_OK)
		goto out;
	size_t bb = kvp_region_info(r)->row_bytes;
	for (uint32_t k = 0; k + 1 < rows; k += BATCH) {
		uint32_t n = rows - 1 - k < BATCH ? rows - 1 - k : BATCH;
		for (uint32_t i = 0; i < n; i++)
			mkkey(keys + i * KL, k + i);
		if ((rv = kvp_client_reserve(c, keys, n, ids, NULL, NULL)) != KVP_OK)
			goto out;
		for (uint32_t i = 0; i < n; i++) {
			unsigned char *row = kvp_region_row(r, ids[i]);
			memset(row, (int)((k + i) & 0xff), bb);
			crcs[i] = kvp_crc32c(0, row, bb);
		}
		if ((rv = kvp_client_commit(c, keys, n, crcs, false)) != KVP_OK)
			goto out;
	}
	rv = KVP_OK;
out:
	if (rv != KVP_OK)
		fprintf(stderr, "kvp-bench-restart: filling the pool: %s\n",
		        c ? kvp_client_last_detail(c) : kvp_client_open_detail());
	kvp_region_close(r);
	kvp_client_close(c);
	return rv;
}

/* A raw CRC32C of the region file's bytes, read through a fresh mapping. */
static double
raw_crc(uint64_t *bytes)
{
	char path[400];
	struct stat st;
	snprintf(path, sizeof(path), "%s/kvpool-kv.region", dir);
	int fd = open(path, O_RDONLY);
	if (fd < 0 || fstat(fd, &st) != 0)
		return -1;
	void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (m == MAP_FAILED)
		return -1;
	double t0 = now();
	volatile uint32_t crc = kvp_crc32c(0, m, (size_t)st.st_size);
	double t = now() - t0;
	(void)crc;
	munmap(m, (size_t)st.st_size);
	*bytes = (uint64_t)st.st_size;
	return t;
}

static void
cleanup(void)
{
	char p[400];
	const char *names[] = {"kvpool-kv.region", "kvpool-kv.rows", "rpc.ipc", "kvpoold.log"};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		snprintf(p, sizeof(p), "%s/%s", dir, names[i]);
		unlink(p);
	}
	rmdir(dir);
}

int
main(int argc, char **argv)
{
	uint32_t rows = 2048; /* x 2 MiB = 4 GiB */
	int reps = 5;
	double warm[8], cold[8], crc[8], warm_hit[8], cold_hit[8], ignore;
	uint64_t bytes = 0;
	pid_t d = -1;
	int status = 1;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--quick") == 0) {
			rows = 256;
			reps = 3;
		} else {
			fprintf(stderr, "usage: kvp-bench-restart [--quick]\n");
			return 2;
		}
	}
	snprintf(dir, sizeof(dir), "/dev/shm/kvp-bench-restart-%d", (int)getpid());
	if (mkdir(dir, 0700) != 0)
		return 1;
	snprintf(url, sizeof(url), "ipc://%s/rpc.ipc", dir);
	snprintf(pool_warm, sizeof(pool_warm), "name=kv,blocks=%u,block_size=16,executor=cpu,"
	         "restart=warm,session_rows=%u", rows, rows);
	snprintf(pool_cold, sizeof(pool_cold), "name=kv,blocks=%u,block_size=16,executor=cpu,"
	         "session_rows=%u", rows, rows);
	/* Cold starts first (a fresh region each), then fill a warm pool and restart it. */
	for (int i = 0; i < reps; i++) {
		if ((cold_hit[i] = until_ready(pool_cold, false, &d, &cold[i])) < 0)
			goto out;
		kill(d, SIGKILL); /* as the warm ones: the next start finds a stale socket too */
		kvp_wait_exit(d, 10000);
		d = -1;
	}
	if (until_ready(pool_warm, false, &d, &ignore) < 0 || fill(rows) != KVP_OK)
		goto out;
	for (int i = 0; i < reps; i++) {
		kill(d, SIGKILL);
		kvp_wait_exit(d, 10000);
		d = -1;
		if ((crc[i] = raw_crc(&bytes)) < 0 ||
		    (warm_hit[i] = until_ready(pool_warm, true, &d, &warm[i])) < 0) {
			fprintf(stderr, "kvp-bench-restart: the warm start did not serve the rows\n");
			goto out;
		}
	}
	double w = median(warm, reps), c = median(cold, reps), k = median(crc, reps);
	double wh = median(warm_hit, reps), ch = median(cold_hit, reps);
	printf("# kvp-bench-restart: %u rows of 2 MiB (%llu MiB) in /dev/shm, medians of %d; "
	       "ready: the daemon's log says so; hit: a new client's first lookup answered\n",
	       rows - 1, (unsigned long long)(bytes >> 20), reps);
	printf("restart warm %.3f cold %.3f crc %.3f warm_hit %.3f cold_hit %.3f rows %u\n", w, c,
	       k, wh, ch, rows - 1);
	char row[160];
	snprintf(row, sizeof(row), "warm restart to ready (SIGKILL, %u rows, %llu MiB, every row "
	         "checked)", rows - 1, (unsigned long long)(bytes >> 20));
	bench_json("restart", row, w, "s", "a raw CRC32C of the same bytes on one thread", k,
	           "lower");
	snprintf(row, sizeof(row), "warm restart to ready against a cold start of the same pool "
	         "(%llu MiB)", (unsigned long long)(bytes >> 20));
	bench_json("restart", row, w, "s", "a cold start (a fresh region, nothing kept)", c,
	           "lower");
	snprintf(row, sizeof(row), "warm restart to a new client's first hit (%llu MiB)",
	         (unsigned long long)(bytes >> 20));
	bench_json("restart", row, wh, "s", "a cold start to its first lookup answered", ch,
	           "lower");
	status = 0;
out:
	if (d > 0)
		kvp_reap(d, 10000);
	cleanup();
	return status;
}
