/* SPDX-License-Identifier: Apache-2.0 */
/*
 * restart=warm through a real kvpoold: a writer stores rows (Reserve, write
 * in place, Commit) while the daemon is killed with SIGKILL at a random
 * moment, KVP_WARM_KILLS times (200 unless the environment says). After
 * each restart every row a lookup finds holds exactly the bytes committed
 * for its key, no key whose commit never went out is found, and every key
 * the writer saw committed (and no reserve since evicted) is found again.
 * Also: a stop with SIGTERM keeps the rows, a second daemon on the same
 * region is refused, and a changed layout starts empty.
 */
#include "daemon_util.h"

#include <pthread.h>
#include <sys/stat.h>

#include "kvp_test.h"

#include "clients/c/kvpool.h"
#include "common/crc32c.h"
#include "kvpool.pb-c.h"

#define KL 36           /* sha256: a 32-byte hash and a 4-byte group */
#define ROWS 128
#define BATCH 4
#define BATCHES 12      /* per life at most */
#define TIMEOUT_MS 200

enum state { NEVER, RESIDENT, MAYBE };

static char admin[64], ipc_url[128], ev_url[128], dir[64], log_path[128], pool_spec[128], heads[8] = "2";
static uint32_t row_bytes;
static unsigned char *st;  /* per key index: enum state */
static uint32_t next_key, max_keys;
/* Where the kills landed: in a reserve, in a commit, or after the life's stores. */
static uint32_t cut_reserve, cut_commit, cut_idle;

/* Key g: its index in the first 4 bytes (to map evicted keys back), a pattern after. */
static void
make_key(uint8_t *k, uint32_t g)
{
	uint64_t x = 0x9e3779b97f4a7c15ull * (g + 1);
	memcpy(k, &g, 4);
	for (int j = 4; j < 32; j++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		k[j] = (uint8_t)x;
	}
	memset(k + 32, 0, 4);
}

static uint32_t
key_index(const uint8_t *k)
{
	uint32_t g;
	memcpy(&g, k, 4);
	return g;
}

static void
fill_row(unsigned char *row, size_t len, uint32_t g)
{
	uint64_t x = 0xda942042e4dd58b5ull * (g + 7);
	for (size_t j = 0; j < len; j++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		row[j] = (unsigned char)x;
	}
}

static pid_t
start(void)
{
	const char *args[] = {"--rpc", ipc_url, "--admin", admin, "--events", ev_url,
	                      "--region-dir", dir, "--kv-heads", heads, "--pool", pool_spec, NULL};
	return daemon_start_log(args, log_path);
}

/*
 * A client of the daemon just started (it may take a moment to listen): one
 * that waits (checks), or with a short timeout and no retry (the writer the
 * kill interrupts: its calls fail as soon as the daemon is gone).
 */
static struct kvp_client *
connect_with(uint32_t timeout_ms, uint32_t retries)
{
	struct kvp_client_options o = {.url = ipc_url, .pool = "kv", .timeout_ms = timeout_ms,
	                               .retries = retries};
	struct kvp_client *c = NULL;
	for (int i = 0; i < 100; i++) {
		if (kvp_client_open(&o, &c) == KVP_OK)
			return c;
		sleep_ms(50);
	}
	print_log_tail(log_path, 20);
	fail_msg("no daemon to talk to: %s", kvp_client_open_detail());
	return NULL;
}

static struct kvp_client *
connect_client(void)
{
	return connect_with(5000, 1);
}

/*
 * Looks up every key ever made: each hit must hold its key's bytes and
 * CRC; hits may only be RESIDENT or MAYBE keys; at most `may_miss` RESIDENT
 * keys may miss (evicted by a reserve whose reply was lost). Afterwards the
 * hits are RESIDENT and everything else NEVER. Returns the hits.
 */
static uint32_t
verify(struct kvp_client *c, struct kvp_region *reg, uint32_t may_miss)
{
	uint8_t keys[32 * KL];
	int32_t rows[32];
	uint32_t crcs[32], hits = 0, missed = 0;
	unsigned char *want = malloc(row_bytes);

	assert_non_null(want);
	for (uint32_t g0 = 0; g0 < next_key; g0 += 32) {
		uint32_t n = next_key - g0 < 32 ? next_key - g0 : 32, nh = 0;
		uint8_t hit_keys[32 * KL];
		for (uint32_t i = 0; i < n; i++)
			make_key(keys + i * KL, g0 + i);
		assert_int_equal(kvp_client_lookup_lock(c, keys, n, false, rows, crcs, NULL, NULL),
		                 KVP_OK);
		for (uint32_t i = 0; i < n; i++) {
			uint32_t g = g0 + i;
			if (rows[i] <= 0) {
				if (st[g] == RESIDENT)
					missed++;
				st[g] = NEVER;
				continue;
			}
			if (st[g] == NEVER)
				fail_msg("key %u was adopted, but its commit never went out", g);
			fill_row(want, row_bytes, g);
			if (memcmp(kvp_region_row(reg, rows[i]), want, row_bytes) != 0)
				fail_msg("key %u: row %d does not hold the bytes committed", g, rows[i]);
			assert_int_equal(crcs[i], kvp_crc32c(0, want, row_bytes));
			st[g] = RESIDENT;
			memcpy(hit_keys + nh++ * KL, keys + i * KL, KL);
		}
		if (nh > 0)
			assert_int_equal(kvp_client_unlock(c, hit_keys, nh), KVP_OK);
		hits += nh;
	}
	free(want);
	if (missed > may_miss) {
		print_log_tail(log_path, 10);
		fail_msg("%u keys committed before the kill were not adopted (at most %u could have "
		         "been evicted by a reserve whose reply was lost)", missed, may_miss);
	}
	return hits;
}

/* SIGTERM: kvpoold must exit 0 (its invariants checked, no leak); else its log says why. */
static void
stop_clean(pid_t pid)
{
	int status = daemon_stop(pid);
	if (status != 0) {
		print_log_tail(log_path, 40);
		fail_msg("kvpoold did not stop cleanly: status %d", status);
	}
}

struct replayed {
	uint32_t cleared, stored, other;
};

static void
count_events(void *ctx, const uint8_t *b, size_t len)
{
	struct replayed *r = ctx;
	Kvpool__V1__EventBatch *eb = kvpool__v1__event_batch__unpack(NULL, len, b);
	assert_non_null(eb);
	for (size_t i = 0; i < eb->n_events; i++) {
		const Kvpool__V1__Event *e = eb->events[i];
		if (e->event_case == KVPOOL__V1__EVENT__EVENT_CLEARED && r->stored == 0)
			r->cleared++;
		else if (e->event_case == KVPOOL__V1__EVENT__EVENT_STORED && r->cleared == 1)
			r->stored += e->stored->hash_len
			                 ? (uint32_t)(e->stored->block_hashes.len / e->stored->hash_len)
			                 : 0;
		else
			r->other++;
	}
	kvpool__v1__event_batch__free_unpacked(eb, NULL);
}

/*
 * What a warm start published (within a tick, about a second): one
 * AllBlocksCleared, then BlockStored for each kept row, nothing else.
 */
static void
check_start_events(struct kvp_client *c, uint32_t kept)
{
	struct replayed r = {0};
	uint64_t epoch, next = 0;
	bool available = false;
	for (int i = 0; i < 60 && next == 0; i++) {
		sleep_ms(50);
		assert_int_equal(kvp_client_event_position(c, &epoch, &next), KVP_OK);
	}
	assert_int_equal(kvp_client_replay(c, epoch, 0, &available, &next, count_events, &r),
	                 KVP_OK);
	assert_true(available);
	print_message("a warm start published %u AllBlocksCleared, then BlockStored for %u rows "
	              "(%u kept)\n", r.cleared, r.stored, kept);
	assert_int_equal(r.cleared, 1);
	assert_int_equal(r.stored, kept);
	assert_int_equal(r.other, 0);
}

struct killer {
	pid_t pid;
	long delay_us;
};

static void *
killer_main(void *arg)
{
	struct killer *k = arg;
	struct timespec ts = {k->delay_us / 1000000, (k->delay_us % 1000000) * 1000};
	nanosleep(&ts, NULL);
	kill(k->pid, SIGKILL);
	return NULL;
}

/*
 * Stores batches of new keys until a call fails (the kill) or BATCHES are
 * done. Returns how many RESIDENT keys the call that failed may have evicted.
 */
static uint32_t
store_until_killed(struct kvp_client *c, struct kvp_region *reg)
{
	uint8_t keys[BATCH * KL], evicted[BATCH * KL];
	int32_t rows[BATCH];
	size_t ne;

	for (int b = 0; b < BATCHES && next_key + BATCH <= max_keys; b++) {
		uint32_t g0 = next_key;
		next_key += BATCH;
		for (uint32_t i = 0; i < BATCH; i++)
			make_key(keys + i * KL, g0 + i);
		if (kvp_client_reserve(c, keys, BATCH, rows, evicted, &ne) != KVP_OK) {
			cut_reserve++;
			return BATCH; /* its evictions, if it ran, are unknown */
		}
		for (size_t i = 0; i < ne; i++)
			if (key_index(evicted + i * KL) < next_key)
				st[key_index(evicted + i * KL)] = NEVER;
		for (uint32_t i = 0; i < BATCH; i++)
			if (rows[i] > 0)
				fill_row(kvp_region_row(reg, rows[i]), row_bytes, g0 + i);
		int rv = kvp_client_commit(c, keys, BATCH, NULL, true);
		for (uint32_t i = 0; i < BATCH; i++)
			st[g0 + i] = rv == KVP_OK ? RESIDENT : MAYBE;
		if (rv != KVP_OK) {
			cut_commit++;
			return 0;
		}
	}
	cut_idle++;
	return 0;
}

/* One life: start, verify what the last one left, store until killed. Returns the hits. */
static uint32_t
life(uint32_t may_miss, bool kill_it, uint32_t *may_miss_next)
{
	pid_t pid = start();
	assert_true(pid > 0);
	struct kvp_client *c = connect_client();
	struct kvp_region *reg = NULL;
	assert_int_equal(kvp_region_open(c, &reg), KVP_OK);
	row_bytes = (uint32_t)kvp_region_info(reg)->row_bytes;
	uint32_t resident = 0, maybe = 0;
	for (uint32_t g = 0; g < next_key; g++) {
		resident += st[g] == RESIDENT;
		maybe += st[g] == MAYBE;
	}
	if (!kill_it && may_miss == 0 && maybe == 0) /* before verify's lookups publish any */
		check_start_events(c, resident);
	uint32_t hits = verify(c, reg, may_miss);
	*may_miss_next = 0;
	if (kill_it) {
		/* The life's stores take a few milliseconds: most kills land among them. */
		struct killer k = {.pid = pid, .delay_us = (long)(rand() % 3000)};
		struct kvp_client *w = connect_with(TIMEOUT_MS, 0);
		pthread_t t;
		assert_int_equal(pthread_create(&t, NULL, killer_main, &k), 0);
		*may_miss_next = store_until_killed(w, reg);
		pthread_join(t, NULL);
		assert_int_equal(kvp_wait_exit(pid, 10000), -1); /* killed by the signal */
		kvp_region_close(reg);
		kvp_client_detach(w); /* no Goodbye to a dead daemon */
		kvp_client_detach(c);
	} else {
		kvp_region_close(reg);
		kvp_client_close(c);
		stop_clean(pid);
	}
	return hits;
}

static void
test_warm_restart_survives_kills_mid_store(void **state)
{
	(void)state;
	const char *e = getenv("KVP_WARM_KILLS");
	uint32_t kills = e && atoi(e) > 0 ? (uint32_t)atoi(e) : 200, may_miss = 0, lives_hit = 0;
	uint64_t adopted = 0;

	max_keys = kills * BATCH * BATCHES + BATCH;
	st = calloc(max_keys, 1);
	assert_non_null(st);
	srand(12345);
	for (uint32_t i = 0; i < kills; i++) {
		uint32_t h = life(may_miss, true, &may_miss);
		adopted += h;
		lives_hit += h > 0;
	}
	/* A stop with SIGTERM keeps them too; then one more start finds them all. */
	uint32_t resident = 0, mm;
	for (uint32_t g = 0; g < next_key; g++)
		resident += st[g] == RESIDENT;
	(void)life(may_miss, false, &mm);
	uint32_t after_stop = life(0, false, &mm);
	print_message("%u kills (%u in a reserve, %u in a commit, %u after the stores): %llu rows "
	              "adopted in all (rows found in %u lives), every one with its committed "
	              "bytes; %u kept across a clean stop\n", kills, cut_reserve, cut_commit,
	              cut_idle, (unsigned long long)adopted, lives_hit, after_stop);
	assert_true(cut_reserve + cut_commit >= kills / 4); /* the kills did land mid-store */
	assert_true(lives_hit >= kills / 2);
	assert_true(after_stop > 0 && after_stop >= resident / 2);
}

static void
test_warm_restart_region_held_and_layout_checked(void **state)
{
	(void)state;
	pid_t pid = start();
	struct kvp_client *c = connect_client();
	uint8_t key[KL];
	int32_t row;
	/* A second daemon on the same settings cannot take the region. */
	char other[128];
	snprintf(other, sizeof(other), "ipc:///tmp/kvpool-warm2-%d.ipc", (int)getpid());
	const char *args[] = {"--rpc", other, "--admin", "none", "--events", "none",
	                      "--region-dir", dir, "--kv-heads", heads, "--pool", pool_spec, NULL};
	pid_t second = daemon_start_log(args, "/dev/null");
	int status = kvp_wait_exit(second, 10000);
	assert_true(status != 0 && status != -1);
	/* The first still serves, and holds at least a row. */
	make_key(key, 0);
	uint32_t crc;
	assert_int_equal(kvp_client_lookup_lock(c, key, 1, false, &row, &crc, NULL, NULL), KVP_OK);
	kvp_client_close(c);
	stop_clean(pid);
	/* Another layout (more heads: another row size) starts empty and says why. */
	snprintf(heads, sizeof(heads), "4");
	pid = start();
	c = connect_client();
	uint32_t hits = 0;
	for (uint32_t g = 0; g < next_key; g++) {
		make_key(key, g);
		assert_int_equal(kvp_client_lookup_lock(c, key, 1, false, &row, NULL, NULL, NULL),
		                 KVP_OK);
		hits += row > 0;
	}
	kvp_client_close(c);
	stop_clean(pid);
	assert_int_equal(hits, 0);
	snprintf(heads, sizeof(heads), "2");
}

/* The pool's series name{pool="kv"} from /metrics (-1 if absent). */
static double
metric(const char *name)
{
	char series[128];
	snprintf(series, sizeof(series), "%s{pool=\"kv\"}", name);
	return metric_value(series);
}

/* Stores keys [g0, g0 + n) with no CRC in the Commit (as vLLM's spec does). */
static void
store_unchecked(struct kvp_client *c, struct kvp_region *reg, uint32_t g0, uint32_t n)
{
	uint8_t keys[16 * KL], evicted[16 * KL];
	int32_t rows[16];
	size_t ne = 0;
	assert_true(n <= 16);
	for (uint32_t i = 0; i < n; i++)
		make_key(keys + i * KL, g0 + i);
	assert_int_equal(kvp_client_reserve(c, keys, n, rows, evicted, &ne), KVP_OK);
	for (size_t i = 0; i < ne; i++)
		st[key_index(evicted + i * KL)] = NEVER;
	for (uint32_t i = 0; i < n; i++) {
		assert_true(rows[i] > 0);
		fill_row(kvp_region_row(reg, rows[i]), row_bytes, g0 + i);
	}
	assert_int_equal(kvp_client_commit(c, keys, n, NULL, false), KVP_OK);
}

/*
 * Rows committed without a CRC are kept once the daemon's sweeper has
 * taken one (within a reaper period); those a kill catches before are
 * dropped, never served with other bytes; a clean stop proves them all.
 */
static void
test_warm_restart_keeps_rows_committed_without_a_crc(void **state)
{
	(void)state;
	pid_t pid = start();
	struct kvp_client *c = connect_client();
	struct kvp_region *reg = NULL;
	assert_int_equal(kvp_region_open(c, &reg), KVP_OK);
	row_bytes = (uint32_t)kvp_region_info(reg)->row_bytes;
	(void)verify(c, reg, ROWS); /* whatever the last test left: checked, then forgotten */
	uint32_t g0 = next_key;
	next_key += 24;
	double proven0 = metric("kvpool_warm_rows_proven_total");
	store_unchecked(c, reg, g0, 8);
	sleep_ms(1500); /* a few reaper periods: the sweeper proves these */
	assert_true(metric("kvpool_warm_rows_unproven") == 0);
	assert_true(metric("kvpool_warm_rows_proven_total") >= proven0 + 8);
	store_unchecked(c, reg, g0 + 8, 8);
	kill(pid, SIGKILL);
	assert_int_equal(kvp_wait_exit(pid, 10000), -1);
	kvp_region_close(reg);
	kvp_client_detach(c);
	for (uint32_t i = 0; i < 16; i++)
		st[g0 + i] = i < 8 ? RESIDENT : MAYBE;

	pid = start();
	c = connect_client();
	assert_int_equal(kvp_region_open(c, &reg), KVP_OK);
	(void)verify(c, reg, 0); /* the first 8 must be there, with their bytes */
	double kept = metric("kvpool_warm_rows_kept"), dropped = metric("kvpool_warm_rows_dropped");
	/* A clean stop right after a commit without a CRC proves it before it exits. */
	store_unchecked(c, reg, g0 + 16, 8);
	for (uint32_t i = 16; i < 24; i++)
		st[g0 + i] = RESIDENT;
	kvp_region_close(reg);
	kvp_client_close(c);
	stop_clean(pid);
	pid = start();
	c = connect_client();
	assert_int_equal(kvp_region_open(c, &reg), KVP_OK);
	(void)verify(c, reg, 0); /* all 8 there, with their bytes */
	kvp_region_close(reg);
	kvp_client_close(c);
	stop_clean(pid);
	uint32_t early = 0, late = 0;
	for (uint32_t i = 0; i < 16; i++)
		*(i < 8 ? &early : &late) += st[g0 + i] == RESIDENT;
	print_message("rows committed without a CRC: %u of 8 proven before the kill kept; of 8 "
	              "committed just before it, %u kept (the rest dropped unproven)\n", early,
	              late);
	assert_int_equal(early, 8);
	/* The metrics say what the start kept and dropped: every late row one or the other. */
	assert_true(kept >= 8 && dropped >= 0);
	assert_true(kept + dropped >= early + late + (8 - late));
}

static int
setup(void **state)
{
	(void)state;
	snprintf(ipc_url, sizeof(ipc_url), "ipc:///tmp/kvpool-warm-%d.ipc", (int)getpid());
	snprintf(admin, sizeof(admin), "http://127.0.0.1:%d", daemon_admin_port());
	snprintf(ev_url, sizeof(ev_url), "ipc:///tmp/kvpool-warm-ev-%d.ipc", (int)getpid());
	snprintf(dir, sizeof(dir), "/tmp/kvpool-warm-XXXXXX");
	if (mkdtemp(dir) == NULL)
		return -1;
	snprintf(log_path, sizeof(log_path), "%s/kvpoold.log", dir);
	snprintf(pool_spec, sizeof(pool_spec), "name=kv,blocks=%d,executor=cpu,restart=warm,"
	         "session_rows=%d", ROWS, ROWS);
	return 0;
}

static int
teardown(void **state)
{
	(void)state;
	char path[192];
	const char *names[] = {"kvpoold.log", "kvpool-kv.region", "kvpool-kv.rows"};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
		unlink(path);
	}
	free(st);
	return rmdir(dir) == 0 ? 0 : -1;
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_warm_restart_survives_kills_mid_store),
		cmocka_unit_test(test_warm_restart_keeps_rows_committed_without_a_crc),
		cmocka_unit_test(test_warm_restart_region_held_and_layout_checked),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
