/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Snapshot in pages against a real kvpoold whose message limit makes its
 * pages small: a paged snapshot taken while another client keeps changing
 * the pool is exact at its next_seq (the quiet pool's final snapshot equals
 * it plus the batches published after it); a key cached in more blocks
 * than a page holds comes whole; an unpaged request (an older client) gets
 * the whole snapshot when it fits and MESSAGE_TOO_LARGE when it does not.
 */
#include "daemon_util.h"

#include "kvp_test.h"

#include <pthread.h>

#include "clients/c/kvindex.h"
#include "clients/c/kvpool.h"
#include "clients/c/subscriber.h"
#include "proto/wire.h"

enum { NBLOCKS = 2048, BS = 4 };

static char rpc_url[128], ev_url[128], admin[64];
static pid_t daemon_pid;

static int
setup(void **state)
{
	(void)state;
	snprintf(rpc_url, sizeof(rpc_url), "ipc:///tmp/kvpool-snaptest-%d.ipc", (int)getpid());
	snprintf(ev_url, sizeof(ev_url), "ipc:///tmp/kvpool-snaptest-pub-%d.ipc", (int)getpid());
	snprintf(admin, sizeof(admin), "http://127.0.0.1:%d", daemon_admin_port());
	/* 64 KiB messages: a page holds 682 entries of 32-byte hashes. */
	const char *args[] = {"--rpc", rpc_url, "--events", ev_url, "--admin", admin,
	                      "--max-msg-bytes", "65536", "--replay-batches", "100000",
	                      "--pool", "name=snap,blocks=2048,block_size=4,seed=0", NULL};
	daemon_pid = daemon_start(args);
	return daemon_pid > 0 ? 0 : -1;
}

static int
teardown(void **state)
{
	(void)state;
	return daemon_stop(daemon_pid) == 0 ? 0 : -1;
}

static struct kvp_client *
client(void)
{
	struct kvp_client_options o = {.url = rpc_url, .pool = "snap", .timeout_ms = 5000,
	                               .retries = 3};
	struct kvp_client *c = NULL;
	int rv = KVP_EBUSY;
	for (int i = 0; i < 50 && rv != KVP_OK; i++)
		if ((rv = kvp_client_open(&o, &c)) != KVP_OK)
			sleep_ms(50);
	assert_ok(rv);
	return c;
}

/* Caches n fresh blocks, each under its own one-block prompt (tag makes them distinct). */
static void
fill(struct kvp_client *c, uint32_t n, int64_t tag, bool release)
{
	for (uint32_t done = 0; done < n;) {
		uint32_t k = n - done < 64 ? n - done : 64;
		int32_t ids[64];
		assert_ok(kvp_client_allocate(c, k, ids));
		for (uint32_t i = 0; i < k; i++) {
			int64_t tok[BS] = {tag, (int64_t)(done + i), 7, 7};
			struct kvp_client_cache ca = {.block_ids = &ids[i], .num_block_ids = 1,
			                              .num_full_blocks = 1, .tokens = tok, .num_tokens = BS};
			assert_ok(kvp_client_cache(c, &ca, NULL));
		}
		if (release)
			assert_ok(kvp_client_free(c, ids, k));
		done += k;
	}
}

/* Entries strictly increasing in map-key order: shorter hashes, bytes, group. */
static void
assert_ordered(const struct kvp_snapshot *s)
{
	for (size_t i = 1; i < s->num_entries; i++) {
		const struct kvp_snapshot_entry *a = &s->entries[i - 1], *b = &s->entries[i];
		int d = a->hash_len != b->hash_len ? (a->hash_len < b->hash_len ? -1 : 1)
		                                    : memcmp(a->hash, b->hash, a->hash_len);
		if (d > 0 || (d == 0 && a->group_idx >= b->group_idx))
			fail_msg("entries %zu and %zu out of order", i - 1, i);
	}
}

/* ---- a paged snapshot under churn is exact at its next_seq ---- */

struct churn {
	volatile int stop;
	unsigned seed;
	int ops;
};

static void *
churn_main(void *arg)
{
	struct churn *ch = arg;
	struct kvp_client *c = client();
	int32_t held[256];
	int nheld = 0;

	while (!ch->stop && ch->ops < 3000) {
		int op = rand_r(&ch->seed) % 4;
		if (op == 0 && nheld < 250) {
			int32_t ids[4];
			if (kvp_client_allocate(c, 4, ids) == KVP_OK)
				for (int k = 0; k < 4; k++)
					held[nheld++] = ids[k];
		} else if (op == 1 && nheld >= 2) {
			int64_t tok[2 * BS];
			for (int t = 0; t < 2 * BS; t++)
				tok[t] = rand_r(&ch->seed) % 2000;
			struct kvp_client_cache ca = {.block_ids = held + nheld - 2, .num_block_ids = 2,
			                              .num_full_blocks = 2, .tokens = tok,
			                              .num_tokens = 2 * BS};
			(void)kvp_client_cache(c, &ca, NULL); /* ESTATE: already cached */
		} else if (op == 2 && nheld > 0) {
			int k = rand_r(&ch->seed) % nheld;
			(void)kvp_client_free(c, &held[k], 1);
			held[k] = held[--nheld];
		} else {
			int32_t id = 1 + rand_r(&ch->seed) % (NBLOCKS - 1);
			(void)kvp_client_evict(c, &id, 1, NULL);
		}
		ch->ops++;
	}
	kvp_client_close(c);
	return NULL;
}

/* Replayed batches applied to an index (the test's own view of the stream). */
struct replayed {
	struct kvp_index *ix;
	struct kvp_event_batch b;
};

static void
on_replayed(void *ctx, const uint8_t *bytes, size_t len)
{
	struct replayed *r = ctx;
	uint64_t epoch, seq;

	assert_ok(kvp_event_batch_decode(bytes, len, &epoch, &seq, NULL, &r->b));
	assert_ok(kvp_index_apply(r->ix, &r->b));
}

static void
test_snapshot_pages_under_churn_are_exact(void **state)
{
	struct kvp_client *c = client();
	struct churn ch = {.seed = (unsigned)time(NULL)};
	struct kvp_snapshot *snaps[12] = {0}, *fin = NULL;
	size_t ns = 0;
	pthread_t t;

	(void)state;
	printf("snapshot churn: seed %u\n", ch.seed);
	fill(c, 1500, 1, true); /* 1500 keys cached: three 682-entry pages */
	assert_int_equal(pthread_create(&t, NULL, churn_main, &ch), 0);
	while (ns < N_ELEMS(snaps)) {
		/* Small pages, so events land between them. */
		assert_ok(kvp_client_snapshot_paged(c, ns % 2 ? 37 : 0, &snaps[ns]));
		assert_ordered(snaps[ns]);
		ns++;
		sleep_ms(20);
	}
	ch.stop = 1;
	assert_int_equal(pthread_join(t, NULL), 0);
	printf("snapshot churn: %d ops by the other client\n", ch.ops);
	assert_true(ch.ops > 0);
	assert_ok(kvp_client_snapshot(c, &fin));
	assert_ordered(fin);
	for (size_t i = 0; i < ns; i++) {
		struct replayed rp = {0};
		bool available = false;
		uint64_t next = 0;
		assert_int_equal(snaps[i]->epoch, fin->epoch);
		kvp_event_batch_init(&rp.b);
		assert_ok(kvp_index_create(&rp.ix));
		assert_ok(kvp_index_reset(rp.ix, snaps[i]->entries, snaps[i]->num_entries));
		if (snaps[i]->next_seq < fin->next_seq) {
			assert_ok(kvp_client_replay(c, fin->epoch, snaps[i]->next_seq, &available, &next,
			                            on_replayed, &rp));
			assert_true(available);
		}
		if (!kvp_index_equals(rp.ix, fin->entries, fin->num_entries))
			fail_msg("snapshot %zu (next_seq %llu, %zu entries) plus the later batches is not "
			         "the final snapshot (next_seq %llu, %zu entries)", i,
			         (unsigned long long)snaps[i]->next_seq, snaps[i]->num_entries,
			         (unsigned long long)fin->next_seq, fin->num_entries);
		kvp_index_destroy(rp.ix);
		kvp_event_batch_fini(&rp.b);
		kvp_snapshot_free(snaps[i]);
	}
	kvp_snapshot_free(fin);
	assert_ok(kvp_client_reset(c)); /* the next test starts empty */
	kvp_client_close(c);
}

/* ---- a key in more blocks than a page holds ---- */

static void
test_snapshot_key_in_many_blocks_comes_whole(void **state)
{
	struct kvp_client *c = client();
	struct kvp_snapshot *s = NULL;
	int32_t ids[20];
	int64_t tok[BS] = {42, 42, 42, 42};

	(void)state;
	fill(c, 30, 2, true);
	assert_ok(kvp_client_allocate(c, 20, ids));
	for (int i = 0; i < 20; i++) {
		struct kvp_client_cache ca = {.block_ids = &ids[i], .num_block_ids = 1,
		                              .num_full_blocks = 1, .tokens = tok, .num_tokens = BS};
		assert_ok(kvp_client_cache(c, &ca, NULL)); /* the same hash in 20 blocks */
	}
	assert_ok(kvp_client_snapshot_paged(c, 4, &s));
	assert_ordered(s);
	assert_int_equal(s->num_entries, 31);
	uint32_t most = 0, blocks = 0;
	for (size_t i = 0; i < s->num_entries; i++) {
		blocks += s->entries[i].num_blocks;
		most = s->entries[i].num_blocks > most ? s->entries[i].num_blocks : most;
	}
	assert_int_equal(most, 20);
	assert_int_equal(blocks, 50);
	kvp_snapshot_free(s);
	assert_ok(kvp_client_free(c, ids, 20));
	assert_ok(kvp_client_reset(c));
	kvp_client_close(c);
}

/* ---- an older client's unpaged request ---- */

static int
unpaged(struct kvp_client *c, size_t *entries)
{
	Kvpool__V1__SnapshotRequest m = KVPOOL__V1__SNAPSHOT_REQUEST__INIT;
	Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
	uint8_t buf[64], *reply = NULL;
	size_t len, rlen = 0;

	rq.call_case = KVPOOL__V1__REQUEST__CALL_SNAPSHOT;
	rq.snapshot = &m;
	rq.pool = (char *)kvp_client_info(c)->pool;
	rq.session_id = kvp_client_info(c)->session_id;
	assert_true(kvpool__v1__request__get_packed_size(&rq) <= sizeof(buf));
	len = kvpool__v1__request__pack(&rq, buf);
	assert_ok(kvp_client_raw(c, buf, len, &reply, &rlen));
	Kvpool__V1__Reply *r = kvpool__v1__reply__unpack(NULL, rlen, reply);
	assert_non_null(r);
	int st = kvp_wire_status(r->status);
	*entries = r->result_case == KVPOOL__V1__REPLY__RESULT_SNAPSHOT ? r->snapshot->n_entries : 0;
	if (st == KVP_OK)
		assert_false(r->snapshot->more);
	else
		if (strstr(r->detail, "pages") == NULL)
			fail_msg("detail: %s", r->detail);
	kvpool__v1__reply__free_unpacked(r, NULL);
	free(reply);
	return st;
}

static void
test_snapshot_unpaged_request_whole_or_too_large(void **state)
{
	struct kvp_client *c = client();
	size_t n = 0;

	(void)state;
	fill(c, 600, 3, true);
	assert_ok(unpaged(c, &n));
	assert_int_equal(n, 600);
	fill(c, 200, 4, true); /* 800 keys: more than one page */
	assert_status(unpaged(c, &n), KVP_ETOOLARGE);
	assert_ok(kvp_client_reset(c));
	kvp_client_close(c);
}

/* ---- two million cached blocks ---- */

static void
test_snapshot_two_million_blocks_in_pages(void **state)
{
	enum { BIG = 2000000, STEP = 65536 };
	char url[128], ev[128], spec[96];
	struct kvp_client_options o = {.url = url, .pool = "big", .timeout_ms = 30000, .retries = 1};
	struct kvp_client *c = NULL;
	struct kvp_snapshot *s = NULL;
	int32_t *ids = malloc(STEP * sizeof(*ids));
	uint8_t *hashes = malloc((size_t)STEP * KVP_HASH_LEN);
	int rv = KVP_EBUSY;

	(void)state;
	assert_non_null(ids);
	assert_non_null(hashes);
	snprintf(url, sizeof(url), "ipc:///tmp/kvpool-snapbig-%d.ipc", (int)getpid());
	snprintf(ev, sizeof(ev), "ipc:///tmp/kvpool-snapbig-pub-%d.ipc", (int)getpid());
	snprintf(spec, sizeof(spec), "name=big,blocks=%d,block_size=4,executor=none", BIG + 1);
	const char *args[] = {"--rpc", url, "--events", ev, "--admin", "none", "--pool", spec, NULL};
	pid_t pid = daemon_start(args);
	assert_true(pid > 0);
	for (int i = 0; i < 100 && rv != KVP_OK; i++)
		if ((rv = kvp_client_open(&o, &c)) != KVP_OK)
			sleep_ms(100);
	assert_ok(rv);
	/* Every block cached under its own hash (given, not hashed from tokens). */
	for (uint32_t done = 0; done < BIG;) {
		uint32_t k = BIG - done < STEP ? BIG - done : STEP;
		assert_ok(kvp_client_allocate(c, k, ids));
		memset(hashes, 0, (size_t)k * KVP_HASH_LEN);
		for (uint32_t i = 0; i < k; i++) {
			uint32_t v = done + i;
			memcpy(hashes + (size_t)i * KVP_HASH_LEN, &v, sizeof(v));
		}
		struct kvp_client_cache ca = {.block_ids = ids, .num_block_ids = k,
		                              .num_full_blocks = k, .hashes = hashes, .num_hashes = k};
		assert_ok(kvp_client_cache(c, &ca, NULL));
		done += k;
	}
	double t0 = now_s();
	assert_ok(kvp_client_snapshot(c, &s));
	printf("snapshot of %zu keys in pages: %.2f s\n", s->num_entries, now_s() - t0);
	assert_int_equal(s->num_entries, BIG);
	assert_ordered(s);
	for (size_t i = 0; i < s->num_entries; i++)
		if (s->entries[i].num_blocks != 1 || s->entries[i].hash_len != KVP_HASH_LEN)
			fail_msg("entry %zu: %u blocks, %zu-byte hash", i, s->entries[i].num_blocks,
			         s->entries[i].hash_len);
	kvp_snapshot_free(s);
	kvp_client_close(c);
	assert_int_equal(daemon_stop(pid), 0);
	free(ids);
	free(hashes);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_snapshot_pages_under_churn_are_exact),
		cmocka_unit_test(test_snapshot_key_in_many_blocks_comes_whole),
		cmocka_unit_test(test_snapshot_unpaged_request_whole_or_too_large),
		cmocka_unit_test(test_snapshot_two_million_blocks_in_pages),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
