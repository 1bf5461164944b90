/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The event stream end to end: a real kvpoold publishing on nng PUB, the
 * subscriber library repairing gaps by Replay and Snapshot, and a reference
 * index that must equal the pool's cached set (by Snapshot) after each step.
 */
#include "daemon_util.h"

#include "kvp_test.h"

#include "common/block_hash.h"
#include "clients/c/kvindex.h"
#include "clients/c/kvpool.h"
#include "clients/c/subscriber.h"

#include <nng/nng.h>
#include <nng/protocol/pubsub0/sub.h>

#include "proto/event_seal.h"
#include "proto/event_wire.h"

static char rpc_url[128], ev_url[128], admin[64], tok_path[96], sec_pool[160];
static const char *use_token; /* the token subscribe() and client() present; NULL: none */
static pid_t daemon_pid;

#define SEC_TOKEN "s3cret-token"

static pid_t
start(void)
{
	const char *args[] = {"--rpc", rpc_url, "--events", ev_url, "--admin", admin,
	                      "--replay-batches", "64", "--lease-ms", "60000",
	                      "--pool", "name=ev,blocks=64,block_size=4,seed=0,hash_algo=sha256_cbor",
	                      "--pool", "name=other,blocks=16,block_size=4",
	                      "--pool", sec_pool, NULL};
	return daemon_start(args);
}

static int
setup(void **state)
{
	(void)state;
	snprintf(rpc_url, sizeof(rpc_url), "ipc:///tmp/kvpool-evtest-%d.ipc", (int)getpid());
	snprintf(ev_url, sizeof(ev_url), "ipc:///tmp/kvpool-evtest-pub-%d.ipc", (int)getpid());
	snprintf(admin, sizeof(admin), "http://127.0.0.1:%d", daemon_admin_port());
	snprintf(tok_path, sizeof(tok_path), "/tmp/kvpool-evtest-tok-%d", (int)getpid());
	snprintf(sec_pool, sizeof(sec_pool), "name=sec,blocks=16,block_size=4,token_file=%s",
	         tok_path);
	FILE *f = fopen(tok_path, "w");
	if (f == NULL || fputs(SEC_TOKEN "\n", f) < 0 || fclose(f) != 0)
		return -1;
	daemon_pid = start();
	return daemon_pid > 0 ? 0 : -1;
}

static int
teardown(void **state)
{
	(void)state;
	unlink(tok_path);
	return daemon_stop(daemon_pid) == 0 ? 0 : -1;
}

/* What a test's subscriber saw. */
struct seen {
	struct kvp_index *ix;
	int resets, batches, stored, removed, cleared, index_errors;
	/* the first BlockStored's fields */
	int got_stored;
	uint32_t st_hashes, st_tokens, st_block_size, st_group;
	uint64_t st_hash0_id;
	int64_t st_token0, st_lora_id;
	bool st_has_parent, st_has_lora_id;
	char st_lora[16], st_medium[8], st_kind[32];
	uint8_t st_extra0[64];
	size_t st_extra0_len;
	/* the latest BlockStored's parent and first hash */
	bool last_has_parent;
	uint64_t last_parent_id, last_hash0_id;
	int64_t last_token0;
};

static void
on_reset(void *ctx, const char *pool, uint64_t epoch, uint64_t next_seq,
         const struct kvp_snapshot_entry *e, size_t n)
{
	struct seen *s = ctx;
	(void)epoch;
	(void)next_seq;
	s->resets++;
	assert_ok(kvp_index_reset(s->ix, e, n));
}

static void
on_batch(void *ctx, const char *pool, uint64_t epoch, uint64_t seq, uint64_t ts,
         const struct kvp_event_batch *b)
{
	struct seen *s = ctx;
	(void)epoch;
	(void)seq;
	assert_true(ts > 0);
	s->batches++;
	for (size_t i = 0; i < kvp_event_batch_count(b); i++) {
		struct kvp_event ev;
		assert_ok(kvp_event_batch_get(b, i, &ev));
		if (ev.type == KVP_EVENT_BLOCK_STORED) {
			s->stored++;
			s->last_has_parent = ev.parent != NULL;
			s->last_parent_id = ev.parent ? kvp_hash_event_id(ev.parent, ev.hash_len) : 0;
			s->last_hash0_id = ev.num_hashes ? kvp_hash_event_id(ev.hashes, ev.hash_len) : 0;
			s->last_token0 = ev.num_tokens ? ev.token_ids[0] : -1;
			if (!s->got_stored) {
				s->got_stored = 1;
				s->st_hashes = ev.num_hashes;
				s->st_tokens = ev.num_tokens;
				s->st_block_size = ev.block_size;
				s->st_group = ev.group_idx;
				s->st_hash0_id = kvp_hash_event_id(ev.hashes, ev.hash_len);
				s->st_token0 = ev.num_tokens ? ev.token_ids[0] : -1;
				s->st_has_parent = ev.parent != NULL;
				s->st_has_lora_id = ev.has_lora_id;
				s->st_lora_id = ev.lora_id;
				snprintf(s->st_lora, sizeof(s->st_lora), "%s", ev.lora_name ? ev.lora_name : "");
				snprintf(s->st_medium, sizeof(s->st_medium), "%s", ev.medium ? ev.medium : "");
				snprintf(s->st_kind, sizeof(s->st_kind), "%s", ev.spec_kind ? ev.spec_kind : "");
				s->st_extra0_len = ev.extra_key_offsets[1] - ev.extra_key_offsets[0];
				if (s->st_extra0_len <= sizeof(s->st_extra0))
					memcpy(s->st_extra0, ev.extra_keys, s->st_extra0_len);
			}
		} else if (ev.type == KVP_EVENT_BLOCK_REMOVED) {
			s->removed++;
		} else {
			s->cleared++;
		}
	}
	if (kvp_index_apply(s->ix, b) != KVP_OK)
		s->index_errors++;
}

static struct kvp_sub *
subscribe(struct seen *s, const char *pool, int recv_buffer)
{
	struct kvp_sub_options o = {.events_url = ev_url, .rpc_url = rpc_url, .pool = pool,
	                            .timeout_ms = 2000, .recv_buffer = recv_buffer,
	                            .token = use_token};
	struct kvp_sub_handler h = {.ctx = s, .reset = on_reset, .batch = on_batch};
	struct kvp_sub *sub = NULL;
	int rv = KVP_EBUSY;

	memset(s, 0, sizeof(*s));
	assert_ok(kvp_index_create(&s->ix));
	for (int i = 0; i < 50 && rv != KVP_OK; i++) {
		rv = kvp_sub_open(&o, &h, &sub);
		if (rv != KVP_OK)
			sleep_ms(50);
	}
	assert_ok(rv);
	sleep_ms(100); /* let the SUB connection come up before events flow */
	return sub;
}

static struct kvp_client *
client(const char *pool)
{
	struct kvp_client_options o = {.url = rpc_url, .pool = pool, .timeout_ms = 2000, .retries = 3,
	                               .token = use_token};
	struct kvp_client *c = NULL;
	int rv = KVP_EBUSY;
	for (int i = 0; i < 50 && rv != KVP_OK; i++)
		if ((rv = kvp_client_open(&o, &c)) != KVP_OK)
			sleep_ms(50);
	assert_ok(rv);
	return c;
}

/* Polls until the subscriber has every batch the pool published, then compares. */
static void
assert_index_matches_pool(struct kvp_sub *sub, struct seen *s, struct kvp_client *c)
{
	struct kvp_snapshot *snap = NULL;
	struct kvp_sub_stats st;

	assert_ok(kvp_client_snapshot(c, &snap));
	for (int i = 0; i < 200; i++) {
		kvp_sub_get_stats(sub, NULL, &st);
		if (st.epoch == snap->epoch && st.next_seq >= snap->next_seq)
			break;
		int rv = kvp_sub_poll(sub, 20);
		if (rv != KVP_OK)
			fail_msg("poll: %s: %s", kvp_status_name(rv), kvp_sub_last_detail(sub));
	}
	kvp_sub_get_stats(sub, NULL, &st);
	assert_int_equal(st.epoch, snap->epoch);
	assert_int_equal(st.next_seq, snap->next_seq);
	assert_int_equal(s->index_errors, 0);
	if (!kvp_index_equals(s->ix, snap->entries, snap->num_entries))
		fail_msg("index (%zu entries) differs from the pool's snapshot (%zu entries)",
		         kvp_index_size(s->ix), snap->num_entries);
	kvp_snapshot_free(snap);
}

static void
test_events_carry_every_field(void **state)
{
	struct seen s;
	struct kvp_sub *sub = subscribe(&s, "ev", 0);
	struct kvp_client *c = client("ev");
	const struct kvp_mm_feature mm[] = {{"img", 2, 3}};
	const struct kvp_request_keys keys = {.lora_name = "L", .lora_path = "/p", .mm = mm,
	                                      .num_mm = 1, .cache_salt = "S"};
	int64_t tok[8];
	int32_t ids[64];

	(void)state;
	assert_int_equal(s.resets, 1);
	for (int i = 0; i < 8; i++)
		tok[i] = i;
	assert_ok(kvp_client_allocate(c, 2, ids));
	struct kvp_client_cache ca = {.block_ids = ids, .num_block_ids = 2, .num_full_blocks = 2,
	                              .tokens = tok, .num_tokens = 8, .keys = &keys,
	                              .has_lora_id = true, .lora_id = 7};
	assert_ok(kvp_client_cache(c, &ca, NULL));
	assert_index_matches_pool(sub, &s, c);
	assert_true(s.got_stored);
	assert_int_equal(s.st_hashes, 2);
	assert_int_equal(s.st_tokens, 8);
	assert_int_equal(s.st_token0, 0);
	assert_int_equal(s.st_block_size, 4);
	assert_int_equal(s.st_group, 0);
	assert_false(s.st_has_parent);
	assert_true(s.st_has_lora_id);
	assert_int_equal(s.st_lora_id, 7);
	assert_string_equal(s.st_lora, "L");
	assert_string_equal(s.st_medium, "CPU");
	assert_string_equal(s.st_kind, "full_attention");
	/* The first block's hash with LoRA L at /p, image at 2, salt S (seed "0"), as
	 * vLLM 0.33 hashes it (test_block_hash's golden ALL); the event carries the
	 * keys in vLLM's event form, untagged and without the path. */
	uint8_t h0[32];
	kvp_test_unhex("3fc0cb18daaebd7927762b5cd0b8add2e87a28c32dc6794e76f722ddff782bf8", h0, 32);
	assert_int_equal(s.st_hash0_id, kvp_hash_event_id(h0, 32));
	uint8_t x0[32];
	size_t xl = kvp_test_unhex("83614c8263696d67026153", x0, sizeof(x0));
	assert_int_equal(s.st_extra0_len, xl);
	assert_memory_equal(s.st_extra0, x0, xl);

	/* Chunked caching: a third block, from the parent hash; the event's parent
	 * is the second block's hash and its tokens start at position 8. */
	int32_t three[3] = {ids[0], ids[1], 0};
	int64_t more[4] = {8, 9, 10, 11};
	uint8_t chain[3 * 32];
	size_t nchain = 0;
	struct kvp_hasher *hs;
	int64_t all[12];
	for (int i = 0; i < 12; i++)
		all[i] = i;
	assert_ok(kvp_hasher_create("0", &hs));
	assert_ok(kvp_hash_request(hs, &keys, all, 12, 4, NULL, 0, chain, 3, &nchain));
	kvp_hasher_destroy(hs);
	assert_ok(kvp_client_allocate(c, 1, &three[2]));
	struct kvp_client_cache ch = {.block_ids = three, .num_block_ids = 3,
	                              .num_cached_blocks = 2, .num_full_blocks = 3, .tokens = more,
	                              .num_tokens = 4, .parent_hash = chain + 32, .keys = &keys};
	assert_ok(kvp_client_cache(c, &ch, NULL));
	assert_index_matches_pool(sub, &s, c);
	assert_true(s.last_has_parent);
	assert_int_equal(s.last_parent_id, kvp_hash_event_id(chain + 32, 32));
	assert_int_equal(s.last_hash0_id, kvp_hash_event_id(chain + 64, 32));
	assert_int_equal(s.last_token0, 8);
	assert_ok(kvp_client_free(c, &three[2], 1));

	/* Evictions: free, then allocate every block. */
	assert_ok(kvp_client_free(c, (int32_t[]){ids[1], ids[0]}, 2));
	assert_ok(kvp_client_allocate(c, 63, ids));
	assert_index_matches_pool(sub, &s, c);
	assert_int_equal(s.removed, 3);
	assert_int_equal(kvp_index_size(s.ix), 0);
	assert_ok(kvp_client_free(c, ids, 63));
	assert_ok(kvp_client_reset(c));
	assert_index_matches_pool(sub, &s, c);
	assert_int_equal(s.cleared, 1);
	kvp_client_close(c);
	kvp_sub_close(sub);
	kvp_index_destroy(s.ix);
}

/* Cache n fresh blocks, one call (one batch) each, and free them. */
static void
churn(struct kvp_client *c, int n, int64_t base)
{
	for (int i = 0; i < n; i++) {
		int32_t id;
		int64_t tok[4] = {base + i * 4, base + i * 4 + 1, base + i * 4 + 2, base + i * 4 + 3};
		assert_ok(kvp_client_allocate(c, 1, &id));
		struct kvp_client_cache ca = {.block_ids = &id, .num_block_ids = 1, .num_full_blocks = 1,
		                              .tokens = tok, .num_tokens = 4};
		assert_ok(kvp_client_cache(c, &ca, NULL));
		assert_ok(kvp_client_free(c, &id, 1));
	}
}

static void
test_events_gap_within_ring_is_replayed(void **state)
{
	struct seen s;
	struct kvp_sub *sub = subscribe(&s, "ev", 2); /* a tiny queue: it will overflow */
	struct kvp_client *c = client("ev");
	struct kvp_sub_stats st;

	(void)state;
	churn(c, 40, 100000); /* 40 batches (each Cache, plus evictions) while stalled */
	assert_index_matches_pool(sub, &s, c);
	kvp_sub_get_stats(sub, NULL, &st);
	assert_true(st.gaps >= 1);
	assert_true(st.replayed >= 1);
	assert_int_equal(st.resets, 1); /* only the initial snapshot */
	kvp_client_close(c);
	kvp_sub_close(sub);
	kvp_index_destroy(s.ix);
}

static void
test_events_gap_beyond_ring_takes_snapshot(void **state)
{
	struct seen s;
	struct kvp_sub *sub = subscribe(&s, "ev", 2);
	struct kvp_client *c = client("ev");
	struct kvp_sub_stats st;

	(void)state;
	churn(c, 150, 200000); /* over the 64-batch ring */
	assert_index_matches_pool(sub, &s, c);
	kvp_sub_get_stats(sub, NULL, &st);
	assert_true(st.resets >= 2);
	kvp_client_close(c);
	kvp_sub_close(sub);
	kvp_index_destroy(s.ix);
}

static void
test_events_filter_by_pool_and_several_subscribers(void **state)
{
	struct seen a, b, o;
	struct kvp_sub *sa = subscribe(&a, "ev", 0), *sb = subscribe(&b, "ev", 0);
	struct kvp_sub *so = subscribe(&o, "other", 0);
	struct kvp_client *c = client("ev"), *co = client("other");

	(void)state;
	churn(c, 10, 300000);
	churn(co, 3, 400000);
	assert_index_matches_pool(sa, &a, c);
	assert_index_matches_pool(sb, &b, c);
	assert_index_matches_pool(so, &o, co);
	assert_int_equal(a.batches, b.batches);
	assert_true(o.batches >= 3 && o.batches < a.batches);
	kvp_client_close(c);
	kvp_client_close(co);
	kvp_sub_close(sa);
	kvp_sub_close(sb);
	kvp_sub_close(so);
	kvp_index_destroy(a.ix);
	kvp_index_destroy(b.ix);
	kvp_index_destroy(o.ix);
}

/* One subscriber following two pools on one socket keeps each exact. */
struct two {
	struct kvp_index *ev, *other;
	int ev_batches, other_batches, errors;
};

static void
two_reset(void *ctx, const char *pool, uint64_t epoch, uint64_t next_seq,
          const struct kvp_snapshot_entry *e, size_t n)
{
	struct two *t = ctx;
	(void)epoch;
	(void)next_seq;
	assert_ok(kvp_index_reset(strcmp(pool, "ev") == 0 ? t->ev : t->other, e, n));
}

static void
two_batch(void *ctx, const char *pool, uint64_t epoch, uint64_t seq, uint64_t ts,
          const struct kvp_event_batch *b)
{
	struct two *t = ctx;
	(void)epoch;
	(void)seq;
	(void)ts;
	bool ev = strcmp(pool, "ev") == 0;
	*(ev ? &t->ev_batches : &t->other_batches) += 1;
	if (kvp_index_apply(ev ? t->ev : t->other, b) != KVP_OK)
		t->errors++;
}

static void
test_events_one_subscriber_follows_two_pools(void **state)
{
	struct two t = {0};
	const char *pools[] = {"ev", "other"};
	struct kvp_sub_options o = {.events_url = ev_url, .rpc_url = rpc_url, .pools = pools,
	                            .num_pools = 2, .timeout_ms = 2000};
	struct kvp_sub_handler h = {.ctx = &t, .reset = two_reset, .batch = two_batch};
	struct kvp_sub *sub = NULL;
	struct kvp_client *c = client("ev"), *co = client("other");
	struct kvp_sub_stats a, b;

	(void)state;
	assert_ok(kvp_index_create(&t.ev));
	assert_ok(kvp_index_create(&t.other));
	assert_ok(kvp_sub_open(&o, &h, &sub));
	sleep_ms(100);
	churn(c, 6, 700000);
	churn(co, 4, 800000);
	struct kvp_snapshot *se = NULL, *so = NULL;
	assert_ok(kvp_client_snapshot(c, &se));
	assert_ok(kvp_client_snapshot(co, &so));
	for (int i = 0; i < 200; i++) {
		assert_ok(kvp_sub_get_stats(sub, "ev", &a));
		assert_ok(kvp_sub_get_stats(sub, "other", &b));
		if (a.next_seq >= se->next_seq && b.next_seq >= so->next_seq)
			break;
		assert_ok(kvp_sub_poll(sub, 20));
	}
	assert_int_equal(a.next_seq, se->next_seq);
	assert_int_equal(b.next_seq, so->next_seq);
	assert_int_not_equal(a.epoch, b.epoch); /* each pool has its own epoch */
	assert_true(kvp_index_equals(t.ev, se->entries, se->num_entries));
	assert_true(kvp_index_equals(t.other, so->entries, so->num_entries));
	assert_int_equal(t.errors, 0);
	assert_status(kvp_sub_get_stats(sub, "nope", &a), KVP_ENOTFOUND);
	kvp_snapshot_free(se);
	kvp_snapshot_free(so);
	kvp_client_close(c);
	kvp_client_close(co);
	kvp_sub_close(sub);
	kvp_index_destroy(t.ev);
	kvp_index_destroy(t.other);
}

/* Random operations, bounded, with the index compared to the pool after each. */
static void
test_events_random_run_index_stays_exact(void **state)
{
	struct seen s;
	struct kvp_sub *sub = subscribe(&s, "ev", 0);
	struct kvp_client *c = client("ev");
	int32_t held[64];
	int nheld = 0;
	unsigned seed = (unsigned)time(NULL);

	(void)state;
	printf("events random run: seed %u\n", seed);
	for (int step = 0; step < 150; step++) {
		int op = rand_r(&seed) % 5;
		if (op == 0 && nheld < 60) {
			uint32_t n = 1 + (uint32_t)(rand_r(&seed) % 4);
			int32_t ids[4];
			if (kvp_client_allocate(c, n, ids) == KVP_OK)
				for (uint32_t k = 0; k < n; k++)
					held[nheld++] = ids[k];
		} else if (op == 1 && nheld >= 2) {
			int64_t tok[8];
			for (int t = 0; t < 8; t++)
				tok[t] = rand_r(&seed) % 3; /* few prefixes: duplicates across blocks */
			struct kvp_client_cache ca = {.block_ids = held + nheld - 2, .num_block_ids = 2,
			                              .num_full_blocks = 2, .tokens = tok, .num_tokens = 8};
			int rv = kvp_client_cache(c, &ca, NULL);
			assert_true(rv == KVP_OK || rv == KVP_ESTATE);
		} else if (op == 2 && nheld > 0) {
			int k = rand_r(&seed) % nheld;
			assert_ok(kvp_client_free(c, &held[k], 1));
			held[k] = held[--nheld];
		} else if (op == 3) {
			int32_t id = 1 + rand_r(&seed) % 63;
			assert_ok(kvp_client_evict(c, &id, 1, NULL));
		} else if (nheld == 0 && rand_r(&seed) % 8 == 0) {
			assert_ok(kvp_client_reset(c));
		}
		assert_index_matches_pool(sub, &s, c);
	}
	kvp_client_close(c);
	kvp_sub_close(sub);
	kvp_index_destroy(s.ix);
}

/* A restarted daemon has a new epoch: the subscriber starts over from a snapshot. */
static void
test_events_daemon_restart_is_an_epoch_reset(void **state)
{
	struct seen s;
	struct kvp_sub *sub = subscribe(&s, "ev", 0);
	struct kvp_client *c = client("ev");
	struct kvp_sub_stats before, after;

	(void)state;
	churn(c, 5, 500000);
	assert_index_matches_pool(sub, &s, c);
	kvp_sub_get_stats(sub, NULL, &before);
	kvp_client_detach(c);
	assert_int_equal(daemon_stop(daemon_pid), 0);
	daemon_pid = start();
	c = client("ev");
	churn(c, 3, 600000);
	assert_index_matches_pool(sub, &s, c);
	kvp_sub_get_stats(sub, NULL, &after);
	assert_int_not_equal(after.epoch, before.epoch);
	assert_true(after.resets > before.resets);
	/* Lag is counted in the new epoch only: caught up means 0, though the old epoch
	 * had reached a higher seq (issue #15 item 7). */
	assert_true(before.next_seq > after.next_seq);
	assert_int_equal(after.lag, 0);
	kvp_client_close(c);
	kvp_sub_close(sub);
	kvp_index_destroy(s.ix);
}

/*
 * A pool with a token seals its published stream (issue #15 item 4): a peer
 * that subscribes to the PUB socket without the token gets messages it
 * cannot read, a subscriber without the token is refused at open, and one
 * with the token follows the pool exactly, across a daemon restart (a new
 * key) too.
 */
static void
test_events_token_pool_stream_is_sealed(void **state)
{
	nng_socket raw;
	struct seen s;
	struct kvp_sub *sub = NULL;
	struct kvp_sub_options no_tok = {.events_url = ev_url, .rpc_url = rpc_url, .pool = "sec",
	                                 .timeout_ms = 2000};
	struct kvp_sub_handler h = {.ctx = &s, .reset = on_reset, .batch = on_batch};
	struct kvp_event_batch evs;
	int sealed = 0;

	(void)state;
	assert_int_equal(nng_sub0_open(&raw), 0);
	assert_int_equal(nng_socket_set(raw, NNG_OPT_SUB_SUBSCRIBE, "sec", 4), 0);
	assert_int_equal(nng_socket_set_ms(raw, NNG_OPT_RECVTIMEO, 300), 0);
	assert_int_equal(nng_dial(raw, ev_url, NULL, 0), 0);
	memset(&s, 0, sizeof(s));
	assert_ok(kvp_index_create(&s.ix));
	assert_status(kvp_sub_open(&no_tok, &h, &sub), KVP_EUNAUTH);
	kvp_index_destroy(s.ix);

	use_token = SEC_TOKEN;
	sub = subscribe(&s, "sec", 0);
	struct kvp_client *c = client("sec");
	churn(c, 4, 424242);
	assert_index_matches_pool(sub, &s, c);
	assert_true(s.stored >= 4);
	assert_int_equal(s.last_token0, 424242 + 3 * 4);

	/* What the peer without the token received: sealed batches it cannot decode. */
	kvp_event_batch_init(&evs);
	for (;;) {
		nng_msg *m;
		if (nng_recvmsg(raw, &m, 0) != 0)
			break;
		const uint8_t *b = nng_msg_body(m);
		size_t len = nng_msg_len(m);
		struct kvp_wire_batch_hdr hdr;
		struct kvp_seal_key wrong = {.id = 1};
		uint8_t *plain = NULL;
		size_t plen;
		assert_true(len > 4 && memcmp(b, "sec", 4) == 0);
		assert_status(kvp_wire_events_decode(b + 4, len - 4, &hdr, &evs), KVP_EUNAUTH);
		assert_int_equal(kvp_event_batch_count(&evs), 0);
		int rv = kvp_seal_open(&wrong, b + 4, len - 4, &plain, &plen, NULL);
		assert_true(rv == KVP_ENOTFOUND || rv == KVP_EINVAL);
		assert_null(plain);
		nng_msg_free(m);
		sealed++;
	}
	assert_true(sealed >= 4);
	kvp_event_batch_fini(&evs);
	nng_close(raw);

	/* A restart draws a new key: the subscriber fetches it and goes on. */
	kvp_client_detach(c);
	assert_int_equal(daemon_stop(daemon_pid), 0);
	daemon_pid = start();
	c = client("sec");
	churn(c, 2, 525252);
	assert_index_matches_pool(sub, &s, c); /* the new epoch seen, so the new key was fetched */
	int batches = s.batches;
	churn(c, 1, 626262);
	assert_index_matches_pool(sub, &s, c);
	assert_true(s.batches > batches);
	assert_int_equal(s.last_token0, 626262);
	kvp_client_close(c);
	kvp_sub_close(sub);
	kvp_index_destroy(s.ix);
	use_token = NULL;
}

static void
nop_reset(void *ctx, const char *pool, uint64_t epoch, uint64_t next_seq,
          const struct kvp_snapshot_entry *entries, size_t n)
{
	(void)ctx, (void)pool, (void)epoch, (void)next_seq, (void)entries, (void)n;
}

/* No daemon: the subscriber says so within its connect timeout (it waited
 * timeout x attempts, 15 s by default, before). */
static void
test_events_no_daemon_is_unavailable_quickly(void **state)
{
	char rpc[96], ev[96];
	struct kvp_sub_handler h = {.reset = nop_reset};
	struct kvp_sub *sub = NULL;
	struct timespec t0, t1;
	(void)state;
	snprintf(rpc, sizeof(rpc), "ipc:///tmp/kvpool-nobody-rpc-%d.ipc", (int)getpid());
	snprintf(ev, sizeof(ev), "ipc:///tmp/kvpool-nobody-ev-%d.ipc", (int)getpid());
	struct kvp_sub_options o = {.events_url = ev, .rpc_url = rpc, .connect_timeout_ms = 300};
	clock_gettime(CLOCK_MONOTONIC, &t0);
	assert_int_equal(kvp_sub_open(&o, &h, &sub), KVP_EUNAVAILABLE);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	assert_true(s >= 0.25 && s < 2.0);
	assert_null(sub);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_events_carry_every_field),
		cmocka_unit_test(test_events_gap_within_ring_is_replayed),
		cmocka_unit_test(test_events_gap_beyond_ring_takes_snapshot),
		cmocka_unit_test(test_events_filter_by_pool_and_several_subscribers),
		cmocka_unit_test(test_events_one_subscriber_follows_two_pools),
		cmocka_unit_test(test_events_random_run_index_stays_exact),
		cmocka_unit_test(test_events_daemon_restart_is_an_epoch_reset),
		cmocka_unit_test(test_events_token_pool_stream_is_sealed),
		cmocka_unit_test(test_events_no_daemon_is_unavailable_quickly),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
