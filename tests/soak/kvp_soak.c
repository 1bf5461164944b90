/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvp-soak: a real kvpoold under a long mixed load on loopback (issue #15),
 * not part of the default test run (`ctest -C soak`, or run it):
 *
 *   kvp-soak [--seconds N] [--quick]      (default 600 s)
 *
 * Three scheduler threads run request-level work (prompts sharing one of 8
 * prefixes, decode steps, finished and preempted requests) and block-level
 * work (Allocate, Touch, Free, Lookup), each call timed; every few seconds
 * one of them drops its session without Goodbye, as a crashed client does,
 * and a child process that holds blocks is SIGKILLed. Beside them: a
 * subscriber that never reads the event stream, and every 30 s a peer that
 * pipelines requests over tcp and never reads its replies.
 *
 * Every 30 s it prints the daemon's RSS and the window's call latency (p50,
 * p99). At the end it checks: the daemon's RSS at most 1.25x its first
 * window's plus 16 MiB; the last window's p99 within 2x of the first's
 * (skipped with --quick); after the leases run out, every block free, no
 * session or request left; and kvpoold's own exit status (0: its drain
 * found the pool's invariants intact). Exit 0 if all hold, 1 otherwise.
 */
#include "daemon_util.h"

#include <errno.h>
#include <fcntl.h>
#include <nng/nng.h>
#include <nng/protocol/pubsub0/sub.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "clients/c/kvpool.h"

#define WORKERS 3
#define WINDOW_S 30
#define MAX_SAMPLES 400000 /* per window: more calls than that are not sampled */
#define LEASE_MS 2000
#define BLOCKS 2048

static char ipc_url[128], tcp_url[128], ev_url[128], admin[64];
static pid_t daemon_pid;
static atomic_bool stop;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static uint32_t samples[MAX_SAMPLES]; /* µs, this window's calls */
static size_t nsamples;
static atomic_ulong calls, failures, detached, killed, floods;
static char why[4][192]; /* the first failures, as "call: status (detail)" */

static uint64_t
rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* Keeps the first few failures' reasons for the report. */
static void
fail(const char *call, int rv, const char *detail, double at)
{
	unsigned long n = atomic_fetch_add(&failures, 1);
	if (n < sizeof(why) / sizeof(why[0]))
		snprintf(why[n], sizeof(why[n]), "%s after %.3f s: %s (%s)", call, at, kvp_status_name(rv),
		         detail ? detail : "");
}

/* Times one call's status: anything but OK and the load's expected refusals is a failure. */
static void
record(struct kvp_client *c, const char *call, double t0, int rv)
{
	uint32_t us = (uint32_t)((now_s() - t0) * 1e6);
	atomic_fetch_add(&calls, 1);
	if (rv != KVP_OK && rv != KVP_ENOSPACE)
		fail(call, rv, kvp_client_last_detail(c), us / 1e6);
	pthread_mutex_lock(&mu);
	if (nsamples < MAX_SAMPLES)
		samples[nsamples++] = us;
	pthread_mutex_unlock(&mu);
}

#define TIMED(rv, call)                            \
	do {                                       \
		double t0_ = now_s();              \
		(rv) = (call);                     \
		record(c, #call, t0_, (rv));       \
	} while (0)

#define SOAK_TOKEN "soak-token"

static struct kvp_client *
open_client(const char *url, const char *name)
{
	/* The pool has a token: every call carries it, and its events are sealed. */
	struct kvp_client_options o = {.url = url, .client_name = name, .timeout_ms = 5000,
	                               .retries = KVP_RETRIES_DEFAULT, .token = SOAK_TOKEN};
	struct kvp_client *c = NULL;
	double t0 = now_s();
	int rv = kvp_client_open(&o, &c);
	if (rv != KVP_OK)
		fail("kvp_client_open", rv, kvp_client_open_detail(), now_s() - t0);
	return rv == KVP_OK ? c : NULL;
}

/* One session's life: a few hundred calls, then Goodbye, or (sometimes) none. */
static void
session(uint64_t *s, int worker)
{
	enum { REQS = 16 };
	struct kvp_client *c = open_client(worker % 2 ? tcp_url : ipc_url, "soak");
	static _Thread_local int64_t prompt[512];
	int32_t ids[64], held[256];
	size_t nheld = 0;
	bool live[REQS] = {false};
	struct kvp_client_slots_result res;

	if (c == NULL) {
		sleep_ms(100);
		return;
	}
	for (int op = 0, n = 200 + (int)(rnd(s) % 400); op < n && !atomic_load(&stop); op++) {
		uint64_t r = rnd(s), req = r % REQS;
		int rv;
		switch (r >> 8 & 7) {
		case 0: case 1: case 2: { /* a request: a new prompt, or decode steps */
			struct kvp_client_slots a = {.request_id = req, .use_prefix_cache = true};
			int64_t tok = (int64_t)(r >> 20);
			if (!live[req]) {
				size_t len = 64 + r % 400, prefix = (r >> 12) % 8;
				for (size_t k = 0; k < len; k++)
					prompt[k] = k < 48 ? (int64_t)(prefix * 1000 + k) : (int64_t)(rnd(s) % 50000);
				a.prompt = prompt;
				a.num_prompt = len;
			} else {
				a.new_tokens = &tok;
				a.num_new_token_ids = 1;
				a.num_new_tokens = 1;
			}
			TIMED(rv, kvp_client_allocate_slots(c, &a, ids, 64, &res));
			if (rv == KVP_OK)
				live[req] = true;
			break;
		}
		case 3: /* finished, or preempted */
			if (live[req]) {
				TIMED(rv, kvp_client_free_request(c, req, r & 1));
				if (rv == KVP_OK)
					live[req] = (r & 1) != 0;
			}
			break;
		case 4: { /* blocks directly */
			uint32_t k = 1 + (uint32_t)(r >> 16) % 16;
			if (nheld + k <= 256) {
				TIMED(rv, kvp_client_allocate(c, k, held + nheld));
				if (rv == KVP_OK)
					nheld += k;
			}
			break;
		}
		case 5:
			if (nheld > 0) {
				size_t k = 1 + (size_t)(r >> 16) % nheld;
				TIMED(rv, kvp_client_free(c, held + nheld - k, k));
				if (rv == KVP_OK)
					nheld -= k;
			}
			break;
		case 6: {
			struct kvp_client_lookup q = {.tokens = prompt, .num_tokens = 48};
			uint32_t hb, ht;
			TIMED(rv, kvp_client_lookup(c, &q, ids, 64, &hb, &ht));
			break;
		}
		default: {
			struct kvp_client_stats st;
			TIMED(rv, kvp_client_stats(c, &st));
			break;
		}
		}
	}
	if (rnd(s) % 8 == 0) {
		kvp_client_detach(c); /* a crash: the lease releases everything */
		atomic_fetch_add(&detached, 1);
	} else {
		kvp_client_close(c);
	}
}

static void *
worker_main(void *arg)
{
	int w = (int)(intptr_t)arg;
	uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(w + 1);
	while (!atomic_load(&stop))
		session(&s, w);
	return NULL;
}

/* --victim URL: hold blocks until killed. */
static int
victim(const char *url)
{
	struct kvp_client *c = open_client(url, "soak-victim");
	int32_t ids[32];
	if (c == NULL || kvp_client_allocate(c, 32, ids) != KVP_OK)
		return 1;
	for (;;)
		sleep_ms(1000);
}

/* Pipelines undecodable requests over raw tcp and never reads; the daemon must cut it. */
static void
flood_once(void)
{
	int port = atoi(strrchr(tcp_url, ':') + 1), small = 1024;
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	uint8_t hello[8] = {0x00, 'S', 'P', 0x00, 0x00, 0x30, 0x00, 0x00}, frame[28] = {0};
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0)
		return;
	(void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
	    write(fd, hello, sizeof(hello)) != (ssize_t)sizeof(hello) ||
	    read(fd, hello, sizeof(hello)) != (ssize_t)sizeof(hello)) {
		close(fd);
		return;
	}
	(void)fcntl(fd, F_SETFL, O_NONBLOCK);
	frame[7] = 20;
	memset(frame + 12, 0xff, 16);
	/*
	 * At most 3 s of it: a daemon that keeps reading (its replies fit the
	 * kernel's buffers) never cuts the flood, and 200,000 frames with a
	 * 10 ms pause per full buffer once held this loop, and the windows'
	 * schedule, for 216 s.
	 */
	double until = now_s() + 3;
	for (uint32_t i = 0; i < 200000 && now_s() < until; i++) {
		frame[8] = 0x80;
		frame[11] = (uint8_t)i;
		if (send(fd, frame, sizeof(frame), MSG_NOSIGNAL) < 0) {
			if (errno != EAGAIN)
				break;
			sleep_ms(10);
		}
	}
	atomic_fetch_add(&floods, 1);
	sleep_ms(2000);
	close(fd);
}

static int
cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return (x > y) - (x < y);
}

/* This window's p50 and p99 (µs), and a fresh window. */
static void
window(double *p50, double *p99, size_t *n)
{
	static uint32_t sorted[MAX_SAMPLES];
	pthread_mutex_lock(&mu); /* copy out, so the workers wait only for the copy */
	*n = nsamples;
	memcpy(sorted, samples, nsamples * sizeof(samples[0]));
	nsamples = 0;
	pthread_mutex_unlock(&mu);
	qsort(sorted, *n, sizeof(sorted[0]), cmp_u32);
	*p50 = *n ? sorted[*n / 2] : 0;
	*p99 = *n ? sorted[*n * 99 / 100] : 0;
}

int
main(int argc, char **argv)
{
	double seconds = 600;
	bool quick = false;
	char self[512];
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--victim") == 0 && i + 1 < argc)
			return victim(argv[i + 1]);
		if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc)
			seconds = atof(argv[++i]);
		else if (strcmp(argv[i], "--quick") == 0)
			quick = true;
		else {
			fprintf(stderr, "usage: kvp-soak [--seconds N] [--quick]\n");
			return 2;
		}
	}
	ssize_t sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
	int win = WINDOW_S / (quick ? 6 : 1);
	if (sl <= 0 || seconds < 2 * win) {
		fprintf(stderr, "kvp-soak: needs /proc/self/exe and at least %d s\n", 2 * win);
		return 2;
	}
	self[sl] = '\0';
	daemon_urls(ipc_url, sizeof(ipc_url), tcp_url, sizeof(tcp_url));
	snprintf(ev_url, sizeof(ev_url), "ipc:///tmp/kvpool-soak-ev-%d.ipc", (int)getpid());
	snprintf(admin, sizeof(admin), "http://127.0.0.1:%d", daemon_admin_port());
	char lease[16], pool[192];
	snprintf(lease, sizeof(lease), "%d", LEASE_MS);
	char tok_path[96];
	snprintf(tok_path, sizeof(tok_path), "/tmp/kvpool-soak-token-%d", (int)getpid());
	FILE *tf = fopen(tok_path, "w");
	if (tf == NULL || fputs(SOAK_TOKEN "\n", tf) < 0 || fclose(tf) != 0) {
		fprintf(stderr, "kvp-soak: cannot write %s\n", tok_path);
		return 2;
	}
	snprintf(pool, sizeof(pool), "name=default,blocks=%d,block_size=16,seed=0,token_file=%s",
	         BLOCKS, tok_path);
	const char *args[] = {"--rpc", ipc_url, "--rpc", tcp_url, "--events", ev_url, "--admin",
	                      admin, "--lease-ms", lease, "--send-timeout-ms", "300",
	                      "--idle-timeout-ms", "5000", "--executor", "none", "--pool", pool,
	                      NULL};
	/* kvpoold's log: kept, and its last lines printed, when the run fails. */
	char log_path[96];
	snprintf(log_path, sizeof(log_path), "/tmp/kvpool-soak-log-%d", (int)getpid());
	if ((daemon_pid = daemon_start_log(args, log_path)) <= 0)
		return 2;
	sleep_ms(300);

	/* The subscriber that never reads. */
	nng_socket sub;
	if (nng_sub0_open(&sub) != 0 || nng_socket_set(sub, NNG_OPT_SUB_SUBSCRIBE, "", 0) != 0 ||
	    nng_dial(sub, ev_url, NULL, NNG_FLAG_NONBLOCK) != 0) {
		fprintf(stderr, "kvp-soak: cannot open the stalled subscriber\n");
		daemon_stop(daemon_pid);
		return 2;
	}
	pthread_t thr[WORKERS];
	for (int w = 0; w < WORKERS; w++)
		pthread_create(&thr[w], NULL, worker_main, (void *)(intptr_t)w);

	double t0 = now_s(), next_window = t0 + win, next_kill = t0 + 3;
	double rss0 = 0, p99_0 = 0, rss = 0, p50, p99 = 0;
	size_t n;
	int windows = 0;
	printf("kvp-soak: %.0f s, %d workers, pool of %d blocks, lease %d ms\n", seconds, WORKERS,
	       BLOCKS, LEASE_MS);
	printf("%8s %9s %10s %9s %9s %8s %8s %7s\n", "t (s)", "RSS (MB)", "calls", "p50 (us)",
	       "p99 (us)", "detached", "killed", "floods");
	while (now_s() - t0 < seconds) {
		if (now_s() >= next_kill) { /* a client process that dies holding blocks */
			const char *vargv[] = {self, "--victim", ipc_url, NULL};
			pid_t v = kvp_spawn(vargv, NULL);
			sleep_ms(300);
			if (v > 0 && kill(v, SIGKILL) == 0 && waitpid(v, NULL, 0) == v)
				atomic_fetch_add(&killed, 1);
			next_kill = now_s() + 5;
		}
		if (now_s() >= next_window) {
			window(&p50, &p99, &n);
			rss = proc_rss_bytes(daemon_pid) / (1 << 20);
			if (windows++ == 0) {
				rss0 = rss;
				p99_0 = p99;
			}
			printf("%8.0f %9.1f %10zu %9.0f %9.0f %8lu %8lu %7lu\n", now_s() - t0, rss, n, p50,
			       p99, atomic_load(&detached), atomic_load(&killed), atomic_load(&floods));
			fflush(stdout);
			next_window += win;
			flood_once();
		}
		sleep_ms(100);
	}
	atomic_store(&stop, true);
	for (int w = 0; w < WORKERS; w++)
		pthread_join(thr[w], NULL);
	nng_close(sub);

	/* Every lease runs out; then nothing may be left. */
	sleep_ms(LEASE_MS * 2 + 500);
	struct kvp_client *c = open_client(ipc_url, "soak-check");
	struct kvp_client_stats st = {0};
	int ok = 1;
	if (c == NULL || kvp_client_stats(c, &st) != KVP_OK) {
		printf("FAIL: no Stats at the end\n");
		ok = 0;
	} else {
		printf("end: %u of %u blocks free, %u session(s) (this one), %u request(s), "
		       "%llu leases expired, %lu calls, %lu failures\n",
		       st.num_free, st.num_blocks, st.sessions, st.active_requests,
		       (unsigned long long)st.leases_expired, atomic_load(&calls),
		       atomic_load(&failures));
		if (st.num_free != st.num_blocks - 1 || st.sessions != 1 || st.active_requests != 0) {
			printf("FAIL: blocks, sessions or requests left behind\n");
			ok = 0;
		}
	}
	kvp_client_close(c);
	if (rss > rss0 * 1.25 + 16) {
		printf("FAIL: RSS grew from %.1f MB to %.1f MB\n", rss0, rss);
		ok = 0;
	}
	if (!quick && p99 > 2 * p99_0) {
		printf("FAIL: p99 went from %.0f us to %.0f us\n", p99_0, p99);
		ok = 0;
	}
	if (atomic_load(&failures) > 0) {
		printf("FAIL: %lu calls failed (not OK, not NO_SPACE)\n", atomic_load(&failures));
		for (size_t i = 0; i < sizeof(why) / sizeof(why[0]) && why[i][0]; i++)
			printf("  %s\n", why[i]);
		ok = 0;
	}
	int rc = daemon_stop(daemon_pid);
	unlink(tok_path);
	if (rc != 0) {
		printf("FAIL: kvpoold exited %d (its drain checks the invariants)\n", rc);
		ok = 0;
	}
	if (!ok)
		print_log_tail(log_path, 60);
	else
		unlink(log_path);
	printf("kvp-soak: %s (RSS %.1f -> %.1f MB, p99 %.0f -> %.0f us)\n", ok ? "PASS" : "FAIL",
	       rss0, rss, p99_0, p99);
	return ok ? 0 : 1;
}
