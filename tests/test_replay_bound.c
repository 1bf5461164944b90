/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The replay rings' byte bound (issue #15: "event batches are capped by
 * count, not bytes"): a real kvpoold with --replay-mib 1 and
 * --vllm-buffer-mib 1 publishes about 49 MB of large event batches (each
 * Cache of 1,024 blocks stores their tokens). Its native ring must hold at
 * most 1 MiB plus the newest batch (kvpool_replay_ring_bytes), Replay of the
 * first batch must say it is gone while the newest still replays, and the
 * daemon's resident memory must grow by far less than what it published.
 * Without the bound both rings keep every batch (10,000 of them by count):
 * run with --replay-mib 1024, the ring held 49 MB and RSS grew by 85 MB.
 */
#include "daemon_util.h"

#include "kvp_test.h"

#include "clients/c/kvpool.h"

#define ROUNDS 400
#define BLOCKS 1024
#define BS 16

static char rpc_url[128], ev_url[128], vllm_url[128], vllm_replay[128], admin[64];
static pid_t daemon_pid;

static int
setup(void **state)
{
	(void)state;
	int pid = (int)getpid();
	snprintf(rpc_url, sizeof(rpc_url), "ipc:///tmp/kvpool-rbtest-%d.ipc", pid);
	snprintf(ev_url, sizeof(ev_url), "ipc:///tmp/kvpool-rbtest-ev-%d.ipc", pid);
	snprintf(vllm_url, sizeof(vllm_url), "ipc:///tmp/kvpool-rbtest-vllm-%d.ipc", pid);
	snprintf(vllm_replay, sizeof(vllm_replay), "ipc:///tmp/kvpool-rbtest-vrep-%d.ipc", pid);
	snprintf(admin, sizeof(admin), "http://127.0.0.1:%d", daemon_admin_port());
	const char *args[] = {"--rpc", rpc_url, "--events", ev_url, "--admin", admin,
	                      "--vllm-events", vllm_url, "--vllm-replay", vllm_replay,
	                      "--replay-mib", "1", "--vllm-buffer-mib", "1", "--executor", "none",
	                      "--pool", "name=default,blocks=2048,block_size=16,seed=0", NULL};
	daemon_pid = daemon_start(args);
	return daemon_pid > 0 ? 0 : -1;
}

static int
teardown(void **state)
{
	(void)state;
	return daemon_stop(daemon_pid) == 0 ? 0 : -1;
}

struct count {
	size_t batches, bytes;
};

static void
each(void *ctx, const uint8_t *batch, size_t len)
{
	struct count *c = ctx;
	(void)batch;
	c->batches++;
	c->bytes += len;
}

static void
test_replay_ring_is_bounded_in_bytes(void **state)
{
	static int32_t ids[BLOCKS];
	static int64_t tokens[BLOCKS * BS];
	struct kvp_client_options o = {.url = rpc_url};
	struct kvp_client *c;
	uint64_t epoch, first_seq, next_seq;
	(void)state;

	assert_int_equal(kvp_client_open(&o, &c), KVP_OK);
	assert_int_equal(kvp_client_event_position(c, &epoch, &first_seq), KVP_OK);
	double base = 0;
	/* 20 rounds warm up (the allocator's arenas, the sockets) before the baseline. */
	for (int r = 0; r < ROUNDS + 20; r++) {
		if (r == 20) {
			sleep_ms(200);
			assert_true((base = proc_rss_bytes(daemon_pid)) > 0);
		}
		for (size_t k = 0; k < BLOCKS * BS; k++) /* fresh hashes each round */
			tokens[k] = (int64_t)((uint64_t)r * 1000003u + k) % 1000000007;
		assert_int_equal(kvp_client_allocate(c, BLOCKS, ids), KVP_OK);
		struct kvp_client_cache a = {.block_ids = ids, .num_block_ids = BLOCKS,
		                             .num_full_blocks = BLOCKS, .tokens = tokens,
		                             .num_tokens = BLOCKS * BS};
		uint32_t stored = 0;
		assert_int_equal(kvp_client_cache(c, &a, &stored), KVP_OK);
		assert_int_equal(stored, BLOCKS);
		assert_int_equal(kvp_client_free(c, ids, BLOCKS), KVP_OK);
		assert_int_equal(kvp_client_reset(c), KVP_OK);
		if (r == ROUNDS + 19) {
			double ring = metric_value("kvpool_replay_ring_bytes{pool=\"default\"}");
			double dropped = metric_value("kvpool_replay_batches_dropped_for_bytes_total{pool=\"default\"}");
			sleep_ms(200);
			double grown = proc_rss_bytes(daemon_pid) - base;
			print_message("ring %.0f bytes, %.0f batches dropped for bytes, RSS +%.1f MB\n",
			              ring, dropped, grown / 1e6);
			/* One Cache batch is tens of kB: 1 MiB and the newest at most. */
			assert_true(ring > 0 && ring <= (1 << 20) + 200000);
			assert_true(dropped > ROUNDS);
			/* ~49 MB published on each wire; the rings may keep 2 MiB. */
			assert_true(grown < 16e6);
		}
	}
	/* The first batch is gone; the newest replays. */
	bool available = true;
	struct count n = {0};
	assert_int_equal(kvp_client_replay(c, epoch, first_seq, &available, &next_seq, each, &n),
	                 KVP_OK);
	assert_false(available);
	assert_int_equal(n.batches, 0);
	assert_int_equal(kvp_client_replay(c, epoch, next_seq - 1, &available, &next_seq, each, &n),
	                 KVP_OK);
	assert_true(available);
	assert_int_equal(n.batches, 1);
	kvp_client_close(c);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_replay_ring_is_bounded_in_bytes),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
