/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvp-bench-region: KV rows stored and loaded through the shared region of a
 * real kvpoold (ipc), round trips included, against a raw memcpy of the
 * same bytes between two private buffers in this process, and against
 * today's WriteBlocks/ReadBlocks over the same ipc socket.
 *
 *   store: Reserve(keys); memcpy each block into its row; Commit(keys)
 *   load:  LookupAndLock(keys); memcpy each row out; Unlock(keys)
 *   nng:   Allocate + WriteBlocks + Free; ReadBlocks of held blocks
 *
 * Blocks are 2 MiB by default, a real model's (32 layers x 8 KV heads x 128
 * x 16 tokens x bf16 x K,V), in batches of 1, 8 and 64. Commit by default
 * skips the daemon's row checksum; the run also prints the store with it
 * and the load with the reader's check, each against the same memcpy.
 * Every ratio is a median of a few repetitions measured in this run. Prints
 * `region store BYTES ratio_vs_memcpy R`, `region load ...` and the nng
 * lines a script reads. No arguments: under a minute. --quick: smaller.
 */
#define _GNU_SOURCE
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
#define MAX_BATCH 64

static int reps = 7;

static void
mkkey(uint8_t *k, uint64_t serial)
{
	memset(k, 0, KL);
	for (int j = 0; j < 8; j++)
		k[j] = (uint8_t)(serial >> (8 * j));
	k[8] = 0x6b;
}

static void *
big(size_t n)
{
	void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	memset(p, 0x3c, n); /* every page present, as a real source and destination would be */
	return p;
}

struct ctx {
	struct kvp_client *c;
	struct kvp_region *r;
	size_t bb;
	unsigned char *src, *dst;
	uint64_t serial;
};

static double
time_memcpy(struct ctx *x, size_t n)
{
	double t[16];
	for (int i = 0; i < reps; i++) {
		double t0 = now();
		for (size_t b = 0; b < n; b++)
			memcpy(x->dst + b * x->bb, x->src + b * x->bb, x->bb);
		t[i] = now() - t0;
	}
	return median(t, reps);
}

/* One store of n fresh keys; the seconds it took, or -1. */
static double
store_once(struct ctx *x, size_t n, bool checksum, uint8_t *keys)
{
	int32_t rows[MAX_BATCH];
	for (size_t i = 0; i < n; i++)
		mkkey(keys + i * KL, ++x->serial);
	double t0 = now();
	if (kvp_client_reserve(x->c, keys, n, rows, NULL, NULL) != KVP_OK)
		return -1;
	for (size_t i = 0; i < n; i++)
		memcpy(kvp_region_row(x->r, rows[i]), x->src + i * x->bb, x->bb);
	if (kvp_client_commit(x->c, keys, n, NULL, checksum) != KVP_OK)
		return -1;
	return now() - t0;
}

static double
load_once(struct ctx *x, size_t n, bool check, const uint8_t *keys)
{
	int32_t rows[MAX_BATCH];
	uint32_t crcs[MAX_BATCH], hits = 0;
	double t0 = now();
	if (kvp_client_lookup_lock(x->c, keys, n, false, rows, crcs, NULL, &hits) != KVP_OK ||
	    hits != n)
		return -1;
	for (size_t i = 0; i < n; i++) {
		const void *row = kvp_region_row(x->r, rows[i]);
		if (check && crcs[i] != 0 && kvp_crc32c(0, row, x->bb) != crcs[i])
			return -1;
		memcpy(x->dst + i * x->bb, row, x->bb);
	}
	if (kvp_client_unlock(x->c, keys, n) != KVP_OK)
		return -1;
	return now() - t0;
}

static double
nng_store_once(struct ctx *x, size_t n)
{
	int32_t ids[MAX_BATCH];
	double t0 = now();
	if (kvp_client_allocate(x->c, (uint32_t)n, ids) != KVP_OK ||
	    kvp_client_write_blocks(x->c, ids, n, x->src, n * x->bb) != KVP_OK ||
	    kvp_client_free(x->c, ids, n) != KVP_OK)
		return -1;
	return now() - t0;
}

static double
nng_load_once(struct ctx *x, size_t n, const int32_t *ids)
{
	double t0 = now();
	if (kvp_client_read_blocks(x->c, ids, n, x->dst, n * x->bb, NULL) != KVP_OK)
		return -1;
	return now() - t0;
}

static int
run(struct ctx *x, size_t n)
{
	uint8_t keys[MAX_BATCH * KL];
	int32_t held[MAX_BATCH];
	double t[16], base = time_memcpy(x, n), st, st_crc, ld, ld_chk, ns, nl;
	size_t bytes = n * x->bb;

	for (int i = 0; i < reps; i++)
		if ((t[i] = store_once(x, n, true, keys)) < 0)
			return -1;
	st_crc = median(t, reps);
	for (int i = 0; i < reps; i++)
		if ((t[i] = store_once(x, n, false, keys)) < 0)
			return -1;
	st = median(t, reps);
	/* keys of the last store are cached: load them */
	for (int i = 0; i < reps; i++)
		if ((t[i] = load_once(x, n, false, keys)) < 0)
			return -1;
	ld = median(t, reps);
	for (int i = 0; i < reps; i++)
		if ((t[i] = store_once(x, n, true, keys)) < 0 ||
		    (t[i] = load_once(x, n, true, keys)) < 0)
			return -1;
	ld_chk = median(t, reps);
	for (int i = 0; i < reps; i++)
		if ((t[i] = nng_store_once(x, n)) < 0)
			return -1;
	ns = median(t, reps);
	if (kvp_client_allocate(x->c, (uint32_t)n, held) != KVP_OK)
		return -1;
	for (int i = 0; i < reps; i++)
		if ((t[i] = nng_load_once(x, n, held)) < 0)
			return -1;
	nl = median(t, reps);
	if (kvp_client_free(x->c, held, n) != KVP_OK)
		return -1;
	base = (base + time_memcpy(x, n)) / 2; /* before and after: the machine drifts */
	printf("# %zu blocks of %zu B (%.1f MiB): memcpy %.2f GB/s; region store %.2f GB/s "
	       "(%.2f with the daemon's checksum), load %.2f GB/s (%.2f checked); "
	       "nng write %.2f GB/s, read %.2f GB/s\n",
	       n, x->bb, bytes / 1048576.0, bytes / base / 1e9, bytes / st / 1e9,
	       bytes / st_crc / 1e9, bytes / ld / 1e9, bytes / ld_chk / 1e9, bytes / ns / 1e9,
	       bytes / nl / 1e9);
	printf("region store %zu ratio_vs_memcpy %.3f\n", bytes, base / st);
	printf("region load %zu ratio_vs_memcpy %.3f\n", bytes, base / ld);
	printf("region store_checksummed %zu ratio_vs_memcpy %.3f\n", bytes, base / st_crc);
	printf("region load_checked %zu ratio_vs_memcpy %.3f\n", bytes, base / ld_chk);
	printf("nng write_blocks %zu ratio_vs_memcpy %.3f region_speedup %.2f\n", bytes, base / ns,
	       ns / st);
	printf("nng read_blocks %zu ratio_vs_memcpy %.3f region_speedup %.2f\n", bytes, base / nl,
	       nl / ld);
	fflush(stdout);
	const struct {
		const char *what;
		double t;
	} fig[] = {{"region store (Reserve, write in place, Commit)", st},
	           {"region store, the daemon checksums the rows", st_crc},
	           {"region load (LookupAndLock, read in place, Unlock)", ld},
	           {"region load, rows checked against their CRC32C", ld_chk},
	           {"WriteBlocks over nng (the region's alternative)", ns},
	           {"ReadBlocks over nng", nl}};
	for (size_t k = 0; k < sizeof(fig) / sizeof(fig[0]); k++) {
		char row[160];
		snprintf(row, sizeof(row), "%s: %zu row%s of %zu KiB", fig[k].what, n, n == 1 ? "" : "s",
		         x->bb >> 10);
		bench_json("region", row, bytes / fig[k].t, "B/s", "memcpy of the same bytes",
		           bytes / base, "higher");
	}
	return 0;
}

int
main(int argc, char **argv)
{
	size_t layers = 32, heads = 8, head = 128;
	char dir[256], url[320], pool[256], sl[16], sh[16], shs[16];
	struct ctx x = {0};
	int status = 1;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--quick") == 0) {
			layers = 4;
			reps = 3;
		} else {
			fprintf(stderr, "usage: kvp-bench-region [--quick]\n");
			return 2;
		}
	}
	x.bb = layers * heads * head * 16 * 2 * 2;
	snprintf(dir, sizeof(dir), "/tmp/kvp-bench-region-%d", (int)getpid());
	if (mkdir(dir, 0700) != 0)
		return 1;
	snprintf(url, sizeof(url), "ipc://%s/rpc.ipc", dir);
	/* session_rows: one writer and one reader may each hold every row */
	snprintf(pool, sizeof(pool), "name=kv,blocks=%d,block_size=16,executor=cpu,session_rows=%d",
	         3 * MAX_BATCH + 8, 3 * MAX_BATCH + 8);
	snprintf(sl, sizeof(sl), "%zu", layers);
	snprintf(sh, sizeof(sh), "%zu", heads);
	snprintf(shs, sizeof(shs), "%zu", head);
	const char *dargv[] = {KVPOOLD_PATH, "--quiet", "--rpc", url, "--admin", "none",
	                       "--events", "none", "--kv-layers", sl, "--kv-heads", sh,
	                       "--kv-head-size", shs, "--kv-dtype", "bf16", "--max-msg-bytes",
	                       "67108864", "--pool", pool, NULL};
	pid_t d = kvp_spawn(dargv, NULL);
	struct kvp_client_options o = {.url = url, .pool = "kv", .timeout_ms = 30000,
	                               .connect_timeout_ms = 10000};
	if (d <= 0 || kvp_client_open(&o, &x.c) != KVP_OK) {
		fprintf(stderr, "kvp-bench-region: no daemon: %s\n", kvp_client_open_detail());
		goto out;
	}
	if (kvp_region_open(x.c, &x.r) != KVP_OK) {
		fprintf(stderr, "kvp-bench-region: no region: %s\n", kvp_client_last_detail(x.c));
		goto out;
	}
	if ((x.src = big(MAX_BATCH * x.bb)) == NULL || (x.dst = big(MAX_BATCH * x.bb)) == NULL)
		goto out;
	for (size_t i = 0; i < MAX_BATCH * x.bb; i += 64)
		x.src[i] = (unsigned char)(i >> 6);
	/* Touch every row once so first-write faults are not in the measurements. */
	for (int w = 0; w < 3; w++) {
		uint8_t keys[MAX_BATCH * KL];
		if (store_once(&x, MAX_BATCH, false, keys) < 0)
			goto out;
	}
	printf("# kvp-bench-region: kvpoold over ipc, %zu-byte rows, medians of %d\n", x.bb, reps);
	static const size_t batches[] = {1, 8, MAX_BATCH};
	for (size_t i = 0; i < sizeof(batches) / sizeof(batches[0]); i++)
		if (run(&x, batches[i]) != 0) {
			fprintf(stderr, "kvp-bench-region: a call failed: %s\n",
			        kvp_client_last_detail(x.c));
			goto out;
		}
	status = 0;
out:
	if (x.src)
		munmap(x.src, MAX_BATCH * x.bb);
	if (x.dst)
		munmap(x.dst, MAX_BATCH * x.bb);
	kvp_region_close(x.r);
	kvp_client_close(x.c);
	if (d > 0 && kvp_reap(d, 10000) != 0)
		status = 1;
	snprintf(url, sizeof(url), "%s/rpc.ipc", dir);
	unlink(url);
	rmdir(dir);
	return status;
}
