/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvp-bench-disk: a pool's disk tier (disk=, disk_rows=) against a raw
 * O_DIRECT write and read of the same bytes to the same file system.
 *
 *   write: rows committed in batches of 32 (Reserve, a write in place,
 *          Commit with their CRC32C), each batch timed from its Commit
 *          until the disk's thread has written it behind
 *          (kvpool_disk_writes_total, polled)
 *   read:  lookups of rows the region evicted, each answered pending
 *          until the thread has read it back and checked it, then a hit
 *   raw:   pwrite/pread with O_DIRECT of as many 2 MiB blocks, one thread;
 *          the reads into as many rows as the region has, interleaved
 *          with the tier's, five passes, medians
 *
 * 2 MiB rows (a real model's blocks), 512 of them (1 GiB) in a directory
 * under /var/tmp (a disk, not tmpfs; KVP_BENCH_DISK_DIR names another).
 * Prints `disk write B/s raw B/s ratio R` and `disk read ...`. --quick:
 * 192 rows.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../spawn.h"
#include "bench_util.h"
#include "clients/c/kvpool.h"
#include "common/crc32c.h"

#define KL 36
#define BATCH 32
#define ROW (2u << 20)

static char dir[256], url[320], admin[64];
static int admin_port;

static void
mkkey(uint8_t *k, uint32_t g)
{
	uint64_t x = 0x9e3779b97f4a7c15ull * (g + 5);
	for (int j = 0; j < 32; j++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		k[j] = (uint8_t)x;
	}
	memset(k + 32, 0, 4);
}

/* kvpool_disk_writes_total of pool kv, from the admin endpoint (-1 if unreadable). */
static double
disk_writes(void)
{
	static char body[1 << 17];
	const char *series = "\nkvpool_disk_writes_total{pool=\"kv\"} ";
	const char *get = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)admin_port)};
	size_t n = 0;
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
	    write(fd, get, strlen(get)) != (ssize_t)strlen(get)) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	for (ssize_t r; n < sizeof(body) - 1 && (r = read(fd, body + n, sizeof(body) - 1 - n)) > 0;)
		n += (size_t)r;
	body[n] = '\0';
	close(fd);
	const char *at = strstr(body, series);
	return at ? strtod(at + strlen(series), NULL) : -1;
}

static void *
aligned(size_t n)
{
	void *p = NULL;
	if (posix_memalign(&p, 4096, n) != 0)
		return NULL;
	memset(p, 0x3c, n);
	return p;
}

/* Raw O_DIRECT: the file, and seconds to write n blocks of ROW bytes (with their sync). */
static int raw_fd = -1;
static unsigned char *raw_buf;

static int
raw_write(uint32_t n, double *w)
{
	char path[400];
	snprintf(path, sizeof(path), "%s/raw.bin", dir);
	raw_buf = aligned(ROW);
	raw_fd = open(path, O_RDWR | O_CREAT | O_DIRECT, 0600);
	unlink(path); /* gone at close, whatever happens */
	if (raw_fd < 0 || raw_buf == NULL || posix_fallocate(raw_fd, 0, (off_t)n * ROW) != 0)
		return -1;
	double t0 = now();
	for (uint32_t i = 0; i < n; i++)
		if (pwrite(raw_fd, raw_buf, ROW, (off_t)i * ROW) != (ssize_t)ROW)
			return -1;
	fdatasync(raw_fd);
	*w = now() - t0;
	return 0;
}

/*
 * Seconds to read blocks [0, n) of the raw file back, one 2 MiB pread at a
 * time, into as many rows as the region has (2 * BATCH, in turn): the
 * tier's reads land in rows no cache holds, and so do these (one buffer
 * read into again and again stays in the CPU's cache, which made the raw
 * side up to twice as fast on this VM when its host served the reads from
 * memory).
 */
static unsigned char *raw_rows;

static int
raw_read(uint32_t n, double *r)
{
	const size_t nrows = 2 * BATCH;
	if (raw_rows == NULL && (raw_rows = aligned(nrows * ROW)) == NULL)
		return -1;
	double t0 = now();
	for (uint32_t i = 0; i < n; i++)
		if (pread(raw_fd, raw_rows + (i % nrows) * ROW, ROW, (off_t)i * ROW) != (ssize_t)ROW)
			return -1;
	*r = now() - t0;
	return 0;
}

/* Seconds for rows [0, back) (evicted from the region) to be looked up until every one hits. */
static int
tier_read(struct kvp_client *c, uint32_t back, double *secs)
{
	uint8_t keys[BATCH * KL];
	double t0 = now();
	for (uint32_t g = 0; g < back; g += BATCH) {
		int32_t rws[BATCH];
		for (uint32_t i = 0; i < BATCH; i++)
			mkkey(keys + i * KL, g + i);
		for (int tries = 0;; tries++) {
			if (kvp_client_lookup_lock(c, keys, BATCH, false, rws, NULL, NULL, NULL) != KVP_OK)
				return -1;
			uint32_t hits = 0, pending = 0;
			for (uint32_t i = 0; i < BATCH; i++) {
				hits += rws[i] > 0;
				pending += rws[i] == -2;
			}
			/* Unlock what hit; ask again for the rest while any is pending. */
			uint8_t hk[BATCH * KL];
			uint32_t nh = 0;
			for (uint32_t i = 0; i < BATCH; i++)
				if (rws[i] > 0)
					memcpy(hk + nh++ * KL, keys + i * KL, KL);
			if (nh > 0 && kvp_client_unlock(c, hk, nh) != KVP_OK)
				return -1;
			if (hits == BATCH)
				break;
			if (pending == 0 || tries > 100000) {
				fprintf(stderr, "kvp-bench-disk: %u of %u rows came back\n", hits, BATCH);
				return -2;
			}
			usleep(100);
		}
	}
	*secs = now() - t0;
	return 0;
}

static int
cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int
main(int argc, char **argv)
{
	uint32_t rows = 512, pool_rows = 2 * BATCH + 1;
	char pool[512], disk[300];
	struct kvp_client *c = NULL;
	struct kvp_region *reg = NULL;
	pid_t d = -1;
	int status = 1;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--quick") == 0)
			rows = 192; /* each pass reads 128: twice the region, so every pass reads the disk */
		else {
			fprintf(stderr, "usage: kvp-bench-disk [--quick]\n");
			return 2;
		}
	}
	const char *base = getenv("KVP_BENCH_DISK_DIR") ? getenv("KVP_BENCH_DISK_DIR") : "/var/tmp";
	snprintf(dir, sizeof(dir), "%s/kvp-bench-disk-%d", base, (int)getpid());
	if (mkdir(dir, 0700) != 0)
		return 1;
	admin_port = bench_tcp_port(2);
	snprintf(admin, sizeof(admin), "http://127.0.0.1:%d", admin_port);
	snprintf(url, sizeof(url), "ipc://%s/rpc.ipc", dir);
	snprintf(disk, sizeof(disk), "%s/tier.disk", dir);
	snprintf(pool, sizeof(pool), "name=kv,blocks=%u,block_size=16,executor=cpu,session_rows=%u,"
	         "disk=%s,disk_rows=%u", pool_rows, pool_rows, disk, rows);
	const char *dargv[] = {KVPOOLD_PATH, "--quiet", "--rpc", url, "--admin", admin,
	                       "--events", "none", "--region-dir", "/dev/shm", "--kv-layers", "32",
	                       "--kv-heads", "8", "--kv-head-size", "128", "--kv-dtype", "bf16",
	                       "--pool", pool, NULL};
	char log[400];
	snprintf(log, sizeof(log), "%s/kvpoold.log", dir);
	d = kvp_spawn(dargv, log);
	struct kvp_client_options o = {.url = url, .pool = "kv", .timeout_ms = 30000,
	                               .connect_timeout_ms = 10000};
	if (d <= 0 || kvp_client_open(&o, &c) != KVP_OK || kvp_region_open(c, &reg) != KVP_OK) {
		fprintf(stderr, "kvp-bench-disk: no daemon or region: %s\n", kvp_client_open_detail());
		goto out;
	}
	uint8_t keys[BATCH * KL];
	int32_t ids[BATCH];
	uint32_t crcs[BATCH];
	double t0, wait_until, tw = 0;
	for (uint32_t g = 0; g < rows; g += BATCH) {
		for (uint32_t i = 0; i < BATCH; i++)
			mkkey(keys + i * KL, g + i);
		if (kvp_client_reserve(c, keys, BATCH, ids, NULL, NULL) != KVP_OK)
			goto fail_call;
		for (uint32_t i = 0; i < BATCH; i++) {
			unsigned char *row = kvp_region_row(reg, ids[i]);
			memset(row, (int)((g + i) & 0xff), ROW);
			crcs[i] = kvp_crc32c(0, row, ROW);
		}
		/* Timed from the Commit: writing the rows in place is this program's work. */
		t0 = now();
		if (kvp_client_commit(c, keys, BATCH, crcs, false) != KVP_OK)
			goto fail_call;
		wait_until = now() + 60;
		while (disk_writes() < g + BATCH && now() < wait_until)
			usleep(200);
		if (disk_writes() < g + BATCH) {
			fprintf(stderr, "kvp-bench-disk: rows were not written behind\n");
			goto out;
		}
		tw += now() - t0;
	}
	double rw = 0;
	if (raw_write(rows, &rw) != 0) {
		fprintf(stderr, "kvp-bench-disk: raw O_DIRECT I/O failed in %s\n", dir);
		goto out;
	}
	/*
	 * Reads, interleaved with raw reads of as many blocks (the disk's speed
	 * drifts here): the oldest rows (the region holds only the newest) come
	 * back from the disk; each pass ends with other rows in the region, so
	 * the next reads the disk again. Medians of REPS passes.
	 */
	enum { REPS = 5 };
	uint32_t back = rows - 2 * BATCH; /* at least twice the region: no pass hits in memory */
	double tr[REPS], rr[REPS];
	for (int k = 0; k < REPS; k++) {
		int rv = tier_read(c, back, &tr[k]);
		if (rv == -1)
			goto fail_call;
		if (rv != 0)
			goto out;
		if (raw_read(back, &rr[k]) != 0) {
			fprintf(stderr, "kvp-bench-disk: raw O_DIRECT I/O failed in %s\n", dir);
			goto out;
		}
		printf("# pass %d: disk read %.0f B/s raw %.0f B/s\n", k + 1,
		       (double)back * ROW / tr[k], (double)back * ROW / rr[k]);
	}
	qsort(tr, REPS, sizeof(double), cmp_double);
	qsort(rr, REPS, sizeof(double), cmp_double);
	double bw = (double)rows * ROW, br = (double)back * ROW;
	printf("# kvp-bench-disk: %u rows of 2 MiB through a disk tier in %s (the region holds %u)\n",
	       rows, base, pool_rows - 1);
	printf("disk write %.0f B/s raw %.0f B/s ratio %.3f\n", bw / tw, bw / rw, rw / tw);
	printf("disk read %.0f B/s raw %.0f B/s ratio %.3f\n", br / tr[REPS / 2],
	       br / rr[REPS / 2], rr[REPS / 2] / tr[REPS / 2]);
	char row[160];
	snprintf(row, sizeof(row), "disk tier write behind: %u rows of 2 MiB committed, each "
	         "waited for on the disk", rows);
	bench_json("disk", row, bw / tw, "B/s", "raw O_DIRECT pwrite of the same bytes", bw / rw,
	           "higher");
	snprintf(row, sizeof(row), "disk tier read back: %u evicted rows looked up until they hit "
	         "(median of %d passes)", back, REPS);
	bench_json("disk", row, br / tr[REPS / 2], "B/s",
	           "raw O_DIRECT pread of as many bytes, interleaved", br / rr[REPS / 2], "higher");
	status = 0;
	goto out;
fail_call:
	fprintf(stderr, "kvp-bench-disk: a call failed: %s\n", kvp_client_last_detail(c));
out:
	if (raw_fd >= 0)
		close(raw_fd);
	free(raw_buf);
	free(raw_rows);
	kvp_region_close(reg);
	kvp_client_close(c);
	if (d > 0)
		kvp_reap(d, 30000);
	unlink(disk);
	unlink(log);
	snprintf(log, sizeof(log), "%s/rpc.ipc", dir);
	unlink(log);
	rmdir(dir);
	return status;
}
