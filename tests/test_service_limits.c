/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What one admitted peer may hold (issue #15), against a real kvpoold on
 * loopback: the block references a pool's sessions hold in all
 * (--max-refs), the live requests one session holds
 * (--max-session-requests), the bytes of stored replies a pool keeps for
 * retries over all its sessions (--reply-cache-mib); and, on a pool with a
 * token, that every call carries the token, so a session id alone (read
 * from a log, guessed, or taken from another process) acts on nothing.
 * On main before this a session could Touch one block without end (4-16
 * bytes of bookkeeping each), one session could take all of a pool's
 * request slots, stored replies could reach max-sessions x 4 MiB, and a
 * bare session id was enough to free another session's blocks.
 */
#include "daemon_util.h"

#include "kvp_test.h"

#include <pthread.h>
#include <stdatomic.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "clients/c/kvpool.h"
#include "kvpool.pb-c.h"
#include "proto/wire.h"

static char rpc_url[128];
static pid_t daemon_pid;

/* Starts kvpoold on an ipc URL named for the test, with an admin port and extra flags. */
static void
start(const char *name, const char *const *extra)
{
	char admin[64];
	const char *args[40];
	size_t n = 0;
	snprintf(rpc_url, sizeof(rpc_url), "ipc:///tmp/kvpool-lim-%s-%d.ipc", name, (int)getpid());
	snprintf(admin, sizeof(admin), "http://127.0.0.1:%d", daemon_admin_port());
	const char *base[] = {"--rpc", rpc_url, "--admin", admin, "--events", "none",
	                      "--executor", "none", NULL};
	for (size_t i = 0; base[i]; i++)
		args[n++] = base[i];
	for (size_t i = 0; extra[i] && n < 38; i++)
		args[n++] = extra[i];
	args[n] = NULL;
	daemon_pid = daemon_start(args);
	assert_true(daemon_pid > 0);
}

static void
stop(void)
{
	pid_t pid = daemon_pid;
	daemon_pid = 0;
	assert_int_equal(daemon_stop(pid), 0);
}

/*
 * After each test: a daemon a failed test left running is stopped, so the
 * next test's daemon can take the admin port and the failure stays one.
 */
static int
stop_leftover(void **state)
{
	(void)state;
	if (daemon_pid > 0) {
		(void)daemon_stop(daemon_pid);
		daemon_pid = 0;
	}
	return 0;
}

static struct kvp_client *
open_client(const char *token)
{
	struct kvp_client_options o = {.url = rpc_url, .token = token, .client_name = "limits",
	                               .retries = KVP_RETRIES_DEFAULT};
	struct kvp_client *c = NULL;
	int rv = kvp_client_open(&o, &c);
	if (rv != KVP_OK)
		fail_msg("open: %s: %s", kvp_status_name(rv), kvp_client_open_detail());
	return c;
}

/* ---- --max-refs: every session's references together ---- */

static void
test_limits_refs_over_every_session_are_bounded(void **state)
{
	(void)state;
	/* session_refs: one session may hold them all; its own quota is tested in test_region */
	const char *extra[] = {"--max-refs", "100", "--pool",
	                       "name=default,blocks=64,block_size=4,session_refs=100",
	                       NULL};
	start("refs", extra);
	struct kvp_client *a = open_client(NULL), *b = open_client(NULL);
	int32_t ids[60];
	assert_ok(kvp_client_allocate(a, 60, ids));
	/* 60 held: 40 more may be taken, by any session. */
	assert_ok(kvp_client_touch(b, ids, 40));
	assert_status(kvp_client_touch(a, ids, 1), KVP_EBUSY);
	if (strstr(kvp_client_last_detail(a), "max-refs") == NULL)
		fail_msg("detail: %s", kvp_client_last_detail(a));
	assert_status(kvp_client_allocate(b, 1, ids + 59), KVP_EBUSY);
	/* Refused calls took nothing; freeing makes room again. */
	assert_true(metric_value("kvpool_session_refs{pool=\"default\"}") == 100);
	assert_true(metric_value("kvpool_limit_refusals_total{pool=\"default\"}") == 2);
	assert_ok(kvp_client_free(b, ids, 10));
	assert_ok(kvp_client_touch(a, ids, 10));
	kvp_client_close(b); /* its 30 references go back to the count */
	assert_true(metric_value("kvpool_session_refs{pool=\"default\"}") == 70);
	assert_ok(kvp_client_touch(a, ids, 30));
	kvp_client_close(a);
	assert_true(metric_value("kvpool_session_refs{pool=\"default\"}") == 0);
	stop();
}

/* ---- sessions found by id, whatever order they end in ---- */

/* Each live client frees and takes back its own block: another session's would be NOT_OWNER. */
static void
check_owners(struct kvp_client **c, int32_t *held, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (c[i] == NULL)
			continue;
		assert_ok(kvp_client_free(c[i], &held[i], 1));
		assert_ok(kvp_client_allocate(c[i], 1, &held[i]));
	}
}

/*
 * The daemon finds a session by its id through an index, and an ended
 * session's slot is filled by the last one: every surviving session must
 * still be itself after ends in a shuffled order and new sessions after.
 */
static void
test_limits_sessions_end_in_any_order_and_stay_themselves(void **state)
{
	enum { N = 48 };
	struct kvp_client *c[N];
	struct kvp_client_stats st;
	int32_t held[N];
	size_t order[N];
	uint64_t seed = 0x5e551005u;

	(void)state;
	const char *extra[] = {"--max-sessions", "64", "--pool",
	                       "name=default,blocks=256,block_size=4", NULL};
	start("sessidx", extra);
	print_message("seed %#llx\n", (unsigned long long)seed);
	for (size_t i = 0; i < N; i++) {
		c[i] = open_client(NULL);
		assert_ok(kvp_client_allocate(c[i], 1, &held[i]));
		order[i] = i;
	}
	for (size_t i = N - 1; i > 0; i--) { /* Fisher-Yates, seeded */
		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		size_t j = (size_t)(seed >> 33) % (i + 1), t = order[i];
		order[i] = order[j];
		order[j] = t;
	}
	for (size_t k = 0; k < N / 2; k++) {
		kvp_client_close(c[order[k]]); /* Goodbye: its block goes back */
		c[order[k]] = NULL;
		if (k % 8 == 7)
			check_owners(c, held, N);
	}
	check_owners(c, held, N);
	for (size_t k = 0; k < N / 2; k++) { /* new sessions take the freed slots */
		c[order[k]] = open_client(NULL);
		assert_ok(kvp_client_allocate(c[order[k]], 1, &held[order[k]]));
	}
	check_owners(c, held, N);
	assert_ok(kvp_client_stats(c[0], &st));
	assert_int_equal(st.sessions, N);
	assert_int_equal(st.num_free, 256 - 1 - N);
	for (size_t i = 0; i < N; i++)
		kvp_client_close(c[i]);
	stop();
}

/* ---- --max-session-requests ---- */

static int
add_request(struct kvp_client *c, uint64_t id)
{
	int64_t prompt[8] = {1, 2, 3, 4, 5, 6, 7, (int64_t)id};
	struct kvp_client_slots a = {.request_id = id, .prompt = prompt, .num_prompt = 8,
	                             .use_prefix_cache = true};
	struct kvp_client_slots_result res;
	int32_t blocks[8];
	return kvp_client_allocate_slots(c, &a, blocks, 8, &res);
}

static void
test_limits_one_session_cannot_take_every_request(void **state)
{
	(void)state;
	const char *extra[] = {"--max-session-requests", "2", "--pool",
	                       "name=default,blocks=64,block_size=4", NULL};
	start("reqs", extra);
	struct kvp_client *a = open_client(NULL), *b = open_client(NULL);
	assert_ok(add_request(a, 1));
	assert_ok(add_request(a, 2));
	assert_status(add_request(a, 3), KVP_EBUSY);
	if (strstr(kvp_client_last_detail(a), "max-session-requests") == NULL)
		fail_msg("detail: %s", kvp_client_last_detail(a));
	assert_ok(add_request(b, 1)); /* another session is not held back */
	assert_ok(kvp_client_free_request(a, 1, false));
	assert_ok(add_request(a, 3));
	kvp_client_close(a);
	kvp_client_close(b);
	stop();
}

/* ---- --reply-cache-mib: stored replies over every session ---- */

static void
test_limits_stored_replies_are_bounded_per_pool(void **state)
{
	(void)state;
	/* 9aaf83ef5's free order rotates the ids through the pool, so they reach
	 * 3-byte varints (vLLM 0.33's hands the same small ids back). */
	const char *extra[] = {"--reply-cache-mib", "1", "--max-ids", "65536", "--pool",
	                       "name=default,blocks=65536,block_size=4,vllm=9aaf83ef5", NULL};
	start("replies", extra);
	enum { SESSIONS = 4, ROUNDS = 12, N = 16000 };
	struct kvp_client *c[SESSIONS];
	static int32_t ids[SESSIONS][N];
	for (int s = 0; s < SESSIONS; s++)
		c[s] = open_client(NULL);
	double rss0 = proc_rss_bytes(daemon_pid);
	/* Each Allocate reply is ~48 KB (16,000 ids of 3 bytes) and is kept for retries. */
	for (int r = 0; r < ROUNDS; r++)
		for (int s = 0; s < SESSIONS; s++) {
			assert_ok(kvp_client_allocate(c[s], N, ids[s]));
			assert_ok(kvp_client_free(c[s], ids[s], N));
		}
	double kept = metric_value("kvpool_reply_cache_bytes{pool=\"default\"}");
	double forgotten = metric_value("kvpool_replies_forgotten_total{pool=\"default\"}");
	double rss1 = proc_rss_bytes(daemon_pid);
	print_message("stored replies %.0f bytes, %.0f forgotten; RSS %.1f -> %.1f MB\n", kept,
	              forgotten, rss0 / 1e6, rss1 / 1e6);
	/* Without the pool's budget: 4 sessions x 12 x 48 KB = 2.3 MB kept. */
	assert_true(kept > 0 && kept <= 1048576);
	assert_true(forgotten > 0);
	for (int s = 0; s < SESSIONS; s++)
		kvp_client_close(c[s]);
	assert_true(metric_value("kvpool_reply_cache_bytes{pool=\"default\"}") == 0);
	stop();
}

/* ---- a pool with a token: every call carries it ---- */

/* One raw request (a Free of block 60 in session sid) with token tok (NULL: none). */
static int
raw_free(uint64_t sid, const char *tok, char *detail, size_t cap)
{
	nng_socket s;
	nng_msg *msg = NULL;
	int32_t id = 60;
	Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
	Kvpool__V1__FreeRequest f = KVPOOL__V1__FREE_REQUEST__INIT;
	f.block_ids = &id;
	f.n_block_ids = 1;
	rq.call_id = 7;
	rq.pool = "default";
	rq.session_id = sid;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_FREE;
	rq.free = &f;
	if (tok != NULL) {
		rq.token.data = (uint8_t *)tok;
		rq.token.len = strlen(tok);
	}
	uint8_t buf[512];
	size_t len = kvpool__v1__request__pack(&rq, buf);
	assert_int_equal(nng_req0_open(&s), 0);
	assert_int_equal(nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 5000), 0);
	assert_int_equal(nng_dial(s, rpc_url, NULL, 0), 0);
	assert_int_equal(nng_send(s, buf, len, 0), 0);
	assert_int_equal(nng_recvmsg(s, &msg, 0), 0);
	Kvpool__V1__Reply *r = kvpool__v1__reply__unpack(NULL, nng_msg_len(msg), nng_msg_body(msg));
	assert_non_null(r);
	int st = kvp_wire_status(r->status);
	snprintf(detail, cap, "%s", r->detail ? r->detail : "");
	kvpool__v1__reply__free_unpacked(r, NULL);
	nng_msg_free(msg);
	nng_close(s);
	return st;
}

static void
test_limits_session_id_alone_acts_on_nothing(void **state)
{
	(void)state;
	char detail[512], tok_path[96], spec[160];
	snprintf(tok_path, sizeof(tok_path), "/tmp/kvpool-lim-tok-%d", (int)getpid());
	FILE *f = fopen(tok_path, "w");
	assert_non_null(f);
	fputs("s3cret-tok\n", f);
	fclose(f);
	snprintf(spec, sizeof(spec), "name=default,blocks=64,block_size=4,token_file=%s", tok_path);
	const char *extra[] = {"--pool", spec, NULL};
	start("token", extra);
	struct kvp_client *a = open_client("s3cret-tok");
	int32_t ids[4];
	assert_ok(kvp_client_allocate(a, 4, ids));
	assert_true(ids[0] == 1 && ids[3] == 4); /* block 60, which raw_free names, is not held */
	uint64_t sid = kvp_client_info(a)->session_id;

	/* The victim's session id, without the token, or with another: refused, distinctly. */
	assert_int_equal(raw_free(sid, NULL, detail, sizeof(detail)), KVP_EUNAUTH);
	if (strstr(detail, "carries none") == NULL)
		fail_msg("detail: %s", detail);
	assert_int_equal(raw_free(sid, "guess", detail, sizeof(detail)), KVP_EUNAUTH);
	if (strstr(detail, "wrong auth token") == NULL)
		fail_msg("detail: %s", detail);
	assert_null(strstr(detail, "s3cret")); /* never echoed */
	/* With the token the call reaches the session (block 60 is not held: NOT_OWNER). */
	assert_int_equal(raw_free(sid, "s3cret-tok", detail, sizeof(detail)), KVP_ENOTOWNER);

	/* The library sends it on every call, raw ones included, and on a resumed session. */
	assert_ok(kvp_client_touch(a, ids, 4));
	Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
	Kvpool__V1__StatsRequest st = KVPOOL__V1__STATS_REQUEST__INIT;
	uint8_t buf[128], *reply = NULL;
	size_t rlen = 0;
	rq.pool = "default";
	rq.session_id = sid;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_STATS;
	rq.stats = &st;
	assert_ok(kvp_client_raw(a, buf, kvpool__v1__request__pack(&rq, buf), &reply, &rlen));
	Kvpool__V1__Reply *r = kvpool__v1__reply__unpack(NULL, rlen, reply);
	assert_non_null(r);
	assert_int_equal(kvp_wire_status(r->status), KVP_OK);
	kvpool__v1__reply__free_unpacked(r, NULL);
	free(reply);
	struct kvp_client_options o = {.url = rpc_url, .token = "s3cret-tok", .session_id = sid};
	struct kvp_client *again = NULL;
	assert_ok(kvp_client_open(&o, &again));
	assert_ok(kvp_client_free(again, ids, 4));
	kvp_client_detach(again);
	o.token = NULL;
	assert_status(kvp_client_open(&o, &again), KVP_EUNAUTH);
	assert_ok(kvp_client_free(a, ids, 4));
	kvp_client_close(a);
	stop();
	unlink(tok_path);
}

/* ---- a session's end is released in slices ---- */

struct prober {
	struct kvp_client *c;
	atomic_int stop;
	_Atomic double window[2]; /* the Goodbye's start and end, set by the main thread */
	int inside;       /* Stats calls begun and answered within the window */
};

static void *
probe(void *arg)
{
	struct prober *pr = arg;
	struct kvp_client_stats st;
	while (!atomic_load(&pr->stop)) {
		double t0 = now_s();
		if (kvp_client_stats(pr->c, &st) != KVP_OK)
			break;
		double t1 = now_s();
		if (pr->window[0] > 0 && t0 >= pr->window[0] && (pr->window[1] == 0 || t1 <= pr->window[1]))
			pr->inside++;
	}
	return NULL;
}

static void
test_limits_goodbye_releases_in_slices(void **state)
{
	(void)state;
	enum { CHUNK = 65536, CHUNKS = 16 };
	char spec[96];
	snprintf(spec, sizeof(spec), "name=default,blocks=%d,block_size=4", CHUNK * CHUNKS + 1);
	const char *extra[] = {"--pool", spec, "--max-ids", "65536", NULL};
	start("slices", extra);
	struct kvp_client_options o = {.url = rpc_url, .timeout_ms = 60000};
	struct kvp_client *big = NULL;
	struct prober pr = {0};
	static int32_t ids[CHUNK];
	assert_ok(kvp_client_open(&o, &big));
	assert_ok(kvp_client_open(&o, &pr.c));
	for (int k = 0; k < CHUNKS; k++)
		assert_ok(kvp_client_allocate(big, CHUNK, ids));
	pthread_t th;
	assert_int_equal(pthread_create(&th, NULL, probe, &pr), 0);
	sleep_ms(50);
	pr.window[0] = now_s();
	kvp_client_close(big); /* Goodbye: 1,048,576 references */
	pr.window[1] = now_s();
	atomic_store(&pr.stop, 1);
	pthread_join(th, NULL);
	print_message("Goodbye of 1,048,576 references took %.1f ms; %d Stats calls of another "
	              "session were answered meanwhile\n",
	              (pr.window[1] - pr.window[0]) * 1e3, pr.inside);
	/* In one lock hold (before this) no call of the pool was answered meanwhile. */
	assert_true(pr.inside >= 2);
	struct kvp_client_stats st;
	assert_ok(kvp_client_stats(pr.c, &st));
	assert_int_equal(st.num_free, CHUNK * CHUNKS); /* all released by the time Goodbye answered */
	kvp_client_close(pr.c);
	stop();
}

/* ---- the open-files limit: said on both sides ---- */

/* Whether the file at path contains needle, within wait_ms. */
static bool
log_says(const char *path, const char *needle, int wait_ms)
{
	static char buf[1 << 16];
	for (int t = 0; t <= wait_ms; t += 50) {
		FILE *f = fopen(path, "r");
		size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
		if (f)
			fclose(f);
		buf[n] = '\0';
		if (strstr(buf, needle) != NULL)
			return true;
		sleep_ms(50);
	}
	return false;
}

static void
test_limits_open_files_limit_is_said_on_both_sides(void **state)
{
	(void)state;
	if (access("/usr/bin/prlimit", X_OK) != 0)
		skip(); /* util-linux: in every Debian */
	char log[96];
	snprintf(rpc_url, sizeof(rpc_url), "ipc:///tmp/kvpool-lim-fds-%d.ipc", (int)getpid());
	snprintf(log, sizeof(log), "/tmp/kvpool-lim-fds-%d.log", (int)getpid());
	const char *argv[] = {"/usr/bin/prlimit", "--nofile=40:40", KVPOOLD_PATH, "--rpc", rpc_url,
	                      "--admin", "none", "--events", "none", "--executor", "none", NULL};
	daemon_pid = kvp_spawn(argv, log);
	assert_true(daemon_pid > 0);
	enum { MAX = 64 };
	struct kvp_client *c[MAX];
	int n = 0, rv = KVP_OK;
	for (; n < MAX; n++) {
		struct kvp_client_options o = {.url = rpc_url, .connect_timeout_ms = n ? 1500 : 10000};
		if ((rv = kvp_client_open(&o, &c[n])) != KVP_OK)
			break;
	}
	print_message("%d clients connected under a limit of 40 files: %s\n", n,
	              kvp_client_open_detail());
	assert_int_equal(rv, KVP_EUNAVAILABLE);
	assert_true(n > 0);
	if (strstr(kvp_client_open_detail(), "something listens") == NULL)
		fail_msg("detail: %s", kvp_client_open_detail());
	assert_true(log_says(log, "near the open-files limit", 3000));
	for (int i = 0; i < n; i++)
		kvp_client_close(c[i]);
	assert_true(log_says(log, "clear of the open-files limit", 3000));
	assert_true(log_says(log, "open-files limit (each connection takes one) limit=40", 0));
	stop();
	unlink(log);
}

/* ---- SIGTERM while the heaviest calls run ---- */

struct loader {
	struct kvp_client *c;
	atomic_int *stop;
	long calls;
};

/* A Lookup of 65,536 tokens with a 1 KiB LoRA name and salt: the most hashing one call may ask. */
static int
heaviest_lookup(struct kvp_client *c)
{
	static const int64_t tokens[65536]; /* read only: shared by every thread */
	char name[1025] = "", salt[1025] = "";
	memset(name, 'n', 1024);
	memset(salt, 's', 1024);
	struct kvp_request_keys keys = {.lora_name = name, .lora_path = salt, .cache_salt = salt};
	struct kvp_client_lookup q = {.tokens = tokens, .num_tokens = 65536, .keys = &keys};
	int32_t ids[64];
	uint32_t hit, hit_tokens;
	return kvp_client_lookup(c, &q, ids, 64, &hit, &hit_tokens);
}

static void *
load(void *arg)
{
	struct loader *l = arg;
	while (!atomic_load(l->stop) && heaviest_lookup(l->c) == KVP_OK)
		l->calls++;
	return NULL;
}

static void
test_limits_sigterm_under_load_exits_within_drain(void **state)
{
	(void)state;
	enum { THREADS = 4 };
	const char *extra[] = {"--drain-ms", "1000", "--pool", "name=default,blocks=4096,block_size=16",
	                       NULL};
	start("drain", extra);
	atomic_int stop = 0;
	struct loader l[THREADS];
	pthread_t th[THREADS];
	for (int i = 0; i < THREADS; i++) {
		struct kvp_client_options o = {.url = rpc_url, .timeout_ms = 2000, .retries = 1};
		l[i] = (struct loader){.stop = &stop};
		assert_ok(kvp_client_open(&o, &l[i].c));
		assert_int_equal(pthread_create(&th[i], NULL, load, &l[i]), 0);
	}
	sleep_ms(500);
	double t0 = now_s();
	assert_int_equal(kill(daemon_pid, SIGTERM), 0);
	int rv = daemon_stop(daemon_pid);
	daemon_pid = 0; /* reaped */
	double took = now_s() - t0;
	atomic_store(&stop, 1);
	long calls = 0;
	for (int i = 0; i < THREADS; i++) {
		pthread_join(th[i], NULL);
		calls += l[i].calls;
		kvp_client_detach(l[i].c);
	}
	print_message("SIGTERM after %ld Lookups of 65,536 tokens: exit %d in %.2f s "
	              "(drain-ms 1000)\n", calls, rv, took);
	assert_int_equal(rv, 0);
	assert_true(calls > 0);
	assert_true(took < 1.0 + 2.0); /* drain-ms and the release of what the sessions hold */
}

/* ---- a connection reset under a call ---- */

struct inflight {
	struct kvp_client *c;
	atomic_int started;
	int rv;
	char detail[256];
};

static void *
slow_lookup(void *arg)
{
	struct inflight *f = arg;
	atomic_store(&f->started, 1);
	f->rv = heaviest_lookup(f->c);
	snprintf(f->detail, sizeof(f->detail), "%s", kvp_client_last_detail(f->c));
	return NULL;
}

/*
 * nng fails a call whose connection closes under it with ECONNRESET (the
 * client does its own resending). The daemon dies mid-call and a new one
 * takes its place: the call is sent again and answered by the new daemon
 * (which knows no such session), not reported as a transport failure.
 */
static void
test_limits_call_survives_its_connection_reset(void **state)
{
	(void)state;
	const char *extra[] = {"--pool", "name=default,blocks=4096,block_size=16", NULL};
	start("reset", extra);
	struct inflight f = {.c = open_client(NULL)};
	pthread_t th;
	assert_int_equal(pthread_create(&th, NULL, slow_lookup, &f), 0);
	while (!atomic_load(&f.started))
		sleep_ms(1);
	sleep_ms(3); /* the call is on its way or being hashed (tens of ms) */
	assert_int_equal(kill(daemon_pid, SIGKILL), 0);
	pid_t killed = daemon_pid;
	daemon_pid = 0; /* reaped below, whatever the assertion says */
	assert_int_equal(waitpid(killed, NULL, 0), killed);
	start("reset", extra);
	pthread_join(th, NULL);
	print_message("the call after its daemon died: %s: %s\n", kvp_status_name(f.rv), f.detail);
	assert_int_not_equal(f.rv, KVP_EINTERNAL);
	assert_null(strstr(f.detail, "Connection reset"));
	kvp_client_detach(f.c);
	/*
	 * The call may have been answered before the kill, and then nothing has
	 * waited for the new daemon: a SIGTERM before it sets its handlers would
	 * kill it outright. A client that opens has been served by it.
	 */
	kvp_client_close(open_client(NULL));
	stop();
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_limits_refs_over_every_session_are_bounded, stop_leftover),
		cmocka_unit_test_teardown(test_limits_sessions_end_in_any_order_and_stay_themselves,
		                          stop_leftover),
		cmocka_unit_test_teardown(test_limits_one_session_cannot_take_every_request, stop_leftover),
		cmocka_unit_test_teardown(test_limits_stored_replies_are_bounded_per_pool, stop_leftover),
		cmocka_unit_test_teardown(test_limits_session_id_alone_acts_on_nothing, stop_leftover),
		cmocka_unit_test_teardown(test_limits_goodbye_releases_in_slices, stop_leftover),
		cmocka_unit_test_teardown(test_limits_open_files_limit_is_said_on_both_sides, stop_leftover),
		cmocka_unit_test_teardown(test_limits_sigterm_under_load_exits_within_drain, stop_leftover),
		cmocka_unit_test_teardown(test_limits_call_survives_its_connection_reset, stop_leftover),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
