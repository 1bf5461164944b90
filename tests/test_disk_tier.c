/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A pool's disk tier through a real kvpoold: a pool of 16 rows over a disk
 * of 256. Rows stored well past the pool's size come back: a lookup of one
 * the region evicted answers pending, then hits with exactly the bytes
 * committed; a key never stored misses at once; a disk whose bytes were
 * overwritten under kvpoold serves nothing wrong (each read is checked
 * against its CRC32C: a miss). The disk's rows are events in vLLM's medium
 * for its disk tier ("STORAGE"), and a Reset empties the disk too.
 */
#include "daemon_util.h"

#include <fcntl.h>
#include <sys/stat.h>

#include "kvp_test.h"

#include "clients/c/kvpool.h"
#include "common/crc32c.h"
#include "kvpool.pb-c.h"

#define KL 36
#define ROWS 16
#define KEYS 64

static char ipc_url[128], ev_url[128], admin[64], dir[64], disk[128], pool[256];
static pid_t daemon_pid;
static uint32_t row_bytes;

/* Key g: hash bytes that look like a hash (the fill table fingerprints them), group 0. */
static void
make_key(uint8_t *k, uint32_t g)
{
	uint64_t x = 0x9e3779b97f4a7c15ull * (g + 11);
	for (int j = 0; j < 32; j++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		k[j] = (uint8_t)x;
	}
	memset(k + 32, 0, 4);
}

static void
fill_row(unsigned char *row, size_t len, uint32_t g)
{
	uint64_t x = 0x2545f4914f6cdd1dull * (g + 3);
	for (size_t j = 0; j < len; j++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		row[j] = (unsigned char)x;
	}
}

/* The pool's series name{pool="kv"} from /metrics (-1 if absent). */
static double
metric(const char *name)
{
	char series[128];
	snprintf(series, sizeof(series), "%s{pool=\"kv\"}", name);
	return metric_value(series);
}

static pid_t
start(void)
{
	const char *args[] = {"--rpc", ipc_url, "--admin", admin, "--events", ev_url,
	                      "--region-dir", dir, "--pool", pool, NULL};
	return daemon_start(args);
}

static struct kvp_client *
client(void)
{
	struct kvp_client_options o = {.url = ipc_url, .pool = "kv", .timeout_ms = 5000,
	                               .retries = 1};
	struct kvp_client *c = NULL;
	assert_int_equal(kvp_client_open(&o, &c), KVP_OK);
	return c;
}

/*
 * Looks key g up until it is not pending (2 s at most). Returns its row
 * (locked) or -1; *pending: whether it was ever pending.
 */
static int32_t
look(struct kvp_client *c, uint32_t g, bool *pending, uint32_t *crc)
{
	uint8_t k[KL];
	int32_t row = -2;
	make_key(k, g);
	*pending = false;
	for (int i = 0; i < 1000 && row == -2; i++) {
		assert_int_equal(kvp_client_lookup_lock(c, k, 1, false, &row, crc, NULL, NULL), KVP_OK);
		if (row == -2) {
			*pending = true;
			sleep_ms(2);
		}
	}
	return row;
}

static void
unlock(struct kvp_client *c, uint32_t g)
{
	uint8_t k[KL];
	make_key(k, g);
	assert_int_equal(kvp_client_unlock(c, k, 1), KVP_OK);
}

static void
test_disk_tier_serves_what_the_region_evicted(void **state)
{
	(void)state;
	struct kvp_client *c = client();
	struct kvp_region *reg = NULL;
	uint8_t keys[4 * KL];
	int32_t rows[4];
	unsigned char *want;

	assert_int_equal(kvp_region_open(c, &reg), KVP_OK);
	row_bytes = (uint32_t)kvp_region_info(reg)->row_bytes;
	want = malloc(row_bytes);
	assert_non_null(want);
	for (uint32_t g = 0; g < KEYS; g += 4) {
		for (uint32_t i = 0; i < 4; i++)
			make_key(keys + i * KL, g + i);
		assert_int_equal(kvp_client_reserve(c, keys, 4, rows, NULL, NULL), KVP_OK);
		for (uint32_t i = 0; i < 4; i++)
			fill_row(kvp_region_row(reg, rows[i]), row_bytes, g + i);
		assert_int_equal(kvp_client_commit(c, keys, 4, NULL, true), KVP_OK);
		sleep_ms(20); /* written behind before the region evicts them */
	}
	uint32_t from_disk = 0;
	for (uint32_t g = 0; g < KEYS; g++) {
		bool pending;
		uint32_t crc = 0;
		int32_t row = look(c, g, &pending, &crc);
		if (row <= 0)
			fail_msg("key %u (of %u stored, the region holds %u) was not served", g, KEYS,
			         ROWS - 1);
		fill_row(want, row_bytes, g);
		if (memcmp(kvp_region_row(reg, row), want, row_bytes) != 0)
			fail_msg("key %u: row %d does not hold the bytes committed", g, row);
		assert_int_equal(crc, kvp_crc32c(0, want, row_bytes));
		from_disk += pending;
		unlock(c, g);
	}
	/* A key never stored misses at once: no wait on the disk. */
	bool pending;
	assert_int_equal(look(c, 100000, &pending, NULL), -1);
	assert_false(pending);
	print_message("%u keys stored in a pool of %u rows: every one served with its bytes, %u of "
	              "them read back from the disk tier\n", KEYS, ROWS - 1, from_disk);
	assert_true(from_disk >= KEYS / 2);
	assert_true(metric("kvpool_disk_writes_total") >= KEYS);
	assert_true(metric("kvpool_disk_fills_total") >= from_disk);
	assert_true(metric("kvpool_disk_rows") == 256);
	free(want);
	kvp_region_close(reg);
	kvp_client_close(c);
}

/* kvpoold killed and started again: the disk's rows come back (the region starts cold). */
static void
test_disk_tier_keeps_its_rows_across_a_restart(void **state)
{
	(void)state;
	kill(daemon_pid, SIGKILL);
	assert_int_equal(kvp_wait_exit(daemon_pid, 10000), -1);
	daemon_pid = start();
	sleep_ms(200);
	struct kvp_client *c = client();
	struct kvp_region *reg = NULL;
	unsigned char *want = malloc(row_bytes);
	uint32_t served = 0;
	assert_non_null(want);
	assert_int_equal(kvp_region_open(c, &reg), KVP_OK);
	for (uint32_t g = 0; g < KEYS; g++) {
		bool pending;
		int32_t row = look(c, g, &pending, NULL);
		if (row <= 0)
			continue;
		fill_row(want, row_bytes, g);
		if (memcmp(kvp_region_row(reg, row), want, row_bytes) != 0)
			fail_msg("key %u: row %d does not hold the bytes committed", g, row);
		served++;
		unlock(c, g);
	}
	print_message("after a SIGKILL and a cold start: %u of %u keys served from the disk, each "
	              "with its bytes\n", served, KEYS);
	assert_int_equal(served, KEYS);
	free(want);
	kvp_region_close(reg);
	kvp_client_close(c);
}

static void
test_disk_tier_never_serves_bytes_that_fail_their_check(void **state)
{
	(void)state;
	struct kvp_client *c = client();
	/* Overwrite every slot under kvpoold. */
	int fd = open(disk, O_WRONLY);
	assert_true(fd >= 0);
	struct stat st;
	assert_int_equal(fstat(fd, &st), 0);
	unsigned char junk[4096];
	memset(junk, 0x5a, sizeof(junk));
	for (off_t off = 0; off < st.st_size; off += (off_t)sizeof(junk))
		assert_true(pwrite(fd, junk, sizeof(junk), off) > 0);
	close(fd);
	/* The keys the region holds now were read back last: ask for the oldest ones. */
	uint32_t wrong = 0, missed = 0;
	for (uint32_t g = 0; g < KEYS / 2; g++) {
		bool pending;
		int32_t row = look(c, g, &pending, NULL);
		if (row > 0) {
			unsigned char *want = malloc(row_bytes);
			struct kvp_region *reg = NULL;
			assert_int_equal(kvp_region_open(c, &reg), KVP_OK);
			fill_row(want, row_bytes, g);
			wrong += memcmp(kvp_region_row(reg, row), want, row_bytes) != 0;
			kvp_region_close(reg);
			free(want);
			unlock(c, g);
		} else {
			missed++;
		}
	}
	print_message("after the disk was overwritten: %u of %u keys missed, %u served wrong\n",
	              missed, KEYS / 2, wrong);
	assert_int_equal(wrong, 0);
	assert_true(missed > 0);
	assert_true(metric("kvpool_disk_fill_failures_total") >= missed);
	kvp_client_close(c);
}

/* Events of this life so far, by medium: hashes stored and removed, and resets. */
struct told {
	uint32_t disk_stored, disk_removed, cpu_stored, cleared, other_medium;
	uint32_t disk_stored_after_clear;
};

static void
count_told(void *ctx, const uint8_t *b, size_t len)
{
	struct told *t = ctx;
	Kvpool__V1__EventBatch *eb = kvpool__v1__event_batch__unpack(NULL, len, b);
	assert_non_null(eb);
	for (size_t i = 0; i < eb->n_events; i++) {
		const Kvpool__V1__Event *e = eb->events[i];
		if (e->event_case == KVPOOL__V1__EVENT__EVENT_CLEARED) {
			t->cleared++;
		} else if (e->event_case == KVPOOL__V1__EVENT__EVENT_STORED) {
			uint32_t n = (uint32_t)(e->stored->block_hashes.len / e->stored->hash_len);
			if (strcmp(e->stored->medium, "STORAGE") == 0) {
				t->disk_stored += n;
				t->disk_stored_after_clear += t->cleared > 0 ? n : 0;
			} else if (strcmp(e->stored->medium, "CPU") == 0) {
				t->cpu_stored += n;
			} else {
				t->other_medium++;
			}
		} else if (e->event_case == KVPOOL__V1__EVENT__EVENT_REMOVED) {
			if (strcmp(e->removed->medium, "STORAGE") == 0)
				t->disk_removed++;
			else if (strcmp(e->removed->medium, "CPU") != 0)
				t->other_medium++;
		}
	}
	kvpool__v1__event_batch__free_unpacked(eb, NULL);
}

static struct told
replay_told(struct kvp_client *c)
{
	struct told t = {0};
	uint64_t epoch, next = 0;
	bool available = false;
	assert_int_equal(kvp_client_event_position(c, &epoch, &next), KVP_OK);
	assert_int_equal(kvp_client_replay(c, epoch, 0, &available, &next, count_told, &t),
	                 KVP_OK);
	assert_true(available);
	return t;
}

/*
 * Since the restart: the disk's kept rows were told as BlockStored in
 * "STORAGE", the slots the corrupted reads dropped as BlockRemoved there.
 * Then a Reset: the disk forgets every key (a key it held misses at once,
 * never pending), and a row committed after it is told after the
 * AllBlocksCleared.
 */
static void
test_disk_tier_tells_its_rows_and_empties_on_reset(void **state)
{
	(void)state;
	struct kvp_client *c = client();
	struct told t = replay_told(c);
	double failures = metric("kvpool_disk_fill_failures_total");
	print_message("since the restart: %u rows told stored on disk (STORAGE), %u removed from "
	              "it, %u stored in the region (CPU); %.0f reads failed their check\n",
	              t.disk_stored, t.disk_removed, t.cpu_stored, failures);
	assert_true(t.disk_stored >= KEYS); /* the start's announcement of what the disk kept */
	assert_true(failures >= 1);
	assert_int_equal(t.disk_removed, (uint32_t)failures);
	assert_int_equal(t.other_medium, 0);
	assert_int_equal(t.cleared, 0);

	assert_true(metric("kvpool_disk_rows_used") > 0);
	assert_int_equal(kvp_client_reset(c), KVP_OK);
	assert_true(metric("kvpool_disk_rows_used") == 0);
	bool pending;
	assert_int_equal(look(c, KEYS - 1, &pending, NULL), -1); /* on disk before the reset */
	assert_false(pending);

	/* A row committed after the reset is written and told after the AllBlocksCleared. */
	struct kvp_region *reg = NULL;
	uint8_t k[KL];
	int32_t row;
	assert_int_equal(kvp_region_open(c, &reg), KVP_OK);
	make_key(k, 5000);
	assert_int_equal(kvp_client_reserve(c, k, 1, &row, NULL, NULL), KVP_OK);
	fill_row(kvp_region_row(reg, row), row_bytes, 5000);
	assert_int_equal(kvp_client_commit(c, k, 1, NULL, true), KVP_OK);
	for (int i = 0; i < 200 && metric("kvpool_disk_rows_used") < 1; i++)
		sleep_ms(5);
	assert_true(metric("kvpool_disk_rows_used") == 1);
	t = replay_told(c);
	assert_int_equal(t.cleared, 1);
	assert_int_equal(t.disk_stored_after_clear, 1);
	kvp_region_close(reg);
	kvp_client_close(c);
}

static int
setup(void **state)
{
	(void)state;
	snprintf(ipc_url, sizeof(ipc_url), "ipc:///tmp/kvpool-disk-%d.ipc", (int)getpid());
	snprintf(ev_url, sizeof(ev_url), "ipc:///tmp/kvpool-disk-ev-%d.ipc", (int)getpid());
	snprintf(dir, sizeof(dir), "/tmp/kvpool-disk-XXXXXX");
	if (mkdtemp(dir) == NULL)
		return -1;
	snprintf(disk, sizeof(disk), "%s/tier.disk", dir);
	snprintf(pool, sizeof(pool), "name=kv,blocks=%d,executor=cpu,session_rows=%d,disk=%s,"
	         "disk_rows=256", ROWS, ROWS, disk);
	snprintf(admin, sizeof(admin), "http://127.0.0.1:%d", daemon_admin_port());
	daemon_pid = start();
	return daemon_pid > 0 ? 0 : -1;
}

static int
teardown(void **state)
{
	(void)state;
	int rv = daemon_stop(daemon_pid) == 0 ? 0 : -1;
	char slots[160];
	snprintf(slots, sizeof(slots), "%s.slots", disk);
	unlink(disk);
	unlink(slots);
	rmdir(dir);
	return rv;
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_disk_tier_serves_what_the_region_evicted),
		cmocka_unit_test(test_disk_tier_keeps_its_rows_across_a_restart),
		cmocka_unit_test(test_disk_tier_never_serves_bytes_that_fail_their_check),
		cmocka_unit_test(test_disk_tier_tells_its_rows_and_empties_on_reset),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
