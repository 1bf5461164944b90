/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The cluster tier's fill path through a real kvpoold over ipc
 * (docs/cluster.md): a region pool with cluster_wait_ms answers a missed
 * key -2 (pending) only while an agent calls ClusterFill; the agent takes
 * the key, fills its row (Reserve, write, Commit) and the lookup hits with
 * the agent's checksum; a key the agent reports absent misses at once; a
 * key the agent never answers misses after cluster_wait_ms; a pool without
 * the setting refuses ClusterFill; every answer counts in /metrics. A pool
 * with a disk tier too: keys the disk holds come back from it and are
 * never handed to the agent; the agent gets only what the disk lacks. The
 * agent's announcements of what the cluster holds keep no fill alive.
 */
#include "daemon_util.h"

#include "kvp_test.h"

#include "clients/c/kvpool.h"
#include "common/crc32c.h"

#define KL 36
#define WAIT_MS 400

static char ipc_url[128], tcp_url[128], admin[64], disk_dir[64], disk_path[128];
static pid_t daemon_pid;

static void
make_key(uint8_t *k, uint32_t i)
{
	for (int j = 0; j < 32; j++)
		k[j] = (uint8_t)(i * 131u + (uint32_t)j * 7u + 3u);
	memset(k + 32, 0, 4);
}

static struct kvp_client *
open_client(const char *pool, const char *name)
{
	struct kvp_client_options o = {.url = ipc_url, .pool = pool, .timeout_ms = 5000,
	                               .retries = 1, .client_name = name};
	struct kvp_client *c = NULL;
	int rv = kvp_client_open(&o, &c);
	if (rv != KVP_OK)
		fail_msg("open %s: %s (%s)", pool, kvp_status_name(rv), kvp_client_open_detail());
	return c;
}

static int32_t
lookup(struct kvp_client *c, const uint8_t *k, uint32_t *crc)
{
	int32_t row = 0;
	assert_int_equal(kvp_client_lookup_lock(c, k, 1, false, &row, crc, NULL, NULL), KVP_OK);
	return row;
}

static void
test_cluster_fill_pending_then_hit(void **state)
{
	struct kvp_client *engine = open_client("c", "engine"), *agent = open_client("c", "agent");
	struct kvp_region *reg = NULL;
	uint8_t k[KL], got[8 * KL];
	size_t n = 0;
	uint32_t crc = 0, waiting = 0;
	int32_t row;
	(void)state;

	make_key(k, 1);
	assert_int_equal(lookup(engine, k, NULL), -1); /* no agent has called: a plain miss */
	assert_int_equal(kvp_client_cluster_fill(agent, NULL, 0, got, 0, &n, NULL), KVP_OK);
	assert_int_equal(lookup(engine, k, NULL), -2);
	assert_int_equal(lookup(engine, k, NULL), -2); /* asked again: still one want */
	assert_int_equal(kvp_client_cluster_fill(agent, NULL, 0, got, 8, &n, &waiting), KVP_OK);
	assert_int_equal(n, 1);
	assert_int_equal(waiting, 0);
	assert_memory_equal(got, k, KL);

	/* The agent fills the row as any writer does. */
	assert_int_equal(kvp_region_open(agent, &reg), KVP_OK);
	const struct kvp_region_info *ri = kvp_region_info(reg);
	assert_int_equal(kvp_client_reserve(agent, k, 1, &row, NULL, NULL), KVP_OK);
	assert_true(row > 0);
	unsigned char *dst = kvp_region_row(reg, row);
	assert_non_null(dst);
	for (size_t j = 0; j < ri->row_bytes; j++)
		dst[j] = (unsigned char)(j * 31u + 5u);
	uint32_t want = kvp_crc32c(0, dst, ri->row_bytes);
	assert_int_equal(kvp_client_commit(agent, k, 1, &want, false), KVP_OK);
	assert_int_equal(lookup(engine, k, &crc), row);
	assert_int_equal(crc, want);
	assert_int_equal(kvp_client_unlock(engine, k, 1), KVP_OK);
	kvp_region_close(reg);
	kvp_client_close(agent);
	kvp_client_close(engine);
}

/*
 * The write-behind policy's count: each engine's lookup that hits a row
 * counts until the row's next commit; the agent's uncounted look counts
 * nothing and tells the count (0 for a miss); a bad call changes nothing.
 * On a pool with a cluster tier, the agent's look at a missing key is a
 * plain miss: it never answers pending nor queues the key for a fill.
 */
static void
test_cluster_fill_rows_count_their_hits(void **state)
{
	/* A pool without a cluster tier: a miss is a plain miss, queuing nothing. */
	struct kvp_client *engine = open_client("plain", "engine");
	struct kvp_client *agent = open_client("plain", "agent");
	uint8_t k[2 * KL];
	int32_t rows[2], row;
	uint32_t hits[2] = {9, 9}, crcs[2];
	(void)state;

	make_key(k, 40);
	make_key(k + KL, 41); /* never stored */
	assert_int_equal(kvp_client_reserve(agent, k, 1, &row, NULL, NULL), KVP_OK);
	assert_true(row > 0);
	assert_int_equal(kvp_client_commit(agent, k, 1, NULL, false), KVP_OK);
	assert_int_equal(kvp_client_lookup_lock_uncounted(agent, k, 2, rows, crcs, hits), KVP_OK);
	assert_int_equal(rows[0], row);
	assert_int_equal(rows[1], -1);
	assert_int_equal(hits[0], 0);
	assert_int_equal(hits[1], 0);
	assert_int_equal(kvp_client_unlock(agent, k, 1), KVP_OK);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(lookup(engine, k, NULL), row);
		assert_int_equal(kvp_client_unlock(engine, k, 1), KVP_OK);
	}
	assert_int_equal(kvp_client_lookup_lock_uncounted(agent, k, 1, rows, crcs, hits), KVP_OK);
	assert_int_equal(hits[0], 3); /* the engine's three; the agent's looks are not hits */
	assert_int_equal(kvp_client_unlock(agent, k, 1), KVP_OK);
	assert_int_equal(kvp_client_lookup_lock_uncounted(agent, k, 1, rows, crcs, NULL),
	                 KVP_EINVAL);
	assert_int_equal(kvp_client_lookup_lock_uncounted(agent, k, 1, rows, crcs, hits), KVP_OK);
	assert_int_equal(hits[0], 3);
	assert_int_equal(kvp_client_unlock(agent, k, 1), KVP_OK);
	kvp_client_close(agent);
	kvp_client_close(engine);

	struct kvp_client *filler = open_client("c", "agent");
	uint8_t got[8 * KL];
	size_t n = 0;
	make_key(k, 42);
	assert_int_equal(kvp_client_cluster_fill(filler, NULL, 0, got, 0, &n, NULL), KVP_OK);
	assert_int_equal(kvp_client_lookup_lock_uncounted(filler, k, 1, rows, crcs, hits), KVP_OK);
	assert_int_equal(rows[0], -1); /* an engine's lookup would answer -2 here */
	assert_int_equal(kvp_client_cluster_fill(filler, NULL, 0, got, 8, &n, NULL), KVP_OK);
	for (size_t i = 0; i < n; i++)
		assert_memory_not_equal(got + i * KL, k, KL);
	kvp_client_close(filler);
}

static void
test_cluster_fill_absent_and_unanswered_keys_miss(void **state)
{
	struct kvp_client *engine = open_client("c", "engine"), *agent = open_client("c", "agent");
	uint8_t k[2][KL], got[8 * KL];
	size_t n = 0;
	(void)state;

	make_key(k[0], 10);
	make_key(k[1], 11);
	assert_int_equal(kvp_client_cluster_fill(agent, NULL, 0, got, 0, &n, NULL), KVP_OK);
	assert_int_equal(lookup(engine, k[0], NULL), -2);
	assert_int_equal(lookup(engine, k[1], NULL), -2);
	assert_int_equal(kvp_client_cluster_fill(agent, k[0], 1, got, 8, &n, NULL), KVP_OK);
	assert_int_equal(n, 1); /* k[1]: k[0] was reported absent before the take */
	assert_memory_equal(got, k[1], KL);
	assert_int_equal(lookup(engine, k[0], NULL), -1); /* absent: a miss at once */
	assert_int_equal(lookup(engine, k[1], NULL), -2); /* taken, not answered yet */
	nanosleep(&(struct timespec){0, (WAIT_MS + 100) * 1000000L}, NULL);
	assert_int_equal(kvp_client_cluster_fill(agent, NULL, 0, got, 0, &n, NULL), KVP_OK);
	assert_int_equal(lookup(engine, k[1], NULL), -1); /* its wait is over: a miss */

	/* /metrics counts the pending answers. */
	char cmd[256], line[512];
	snprintf(cmd, sizeof(cmd), "curl -sf %s/metrics", admin);
	FILE *p = popen(cmd, "r");
	bool seen = false;
	assert_non_null(p);
	while (fgets(line, sizeof(line), p))
		if (strncmp(line, "kvpool_cluster_pending_total{pool=\"c\"} ", 39) == 0)
			seen = strtoull(line + 39, NULL, 10) >= 4;
	pclose(p);
	assert_true(seen);
	kvp_client_close(agent);
	kvp_client_close(engine);
}

static void
test_cluster_fill_refused_without_the_setting(void **state)
{
	struct kvp_client *agent = open_client("plain", "agent");
	uint8_t got[KL], k[KL];
	size_t n = 0;
	(void)state;
	assert_int_equal(kvp_client_cluster_fill(agent, NULL, 0, got, 1, &n, NULL), KVP_ENOTSUP);
	make_key(k, 20);
	assert_int_equal(lookup(agent, k, NULL), -1);
	assert_int_equal(kvp_client_cluster_fill(agent, NULL, 0, NULL, 1, &n, NULL), KVP_EINVAL);
	assert_int_equal(kvp_client_cluster_fill(agent, NULL, 0, got, 1, NULL, NULL), KVP_EINVAL);
	kvp_client_close(agent);
}

/*
 * The agent's announcements (what the cluster store holds, published as
 * medium CLUSTER events): accepted with no fill asked, yet they keep no
 * fill alive, so a lookup while only they come misses plainly; refused
 * on a pool without the tier; an empty call sends nothing.
 */
static void
test_cluster_announce_keeps_no_fill_alive(void **state)
{
	struct kvp_client *engine = open_client("c", "engine"), *agent = open_client("c", "agent");
	struct kvp_client *plain = open_client("plain", "agent");
	uint8_t k[3][KL];
	(void)state;

	for (uint32_t i = 0; i < 3; i++)
		make_key(k[i], 300 + i);
	/* No fill call yet in this daemon's life (this test runs first). */
	assert_int_equal(kvp_client_cluster_announce(agent, k[0], 2, k[2], 1), KVP_OK);
	assert_int_equal(kvp_client_cluster_announce(agent, NULL, 0, k[0], 1), KVP_OK);
	assert_int_equal(lookup(engine, k[1], NULL), -1); /* not pending: no agent fills */
	assert_int_equal(kvp_client_cluster_announce(agent, NULL, 0, NULL, 0), KVP_OK);
	assert_int_equal(kvp_client_cluster_announce(agent, NULL, 1, NULL, 0), KVP_EINVAL);
	assert_int_equal(kvp_client_cluster_announce(NULL, k[0], 1, NULL, 0), KVP_EINVAL);
	assert_int_equal(kvp_client_cluster_announce(plain, k[0], 1, NULL, 0), KVP_ENOTSUP);
	kvp_client_close(plain);
	kvp_client_close(agent);
	kvp_client_close(engine);
}

/*
 * Both tiers: 24 keys stored in a pool of 8 rows go to its disk; evicted
 * from the region, they come back from the disk (pending, then a hit with
 * their bytes) while the agent calls ClusterFill throughout, and the agent
 * is handed none of them; a key the disk never had is the agent's.
 */
static void
test_cluster_fill_beside_a_disk_tier(void **state)
{
	struct kvp_client *engine = open_client("cd", "engine"), *agent = open_client("cd", "agent");
	struct kvp_region *reg = NULL;
	uint8_t k[KL], got[64 * KL];
	size_t n = 0;
	int32_t row;
	(void)state;

	assert_int_equal(kvp_region_open(engine, &reg), KVP_OK);
	size_t rb = kvp_region_info(reg)->row_bytes;
	for (uint32_t i = 100; i < 124; i++) {
		make_key(k, i);
		assert_int_equal(kvp_client_reserve(engine, k, 1, &row, NULL, NULL), KVP_OK);
		memset(kvp_region_row(reg, row), (int)i, rb);
		assert_int_equal(kvp_client_commit(engine, k, 1, NULL, true), KVP_OK);
		sleep_ms(10); /* written behind before the region evicts it */
	}
	uint32_t from_disk = 0, handed = 0;
	for (uint32_t i = 100; i < 112; i++) { /* the oldest: evicted from the 7 rows */
		make_key(k, i);
		row = -2;
		for (int t = 0; t < 500 && row == -2; t++) {
			assert_int_equal(kvp_client_cluster_fill(agent, NULL, 0, got, 64, &n, NULL),
			                 KVP_OK);
			for (size_t j = 0; j < n; j++)
				handed += memcmp(got + j * KL, k, KL) == 0;
			row = lookup(engine, k, NULL);
			if (row == -2) {
				from_disk++;
				sleep_ms(2);
			}
		}
		if (row <= 0)
			fail_msg("key %u was not served from the disk (%d)", i, row);
		unsigned char *r = kvp_region_row(reg, row);
		for (size_t j = 0; j < rb; j++)
			if (r[j] != (unsigned char)i)
				fail_msg("key %u: byte %zu of row %d is not what was committed", i, j, row);
		uint8_t uk[KL];
		memcpy(uk, k, KL);
		assert_int_equal(kvp_client_unlock(engine, uk, 1), KVP_OK);
	}
	print_message("12 evicted keys served from the disk (%u lookups pending), %u of them "
	              "handed to the cluster's agent\n", from_disk, handed);
	assert_true(from_disk > 0);
	assert_int_equal(handed, 0);
	/* A key the disk never had: pending for the agent, and handed to it. */
	make_key(k, 999);
	assert_int_equal(lookup(engine, k, NULL), -2);
	assert_int_equal(kvp_client_cluster_fill(agent, NULL, 0, got, 64, &n, NULL), KVP_OK);
	assert_int_equal(n, 1);
	assert_memory_equal(got, k, KL);
	kvp_region_close(reg);
	kvp_client_close(agent);
	kvp_client_close(engine);
}

static int
setup(void **state)
{
	char wait[160];
	(void)state;
	daemon_urls(ipc_url, sizeof(ipc_url), tcp_url, sizeof(tcp_url));
	snprintf(admin, sizeof(admin), "http://127.0.0.1:%d", daemon_admin_port());
	snprintf(wait, sizeof(wait), "name=c,blocks=16,block_size=16,executor=cpu,"
	         "cluster_wait_ms=%d,cluster_miss_ms=60000", WAIT_MS);
	snprintf(disk_dir, sizeof(disk_dir), "/tmp/kvpool-cfd-XXXXXX");
	if (mkdtemp(disk_dir) == NULL)
		return -1;
	snprintf(disk_path, sizeof(disk_path), "%s/tier.disk", disk_dir);
	char both[300];
	snprintf(both, sizeof(both), "name=cd,blocks=8,block_size=16,executor=cpu,session_rows=8,"
	         "cluster_wait_ms=%d,cluster_miss_ms=60000,disk=%s,disk_rows=64", WAIT_MS,
	         disk_path);
	const char *args[] = {"--rpc", ipc_url, "--admin", admin,
	                      "--kv-layers", "2", "--kv-heads", "4", "--kv-head-size", "32",
	                      "--region-dir", getenv("TMPDIR") && *getenv("TMPDIR")
	                                          ? getenv("TMPDIR") : "/tmp",
	                      "--pool", wait, "--pool", "name=plain,blocks=8,executor=cpu",
	                      "--pool", both, NULL};
	daemon_pid = daemon_start(args);
	return daemon_pid > 0 ? 0 : -1;
}

static int
teardown(void **state)
{
	(void)state;
	int rv = daemon_stop(daemon_pid) == 0 ? 0 : -1;
	char slots[160];
	snprintf(slots, sizeof(slots), "%s.slots", disk_path);
	unlink(disk_path);
	unlink(slots);
	rmdir(disk_dir);
	return rv;
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cluster_announce_keeps_no_fill_alive), /* first: no agent yet */
		cmocka_unit_test(test_cluster_fill_pending_then_hit),
		cmocka_unit_test(test_cluster_fill_rows_count_their_hits),
		cmocka_unit_test(test_cluster_fill_absent_and_unanswered_keys_miss),
		cmocka_unit_test(test_cluster_fill_refused_without_the_setting),
		cmocka_unit_test(test_cluster_fill_beside_a_disk_tier),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
