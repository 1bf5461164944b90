/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvp-soak-hostile: honest clients beside hostile peers on loopback (issue
 * #49), not part of the default test run except as a short --quick run:
 *
 *   kvp-soak-hostile [--seconds N] [--quick]      (default 600 s)
 *
 * Eight honest clients run request cycles (a prompt sharing one of 8
 * prefixes, decode steps, then FreeRequest) on one pool, each call timed,
 * while a prober asks /healthz every 200 ms. The first half of the run has
 * no attacker (the baseline); in the second half, at the same time: 4 peers
 * that pipeline requests and never read, reconnecting at once when cut off;
 * 100 admin connections that send a byte a second (slowloris), reconnecting
 * when closed; 20 vLLM-wire replay peers that ask for the whole ring every
 * 2 s and never read; 10 vLLM-wire subscribers that never read. The RSS of
 * kvpoold is sampled every second.
 *
 * Aims (exit 1 if one fails): the attacked half's honest p99 within 2x of the
 * baseline half's (skipped with --quick: too few samples) and no honest call
 * over 1 s; no honest call failed; no /healthz probe failed; the daemon's
 * peak RSS within 256 MiB of its start; after the clients go, every block
 * free; kvpoold's exit status 0 (its drain found the invariants intact).
 */
#include "daemon_util.h"
#include "bench/bench_util.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <zmq.h>

#include "clients/c/kvpool.h"

#define HONEST 8
#define BLOCKS 4096
#define MAX_SAMPLES 2000000
#define RSS_MARGIN_MIB 256

static char ipc_url[128], tcp_url[128], admin[64], vllm_sub[64], vllm_rep[64];
static pid_t daemon_pid;
static atomic_bool stop, attacked;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static uint32_t samples[2][MAX_SAMPLES]; /* µs: [0] baseline half, [1] attacked half */
static size_t nsamples[2];
static uint64_t seen[2], pick = 88172645463325252ull; /* reservoir sampling over each half */
static atomic_ulong calls, failures, over_1s, probes, probe_failures;
/* Connections the daemon cut while only honest clients ran (the aim: none). */
static double honest_cuts;
static const char *const cut_series[] = {
	"kvpool_connections_closed_total{reason=\"took_no_reply\"}",
	"kvpool_connections_closed_total{reason=\"address_bound\"}",
	"kvpool_connections_closed_total{reason=\"unauthenticated_bound\"}",
};
static char why[4][192];

static uint64_t
rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static void
record(struct kvp_client *c, const char *call, double t0, int rv)
{
	double dt = now_s() - t0;
	int half = atomic_load(&attacked) ? 1 : 0;
	atomic_fetch_add(&calls, 1);
	if (dt > 1.0)
		atomic_fetch_add(&over_1s, 1);
	if (rv != KVP_OK && rv != KVP_ENOSPACE) {
		unsigned long n = atomic_fetch_add(&failures, 1);
		if (n < 4)
			snprintf(why[n], sizeof(why[n]), "%s: %s (%s)", call, kvp_status_name(rv),
			         c ? kvp_client_last_detail(c) : "");
	}
	pthread_mutex_lock(&mu);
	/* Every call of the half equally likely to be kept, however many there are. */
	uint64_t k = seen[half]++;
	if (nsamples[half] < MAX_SAMPLES)
		samples[half][nsamples[half]++] = (uint32_t)(dt * 1e6);
	else if ((k = rnd(&pick) % (k + 1)) < MAX_SAMPLES)
		samples[half][k] = (uint32_t)(dt * 1e6);
	pthread_mutex_unlock(&mu);
}

/* One honest client: request cycles until the run ends. */
static void *
honest_main(void *arg)
{
	int w = (int)(intptr_t)arg;
	uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(w + 1);
	struct kvp_client_options o = {.url = w % 2 ? tcp_url : ipc_url, .client_name = "honest",
	                               .timeout_ms = 5000, .retries = KVP_RETRIES_DEFAULT};
	struct kvp_client *c = NULL;
	int64_t prompt[256];
	int32_t ids[64];
	struct kvp_client_slots_result res;
	uint64_t req = 0;
	int rv;

	double t0 = now_s();
	if ((rv = kvp_client_open(&o, &c)) != KVP_OK) {
		record(NULL, "open", t0, rv);
		return NULL;
	}
	while (!atomic_load(&stop)) {
		size_t len = 64 + rnd(&s) % 128, prefix = rnd(&s) % 8;
		for (size_t k = 0; k < len; k++)
			prompt[k] = k < 48 ? (int64_t)(prefix * 1000 + k) : (int64_t)(rnd(&s) % 50000);
		struct kvp_client_slots a = {.request_id = ++req, .use_prefix_cache = true,
		                             .prompt = prompt, .num_prompt = len};
		t0 = now_s();
		rv = kvp_client_allocate_slots(c, &a, ids, 64, &res);
		record(c, "allocate_slots", t0, rv);
		if (rv != KVP_OK)
			continue;
		for (int step = 0; step < 8 && !atomic_load(&stop); step++) {
			int64_t tok = (int64_t)(rnd(&s) % 50000);
			struct kvp_client_slots d = {.request_id = req, .new_tokens = &tok,
			                             .num_new_token_ids = 1, .num_new_tokens = 1};
			t0 = now_s();
			rv = kvp_client_allocate_slots(c, &d, ids, 64, &res);
			record(c, "decode", t0, rv);
		}
		t0 = now_s();
		rv = kvp_client_free_request(c, req, false);
		record(c, "free_request", t0, rv);
	}
	kvp_client_close(c);
	return NULL;
}

static void *
prober_main(void *arg)
{
	char body[256];
	(void)arg;
	while (!atomic_load(&stop)) {
		atomic_fetch_add(&probes, 1);
		if (http_get(daemon_admin_port(), "/healthz", body, sizeof(body)) != 200)
			atomic_fetch_add(&probe_failures, 1);
		sleep_ms(200);
	}
	return NULL;
}

/* ---- the attackers, each a child process killed at the end ---- */

static int
tcp_dial(int port, int rcvbuf)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0)
		return -1;
	if (rcvbuf > 0)
		(void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Pipelines undecodable requests and never reads; reconnects at once when cut off. */
static void
non_reader(void)
{
	int port = atoi(strrchr(tcp_url, ':') + 1);
	uint8_t hello[8] = {0x00, 'S', 'P', 0x00, 0x00, 0x30, 0x00, 0x00}, frame[28] = {0};
	frame[7] = 20;
	memset(frame + 12, 0xff, 16);
	for (;;) {
		int fd = tcp_dial(port, 1024);
		if (fd < 0 || write(fd, hello, 8) != 8 || read(fd, hello, 8) != 8) {
			if (fd >= 0)
				close(fd);
			sleep_ms(10);
			continue;
		}
		(void)fcntl(fd, F_SETFL, O_NONBLOCK);
		for (uint32_t i = 0;; i++) {
			frame[8] = 0x80;
			frame[11] = (uint8_t)i;
			if (send(fd, frame, sizeof(frame), MSG_NOSIGNAL) < 0) {
				if (errno != EAGAIN)
					break; /* cut off: again */
				sleep_ms(10);
			}
		}
		close(fd);
	}
}

/* 100 admin connections sending a byte a second, each redialled when closed. */
static void
slowloris(void)
{
	enum { N = 100 };
	int fds[N];
	for (int i = 0; i < N; i++)
		fds[i] = -1;
	for (unsigned tick = 0;; tick++) {
		for (int i = 0; i < N; i++) {
			if (fds[i] < 0 && (fds[i] = tcp_dial(daemon_admin_port(), 0)) < 0)
				continue;
			char ch = "GET /healthz HTTP/1.1\r\n"[tick % 23];
			if (send(fds[i], &ch, 1, MSG_NOSIGNAL) != 1) {
				close(fds[i]);
				fds[i] = -1;
			}
		}
		sleep_ms(1000);
	}
}

/* 20 replay peers asking for the whole ring every 2 s, 10 subscribers: none reads. */
static void
zmq_leeches(void)
{
	void *ctx = zmq_ctx_new();
	void *peers[20], *subs[10];
	int one = 1, small = 4096;
	for (int i = 0; i < 20; i++) {
		peers[i] = zmq_socket(ctx, ZMQ_DEALER);
		zmq_setsockopt(peers[i], ZMQ_RCVHWM, &one, sizeof(one));
		zmq_setsockopt(peers[i], ZMQ_RCVBUF, &small, sizeof(small));
		zmq_connect(peers[i], vllm_rep);
	}
	for (int i = 0; i < 10; i++) {
		subs[i] = zmq_socket(ctx, ZMQ_SUB);
		zmq_setsockopt(subs[i], ZMQ_RCVHWM, &one, sizeof(one));
		zmq_setsockopt(subs[i], ZMQ_RCVBUF, &small, sizeof(small));
		zmq_setsockopt(subs[i], ZMQ_SUBSCRIBE, "", 0);
		zmq_connect(subs[i], vllm_sub);
	}
	uint8_t zero[8] = {0};
	for (;;) {
		for (int i = 0; i < 20; i++)
			zmq_send(peers[i], zero, 8, ZMQ_DONTWAIT);
		sleep_ms(2000);
	}
}

static pid_t
spawn(void (*fn)(void))
{
	pid_t pid = fork();
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives the soak */
		fn();
		_exit(0);
	}
	return pid;
}

static int
cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return (x > y) - (x < y);
}

static double
p99_ms(int half)
{
	size_t n = nsamples[half];
	if (n == 0)
		return 0;
	qsort(samples[half], n, sizeof(samples[half][0]), cmp_u32);
	return samples[half][n * 99 / 100] / 1e3;
}

static double
rss_mib(void)
{
	return proc_rss_bytes(daemon_pid) / 1048576.0;
}

/* The report as BENCHMARKS.md's figures (KVP_BENCH_JSON): the attacked half against the first. */
static void
report_json(double half, double p0, double p1, double rss0, double peak, double rss_end,
            unsigned free_blocks, int exit_status)
{
	char note[512];
	snprintf(note, sizeof(note), "%d honest clients without a token (unauthenticated, sharing "
	         "127.0.0.1 with the attackers) run request cycles over ipc and tcp for %.0f s and a "
	         "prober asks `/healthz` every 200 ms; the second %.0f s add 4 peers that pipeline "
	         "requests and never read (reconnecting when cut), 100 admin connections sending a "
	         "byte a second, 20 vLLM-wire replay peers asking for the whole ring every 2 s and "
	         "10 vLLM-wire subscribers, none of which read", HONEST, 2 * half, half);
	bench_note("soak", note);
	bench_json("soak", "honest p99 beside the attackers (uniform sample of each half's calls)",
	           p1, "ms", "the same run's first half, honest clients alone", p0, "lower");
	bench_json("soak", "honest calls per second beside the attackers", (double)seen[1] / half,
	           "calls/s", "the same run's first half, honest clients alone",
	           (double)seen[0] / half, "higher");
	snprintf(note, sizeof(note), "honest calls: %lu, failed %lu, over 1 s %lu; honest "
	         "connections cut before the attackers came: %.0f (aims: 0)",
	         atomic_load(&calls), atomic_load(&failures), atomic_load(&over_1s), honest_cuts);
	bench_note("soak", note);
	snprintf(note, sizeof(note), "`/healthz` probes failed: %lu of %lu (aim: 0)",
	         atomic_load(&probe_failures), atomic_load(&probes));
	bench_note("soak", note);
	snprintf(note, sizeof(note), "kvpoold RSS: %.1f MiB at start, peak %.1f MiB, %.1f MiB at "
	         "the end (aim: peak within %d MiB of the start)", rss0, peak, rss_end,
	         RSS_MARGIN_MIB);
	bench_note("soak", note);
	snprintf(note, sizeof(note), "blocks free at the end: %u of %u; kvpoold exit %d (its "
	         "drain's invariant check)", free_blocks, BLOCKS - 1, exit_status);
	bench_note("soak", note);
}

int
main(int argc, char **argv)
{
	double seconds = 600;
	bool quick = false;
	pthread_t th[HONEST + 1];
	pid_t att[6];
	int natt = 0, bad = 0;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc)
			seconds = atof(argv[++i]);
		else if (strcmp(argv[i], "--quick") == 0)
			quick = true;
		else {
			fprintf(stderr, "usage: kvp-soak-hostile [--seconds N] [--quick]\n");
			return 2;
		}
	}
	if (seconds < 4) {
		fprintf(stderr, "kvp-soak-hostile: --seconds must be at least 4\n");
		return 2;
	}
	daemon_urls(ipc_url, sizeof(ipc_url), tcp_url, sizeof(tcp_url));
	/* Below the ephemeral range (32768-), where a port can be taken by any
	 * connection's local end at the moment kvpoold binds it. */
	int base_port = 30000 + (int)(getpid() % 1300) * 2;
	snprintf(admin, sizeof(admin), "http://127.0.0.1:%d", daemon_admin_port());
	snprintf(vllm_sub, sizeof(vllm_sub), "tcp://127.0.0.1:%d", base_port);
	snprintf(vllm_rep, sizeof(vllm_rep), "tcp://127.0.0.1:%d", base_port + 1);
	char pool[96], vpub[64], vrep[64];
	snprintf(pool, sizeof(pool), "name=default,blocks=%d,executor=none", BLOCKS);
	snprintf(vpub, sizeof(vpub), "tcp://*:%d", base_port);
	snprintf(vrep, sizeof(vrep), "tcp://*:%d", base_port + 1);
	const char *args[] = {"--rpc", ipc_url, "--rpc", tcp_url, "--admin", admin, "--events",
	                      "none", "--vllm-events", vpub, "--vllm-replay", vrep,
	                      "--lease-ms", "2000", "--pool", pool, NULL};
	if ((daemon_pid = daemon_start(args)) <= 0)
		return 1;
	/* A daemon that cannot start (a port taken) ends the run at once. */
	char body[256];
	for (int i = 0; http_get(daemon_admin_port(), "/healthz", body, sizeof(body)) != 200; i++) {
		if (waitpid(daemon_pid, NULL, WNOHANG) == daemon_pid || i == 100) {
			fprintf(stderr, "kvp-soak-hostile: kvpoold %s (its log is above)\n",
			        i == 100 ? "did not answer /healthz within 10 s" : "exited at start");
			if (i == 100)
				kill(daemon_pid, SIGKILL);
			return 1;
		}
		sleep_ms(100);
	}
	sleep_ms(500);
	double rss0 = rss_mib(), peak = rss0;

	for (int i = 0; i < HONEST; i++)
		pthread_create(&th[i], NULL, honest_main, (void *)(intptr_t)i);
	pthread_create(&th[HONEST], NULL, prober_main, NULL);
	double t0 = now_s(), half = seconds / 2, last_print = t0;
	printf("kvp-soak-hostile: %.0f s: %.0f s of honest load alone, then %.0f s beside the "
	       "attackers; kvpoold RSS %.1f MiB at start\n", seconds, half, seconds - half, rss0);
	fflush(stdout);
	while (now_s() - t0 < seconds) {
		if (!atomic_load(&attacked) && now_s() - t0 >= half) {
			/* No honest connection is cut: the bounds are for non-readers. */
			honest_cuts = 0;
			for (size_t k = 0; k < sizeof(cut_series) / sizeof(cut_series[0]); k++)
				honest_cuts += metric_value(cut_series[k]) > 0 ? metric_value(cut_series[k]) : 0;
			atomic_store(&attacked, true);
			for (int i = 0; i < 4; i++)
				att[natt++] = spawn(non_reader);
			att[natt++] = spawn(slowloris);
			att[natt++] = spawn(zmq_leeches);
			printf("  %.0f s: attackers in (4 non-readers, 100 slowloris, 20 replay peers, "
			       "10 subscribers)\n", now_s() - t0);
			fflush(stdout);
		}
		double r = rss_mib();
		peak = r > peak ? r : peak;
		if (now_s() - last_print >= 30) {
			last_print = now_s();
			printf("  %.0f s: %lu calls, RSS %.1f MiB (peak %.1f), %lu of %lu probes failed\n",
			       now_s() - t0, atomic_load(&calls), r, peak, atomic_load(&probe_failures),
			       atomic_load(&probes));
			fflush(stdout);
		}
		sleep_ms(1000);
	}
	atomic_store(&stop, true);
	for (int i = 0; i <= HONEST; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < natt; i++) {
		kill(att[i], SIGKILL);
		waitpid(att[i], NULL, 0);
	}
	double rss_end = rss_mib();

	/* Every block free once the honest sessions are gone (they said Goodbye). */
	struct kvp_client_options o = {.url = ipc_url, .client_name = "soak-check", .timeout_ms = 5000};
	struct kvp_client *c = NULL;
	struct kvp_client_stats st = {0};
	int free_ok = 0;
	for (int i = 0; i < 50 && !free_ok; i++) {
		if (c == NULL && kvp_client_open(&o, &c) != KVP_OK)
			c = NULL;
		if (c != NULL && kvp_client_stats(c, &st) == KVP_OK && st.num_free == BLOCKS - 1)
			free_ok = 1;
		else
			sleep_ms(100);
	}
	kvp_client_close(c);
	int exit_status = daemon_stop(daemon_pid);

	double p0 = p99_ms(0), p1 = p99_ms(1);
	printf("kvp-soak-hostile report: honest calls %lu (baseline half %llu, attacked half %llu; "
	       "p99 over a uniform sample of at most %d each), failed %lu, over 1 s %lu\n  honest p99: %.2f ms alone, %.2f ms beside the attackers "
	       "(%.2fx)\n  /healthz: %lu of %lu probes failed\n  kvpoold RSS: start %.1f MiB, peak "
	       "%.1f, end %.1f\n  blocks free at the end: %u of %u; kvpoold exit %d\n",
	       atomic_load(&calls), (unsigned long long)seen[0], (unsigned long long)seen[1],
	       MAX_SAMPLES, atomic_load(&failures),
	       atomic_load(&over_1s), p0, p1, p0 > 0 ? p1 / p0 : 0, atomic_load(&probe_failures),
	       atomic_load(&probes), rss0, peak, rss_end, st.num_free, BLOCKS - 1, exit_status);
	report_json(half, p0, p1, rss0, peak, rss_end, st.num_free, exit_status);
	for (unsigned long i = 0; i < atomic_load(&failures) && i < 4; i++)
		printf("  failure: %s\n", why[i]);
	printf("  connections cut before the attackers came: %.0f\n", honest_cuts);
	if (atomic_load(&failures) > 0)
		bad++, printf("  FAIL: honest calls failed\n");
	if (honest_cuts != 0)
		bad++, printf("  FAIL: honest connections were cut\n");
	if (atomic_load(&over_1s) > 0)
		bad++, printf("  FAIL: honest calls took over 1 s\n");
	if (!quick && p1 > 2 * p0)
		bad++, printf("  FAIL: p99 beside the attackers is over 2x the baseline's\n");
	if (atomic_load(&probe_failures) > 0)
		bad++, printf("  FAIL: /healthz probes failed\n");
	if (peak > rss0 + RSS_MARGIN_MIB)
		bad++, printf("  FAIL: RSS grew more than %d MiB\n", RSS_MARGIN_MIB);
	if (!free_ok)
		bad++, printf("  FAIL: blocks still held after the clients left\n");
	if (exit_status != 0)
		bad++, printf("  FAIL: kvpoold exited %d\n", exit_status);
	printf("kvp-soak-hostile: %s\n", bad ? "FAILED" : "every aim met");
	return bad ? 1 : 0;
}
