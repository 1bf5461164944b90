/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vLLM's event wire end to end, read by a consumer we did not shape
 * (tests/vllm_consumer.py: Debian's pyzmq and msgpack, decoding as llm-d
 * and Dynamo do). A real kvpoold runs a random workload; the consumer misses
 * a stretch of batches (its SUB socket closed, or what arrives discarded
 * where kvpoold connects and would queue for it), repairs the gap through the
 * replay socket, and must end with an index equal to the pool's Snapshot
 * and the same events, in the same order, as the native stream delivered.
 * Run twice: map events, replay topic on, dp rank 0, ipc; and array events,
 * no replay topic, dp rank 1, tcp with the consumer bound (centralised).
 */
#include "daemon_util.h"

#include "kvp_test.h"

#include <fcntl.h>
#include <poll.h>

#include "common/block_hash.h"
#include "clients/c/kvpool.h"
#include "clients/c/subscriber.h"

#define MAX_LINES 4096

struct lines {
	char *v[MAX_LINES];
	size_t n;
};

static void
lines_add(struct lines *l, const char *s)
{
	assert_true(l->n < MAX_LINES);
	l->v[l->n++] = strdup(s);
}

static void
lines_free(struct lines *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->v[i]);
	l->n = 0;
}

/* The native stream's events, in the consumer's digest form. */
static void
on_batch(void *ctx, const char *pool, uint64_t epoch, uint64_t seq, uint64_t ts,
         const struct kvp_event_batch *b)
{
	struct lines *l = ctx;
	(void)pool, (void)epoch, (void)seq, (void)ts;
	for (size_t i = 0; i < kvp_event_batch_count(b); i++) {
		struct kvp_event ev;
		char s[4096];
		size_t k = 0;
		assert_ok(kvp_event_batch_get(b, i, &ev));
		if (ev.type == KVP_EVENT_ALL_CLEARED) {
			lines_add(l, "C");
			continue;
		}
		k += (size_t)snprintf(s, sizeof(s), "%s %u ",
		                      ev.type == KVP_EVENT_BLOCK_STORED ? "S" : "R", ev.group_idx);
		for (uint32_t h = 0; h < ev.num_hashes && k < sizeof(s) - 24; h++)
			k += (size_t)snprintf(s + k, sizeof(s) - k, "%s%llu", h ? "," : "",
			                      (unsigned long long)kvp_hash_event_id(
			                              ev.hashes + (size_t)h * ev.hash_len, ev.hash_len));
		lines_add(l, s);
	}
}

static void
on_reset(void *ctx, const char *pool, uint64_t epoch, uint64_t next_seq,
         const struct kvp_snapshot_entry *e, size_t n)
{
	(void)ctx, (void)pool, (void)epoch, (void)e;
	assert_int_equal(next_seq, 0); /* the native subscriber starts before any call */
	assert_int_equal(n, 0);
}

struct consumer {
	pid_t pid;
	FILE *in, *out;
};

static void
consumer_start(struct consumer *c, const char *const *args)
{
	int to[2], from[2];
	const char *argv[24] = {"/usr/bin/python3", VLLM_CONSUMER_PY};
	size_t n = 2;
	for (size_t i = 0; args[i] && n < 23; i++)
		argv[n++] = args[i];
	argv[n] = NULL;
	assert_int_equal(pipe(to), 0);
	assert_int_equal(pipe(from), 0);
	c->pid = fork();
	if (c->pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		dup2(to[0], 0);
		dup2(from[1], 1);
		close(to[1]);
		close(from[0]);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	close(to[0]);
	close(from[1]);
	c->in = fdopen(to[1], "w");
	c->out = fdopen(from[0], "r");
}

/* The consumer's next line (newline stripped); fails the test on EOF or "error". */
static void
consumer_line(struct consumer *c, char *buf, size_t cap)
{
	struct pollfd p = {.fd = fileno(c->out), .events = POLLIN};
	if (poll(&p, 1, 30000) != 1)
		fail_msg("the vLLM-wire consumer said nothing for 30 s");
	if (fgets(buf, (int)cap, c->out) == NULL)
		fail_msg("the vLLM-wire consumer exited early");
	buf[strcspn(buf, "\n")] = '\0';
	if (strncmp(buf, "error", 5) == 0)
		fail_msg("vLLM-wire consumer: %s", buf);
}

static void
consumer_say(struct consumer *c, const char *cmd, const char *want)
{
	char line[256];
	fprintf(c->in, "%s\n", cmd);
	fflush(c->in);
	if (want) {
		consumer_line(c, line, sizeof(line));
		assert_string_equal(line, want);
	}
}

/* Random calls (the same mix as test_events), polling the native subscriber. */
static void
workload(struct kvp_client *cl, struct kvp_sub *sub, unsigned *seed, int steps,
         int32_t *held, int *nheld)
{
	for (int step = 0; step < steps; step++) {
		int op = rand_r(seed) % 5;
		if (op == 0 && *nheld < 60) {
			uint32_t n = 1 + (uint32_t)(rand_r(seed) % 4);
			int32_t ids[4];
			if (kvp_client_allocate(cl, n, ids) == KVP_OK)
				for (uint32_t k = 0; k < n; k++)
					held[(*nheld)++] = ids[k];
		} else if (op == 1 && *nheld >= 2) {
			int64_t tok[8];
			for (int t = 0; t < 8; t++)
				tok[t] = rand_r(seed) % 3;
			struct kvp_client_cache ca = {.block_ids = held + *nheld - 2, .num_block_ids = 2,
			                              .num_full_blocks = 2, .tokens = tok, .num_tokens = 8};
			int rv = kvp_client_cache(cl, &ca, NULL);
			assert_true(rv == KVP_OK || rv == KVP_ESTATE);
		} else if (op == 2 && *nheld > 0) {
			int k = rand_r(seed) % *nheld;
			assert_ok(kvp_client_free(cl, &held[k], 1));
			held[k] = held[--*nheld];
		} else if (op == 3) {
			int32_t id = 1 + rand_r(seed) % 63;
			assert_ok(kvp_client_evict(cl, &id, 1, NULL));
		} else if (*nheld == 0 && rand_r(seed) % 8 == 0) {
			assert_ok(kvp_client_reset(cl));
		}
		assert_ok(kvp_sub_poll(sub, 0));
	}
}

static int
cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

struct variant {
	const char *format;     /* map | array */
	int replay_topic;
	int rank;
	bool centralised;       /* tcp, the consumer binds, kvpoold connects */
	int delim;              /* the consumer's replay envelope: REQ-style or bare DEALER */
};

static void
run_variant(const struct variant *v)
{
	char rpc[128], ev[128], admin[64], pub[128], rep[128], sub_ep[128], rep_ep[128];
	char rank_s[8], rtopic_s[8], delim_s[8], pool[128], n_s[32], line[4096];
	int base = 24000 + (int)(getpid() % 2000) * 4; /* below the ephemeral range (32768-) */
	unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();

	printf("vLLM wire %s, replay topic %d, dp rank %d, %s: seed %u\n", v->format,
	       v->replay_topic, v->rank, v->centralised ? "tcp centralised" : "ipc", seed);
	snprintf(rpc, sizeof(rpc), "ipc:///tmp/kvpool-vw-%d.ipc", (int)getpid());
	snprintf(ev, sizeof(ev), "ipc:///tmp/kvpool-vw-ev-%d.ipc", (int)getpid());
	snprintf(admin, sizeof(admin), "http://127.0.0.1:%d", daemon_admin_port());
	if (v->centralised) {
		/* kvpoold connects to base (+rank); the consumer binds there. */
		snprintf(pub, sizeof(pub), "tcp://127.0.0.1:%d", base);
		snprintf(sub_ep, sizeof(sub_ep), "tcp://127.0.0.1:%d", base + v->rank);
		snprintf(rep, sizeof(rep), "tcp://127.0.0.1:%d", base + 2);
		snprintf(rep_ep, sizeof(rep_ep), "tcp://127.0.0.1:%d", base + 2 + v->rank);
	} else {
		snprintf(pub, sizeof(pub), "ipc:///tmp/kvpool-vw-pub-%d.ipc", (int)getpid());
		snprintf(rep, sizeof(rep), "ipc:///tmp/kvpool-vw-rep-%d.ipc", (int)getpid());
		memcpy(sub_ep, pub, sizeof(pub));
		memcpy(rep_ep, rep, sizeof(rep));
	}
	snprintf(pool, sizeof(pool), "name=ev,blocks=64,block_size=4,seed=0,dp_rank=%d", v->rank);
	snprintf(rtopic_s, sizeof(rtopic_s), "%d", v->replay_topic);
	const char *args[] = {"--rpc", rpc, "--events", ev, "--admin", admin, "--pool", pool,
	                      "--lease-ms", "60000", "--vllm-events", pub, "--vllm-replay", rep,
	                      "--vllm-format", v->format, "--vllm-replay-topic", rtopic_s,
	                      "--vllm-pod", "testpod", NULL};
	pid_t d = daemon_start(args);
	assert_true(d > 0);

	snprintf(rank_s, sizeof(rank_s), "%d", v->rank);
	snprintf(delim_s, sizeof(delim_s), "%d", v->delim);
	const char *cargs[] = {"--sub", sub_ep, "--replay", rep_ep, "--topic", "kv@testpod@ev",
	                       "--rank", rank_s, "--replay-topic", rtopic_s, "--delim", delim_s,
	                       v->centralised ? "--bind" : NULL, NULL};
	struct consumer c;
	consumer_start(&c, cargs);
	consumer_line(&c, line, sizeof(line));
	assert_string_equal(line, "ready");

	/* Each try bounded (1 s, no retries): 100 tries wait 100 s at most, not 100 x 15 s. */
	struct kvp_client_options o = {.url = rpc, .pool = "ev", .client_name = "vllm-wire-test",
	                               .timeout_ms = 1000, .retries = 0};
	struct kvp_client *cl = NULL;
	for (int i = 0; i < 100; i++) {
		int st = 0;
		if (waitpid(d, &st, WNOHANG) == d)
			fail_msg("kvpoold exited at start (status %d); its stderr says why", st);
		if (kvp_client_open(&o, &cl) == KVP_OK)
			break;
		kvp_client_close(cl);
		cl = NULL;
		sleep_ms(50);
	}
	assert_non_null(cl);
	struct lines native = {0}, wire = {0}, want = {0}, got = {0};
	struct kvp_sub_options so = {.events_url = ev, .rpc_url = rpc, .pool = "ev"};
	struct kvp_sub_handler h = {.ctx = &native, .reset = on_reset, .batch = on_batch};
	struct kvp_sub *sub = NULL;
	assert_ok(kvp_sub_open(&so, &h, &sub));
	sleep_ms(300); /* both subscriptions reach their publishers (slow joiners) */

	int32_t held[64];
	int nheld = 0;
	workload(cl, sub, &seed, 100, held, &nheld);
	/* Lose a stretch: a bound PUB drops for a closed SUB; a connecting PUB queues for it. */
	if (v->centralised)
		consumer_say(&c, "drop", "dropping");
	else
		consumer_say(&c, "pause", "paused");
	workload(cl, sub, &seed, 100, held, &nheld); /* the consumer misses these */
	consumer_say(&c, "resume", "resumed");
	sleep_ms(200);
	workload(cl, sub, &seed, 100, held, &nheld);

	struct kvp_snapshot *snap = NULL;
	assert_ok(kvp_client_snapshot(cl, &snap));
	struct kvp_sub_stats st = {0};
	for (int i = 0; i < 200; i++) {
		assert_ok(kvp_sub_poll(sub, 20));
		assert_ok(kvp_sub_get_stats(sub, "ev", &st));
		if (st.next_seq >= snap->next_seq)
			break;
	}
	assert_int_equal(st.next_seq, snap->next_seq);
	assert_true(snap->next_seq > 10);

	/* The vLLM wire numbers the same batches from 0: expect them all. */
	snprintf(n_s, sizeof(n_s), "expect %llu", (unsigned long long)snap->next_seq);
	consumer_say(&c, n_s, NULL);
	unsigned gaps = 0, replays = 0, batches = 0;
	for (;;) {
		consumer_line(&c, line, sizeof(line));
		if (strcmp(line, "done") == 0)
			break;
		if (strncmp(line, "event ", 6) == 0)
			lines_add(&wire, line + 6);
		else if (strncmp(line, "entry ", 6) == 0)
			lines_add(&got, line + 6);
		else if (sscanf(line, "stats gaps %u replays %u batches %u", &gaps, &replays,
		                &batches) != 3)
			fail_msg("unexpected consumer line: %s", line);
	}
	/* Bounded: a consumer stuck on its way out is killed and named, not waited on. */
	if (kvp_wait_exit(c.pid, 10000) != 0)
		fail_msg("the vLLM-wire consumer did not exit 0 within 10 s of saying done");
	printf("  %llu batches, %zu events; consumer: %u gap(s), %u replay(s)\n",
	       (unsigned long long)snap->next_seq, native.n, gaps, replays);
	assert_int_equal(batches, snap->next_seq);
	assert_true(gaps >= 1);    /* the missed stretch was seen as a gap in seq */
	assert_true(replays >= 1); /* and came back through replay */

	/* Same events, same order, on both wires. */
	assert_int_equal(wire.n, native.n);
	for (size_t i = 0; i < native.n; i++)
		if (strcmp(wire.v[i], native.v[i]) != 0)
			fail_msg("event %zu: vLLM wire '%s', native '%s'", i, wire.v[i], native.v[i]);

	/* The consumer's index is the pool's cached set, block counts included. */
	for (size_t i = 0; i < snap->num_entries; i++) {
		const struct kvp_snapshot_entry *e = &snap->entries[i];
		snprintf(line, sizeof(line), "%u %llu %u", e->group_idx,
		         (unsigned long long)kvp_hash_event_id(e->hash, e->hash_len), e->num_blocks);
		lines_add(&want, line);
	}
	assert_int_equal(got.n, want.n);
	qsort(got.v, got.n, sizeof(char *), cmp_str);
	qsort(want.v, want.n, sizeof(char *), cmp_str);
	for (size_t i = 0; i < want.n; i++)
		assert_string_equal(got.v[i], want.v[i]);

	kvp_snapshot_free(snap);
	kvp_sub_close(sub);
	kvp_client_close(cl);
	fclose(c.in);
	fclose(c.out);
	lines_free(&native);
	lines_free(&wire);
	lines_free(&want);
	lines_free(&got);
	assert_int_equal(daemon_stop(d), 0);
}

static void
test_vllm_wire_map_events_topic_replies_rank0_ipc(void **state)
{
	(void)state;
	struct variant v = {.format = "map", .replay_topic = 1, .rank = 0, .delim = 1};
	run_variant(&v);
}

static void
test_vllm_wire_array_events_bare_replies_rank1_centralised(void **state)
{
	(void)state;
	struct variant v = {.format = "array", .replay_topic = 0, .rank = 1, .centralised = true,
	                    .delim = 0};
	run_variant(&v);
}

/* Runs kvpoold with an open pool and a pool with a token on the vLLM wire; returns /metrics. */
static void
token_pool_metrics(bool token_pools, char *metrics, size_t cap)
{
	char rpc[128], pub[128], tok[96], sec[192], admin[64];
	int port = daemon_admin_port();
	snprintf(rpc, sizeof(rpc), "ipc:///tmp/kvpool-vwt-%d.ipc", (int)getpid());
	/* tcp: the second pool's dp_rank offsets the port, as vLLM does */
	snprintf(pub, sizeof(pub), "tcp://127.0.0.1:%d", 16000 + (int)(getpid() % 2000) * 2);
	snprintf(tok, sizeof(tok), "/tmp/kvpool-vwt-tok-%d", (int)getpid());
	snprintf(sec, sizeof(sec), "name=sec,blocks=16,block_size=4,dp_rank=1,token_file=%s", tok);
	snprintf(admin, sizeof(admin), "http://127.0.0.1:%d", port);
	FILE *f = fopen(tok, "w");
	assert_non_null(f);
	fputs("t0ken\n", f);
	fclose(f);
	const char *args[] = {"--rpc", rpc, "--events", "none", "--admin", admin,
	                      "--vllm-events", pub, "--vllm-replay", "none",
	                      "--vllm-token-pools", token_pools ? "1" : "0",
	                      "--pool", "name=open,blocks=16,block_size=4,dp_rank=0",
	                      "--pool", sec, NULL};
	pid_t d = daemon_start(args);
	const char *pools[] = {"open", "sec"};
	for (int p = 0; p < 2; p++) {
		struct kvp_client_options o = {.url = rpc, .pool = pools[p], .timeout_ms = 2000,
		                               .token = p ? "t0ken" : NULL};
		struct kvp_client *c = NULL;
		int32_t id;
		int64_t toks[4] = {7, 8, 9, 10};
		int rv = KVP_EBUSY;
		for (int i = 0; i < 50 && rv != KVP_OK; i++)
			if ((rv = kvp_client_open(&o, &c)) != KVP_OK)
				sleep_ms(50);
		assert_ok(rv);
		assert_ok(kvp_client_allocate(c, 1, &id));
		struct kvp_client_cache ca = {.block_ids = &id, .num_block_ids = 1,
		                              .num_full_blocks = 1, .tokens = toks, .num_tokens = 4};
		assert_ok(kvp_client_cache(c, &ca, NULL));
		kvp_client_close(c);
	}
	assert_int_equal(http_get(port, "/metrics", metrics, cap), 200);
	assert_int_equal(daemon_stop(d), 0);
	unlink(tok);
}

/*
 * The vLLM wire has no authentication, so a pool with a token stays off it
 * unless the operator says otherwise (issue #15 item 4): its events are
 * never published there by default.
 */
static void
test_vllm_wire_token_pool_stays_off_unless_asked(void **state)
{
	static char m[1 << 16];
	(void)state;
	token_pool_metrics(false, m, sizeof(m));
	assert_non_null(strstr(m, "kvpool_vllm_batches_published_total{pool=\"open\"} 1"));
	assert_null(strstr(m, "kvpool_vllm_batches_published_total{pool=\"sec\"}"));
	token_pool_metrics(true, m, sizeof(m));
	assert_non_null(strstr(m, "kvpool_vllm_batches_published_total{pool=\"open\"} 1"));
	assert_non_null(strstr(m, "kvpool_vllm_batches_published_total{pool=\"sec\"} 1"));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_vllm_wire_map_events_topic_replies_rank0_ipc),
		cmocka_unit_test(test_vllm_wire_array_events_bare_replies_rank1_centralised),
		cmocka_unit_test(test_vllm_wire_token_pool_stays_off_unless_asked),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
