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
 *   raw:   pwrite/pread with O_DIRECT of as many 2 MiB blocks, one thread
 *
 * 2 MiB rows (a real model's blocks), 512 of them (1 GiB) in a directory
 * under /var/tmp (a disk, not tmpfs; KVP_BENCH_DISK_DIR names another).
 * Prints `disk write B/s raw B/s ratio R` and `disk read ...`. --quick:
 * 128 rows.
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

/* Raw O_DIRECT: seconds to write n blocks of ROW bytes, then to read them back. */
static int
raw(uint32_t n, double *w, double *r)
{
	char path[400];
	unsigned char *buf = aligned(ROW);
	snprintf(path, sizeof(path), "%s/raw.bin", dir);
	int fd = open(path, O_RDWR | O_CREAT | O_DIRECT, 0600);
	if (fd < 0 || buf == NULL || posix_fallocate(fd, 0, (off_t)n * ROW) != 0) {
		free(buf);
		if (fd >= 0)
			close(fd);
		return -1;
	}
	double t0 = now();
	for (uint32_t i = 0; i < n; i++)
		if (pwrite(fd, buf, ROW, (off_t)i * ROW) != (ssize_t)ROW)
			goto fail;
	fdatasync(fd);
	*w = now() - t0;
	t0 = now();
	for (uint32_t i = 0; i < n; i++)
		if (pread(fd, buf, ROW, (off_t)i * ROW) != (ssize_t)ROW)
			goto fail;
	*r = now() - t0;
	close(fd);
	unlink(path);
	free(buf);
	return 0;
fail:
	close(fd);
	unlink(path);
	free(buf);
	return -1;
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
			rows = 128;
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
	/* Reads: the oldest rows (the region holds only the newest) come back from the disk. */
	uint32_t back = rows - 2 * BATCH;
	t0 = now();
	for (uint32_t g = 0; g < back; g += BATCH) {
		int32_t rws[BATCH];
		for (uint32_t i = 0; i < BATCH; i++)
			mkkey(keys + i * KL, g + i);
		for (int tries = 0;; tries++) {
			if (kvp_client_lookup_lock(c, keys, BATCH, false, rws, NULL, NULL, NULL) != KVP_OK)
				goto fail_call;
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
				goto fail_call;
			if (hits == BATCH)
				break;
			if (pending == 0 || tries > 100000) {
				fprintf(stderr, "kvp-bench-disk: %u of %u rows came back\n", hits, BATCH);
				goto out;
			}
			usleep(100);
		}
	}
	double tr = now() - t0;
	double rw = 0, rr = 0;
	if (raw(rows, &rw, &rr) != 0) {
		fprintf(stderr, "kvp-bench-disk: raw O_DIRECT I/O failed in %s\n", dir);
		goto out;
	}
	double bw = (double)rows * ROW, br = (double)back * ROW;
	printf("# kvp-bench-disk: %u rows of 2 MiB through a disk tier in %s (the region holds %u)\n",
	       rows, base, pool_rows - 1);
	printf("disk write %.0f B/s raw %.0f B/s ratio %.3f\n", bw / tw, bw / rw, rw / tw);
	printf("disk read %.0f B/s raw %.0f B/s ratio %.3f\n", br / tr, (double)rows * ROW / rr,
	       (br / tr) / ((double)rows * ROW / rr));
	char row[160];
	snprintf(row, sizeof(row), "disk tier write behind: %u rows of 2 MiB committed, each "
	         "waited for on the disk", rows);
	bench_json("disk", row, bw / tw, "B/s", "raw O_DIRECT pwrite of the same bytes", bw / rw,
	           "higher");
	snprintf(row, sizeof(row), "disk tier read back: %u evicted rows looked up until they hit",
	         back);
	bench_json("disk", row, br / tr, "B/s", "raw O_DIRECT pread of the same bytes",
	           (double)rows * ROW / rr, "higher");
	status = 0;
	goto out;
fail_call:
	fprintf(stderr, "kvp-bench-disk: a call failed: %s\n", kvp_client_last_detail(c));
out:
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
