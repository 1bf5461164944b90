/* SPDX-License-Identifier: Apache-2.0 */
/*
 * One peer cannot starve every pool (issue #49): a peer with no session
 * that pipelines requests and never reads, reconnecting as soon as it is
 * cut off, while a client of the pool calls Stats every 50 ms. With four
 * contexts and a 5 s send bound, each of the peer's connections used to
 * hold every context for the whole bound. The daemon closes a connection
 * that sends a request while half the contexts hold replies it has not
 * taken (and, behind that, any connection once half the contexts have
 * waited SLOW_SEND_MS on their peers: service/net/transport.c), so the client
 * is served at its usual latency. Peers at several addresses (127.0.0.2-5)
 * that each hold one context are bounded as unauthenticated peers: a
 * client that shows its pool's token keeps half the contexts.
 * Loopback only; about 15 s.
 */
#include "daemon_util.h"

#include "kvp_test.h"

#include "clients/c/kvpool.h"
#include "raw_peer.h"

#define TOKEN "starve-test-token"

static char ipc_url[256], tcp_url[256], admin[64], token_file[64], secure_pool[128];
static pid_t daemon_pid;

static int
setup(void **state)
{
	(void)state;
	daemon_urls(ipc_url, sizeof(ipc_url), tcp_url, sizeof(tcp_url));
	snprintf(admin, sizeof(admin), "http://127.0.0.1:%d", daemon_admin_port());
	snprintf(token_file, sizeof(token_file), "/tmp/kvp-starve-token-%d", (int)getpid());
	FILE *f = fopen(token_file, "w");
	if (f == NULL || fputs(TOKEN "\n", f) < 0 || fclose(f) != 0)
		return -1;
	snprintf(secure_pool, sizeof(secure_pool), "name=secure,blocks=64,token_file=%s", token_file);
	const char *args[] = {"--rpc", ipc_url, "--rpc", tcp_url, "--admin", admin, "--events",
	                      "none", "--pool", "name=default,blocks=64", "--pool", secure_pool,
	                      "--contexts", "4", "--send-timeout-ms", "5000", "--idle-timeout-ms",
	                      "0", NULL};
	daemon_pid = daemon_start(args);
	return daemon_pid > 0 ? 0 : -1;
}

static int
teardown(void **state)
{
	(void)state;
	(void)unlink(token_file);
	return daemon_stop(daemon_pid) == 0 ? 0 : -1;
}

/* Connections the daemon closed for holding contexts, whichever bound did it. */
static double
cuts(void)
{
	return metric_value("kvpool_connections_closed_total{reason=\"took_no_reply\"}") +
	       metric_value("kvpool_connections_closed_total{reason=\"address_bound\"}") +
	       metric_value("kvpool_connections_closed_total{reason=\"unauthenticated_bound\"}");
}

/* The hostile peer, in a child process: flood, get cut off, reconnect, for
 * `seconds`, from 127.0.0.<from> (0: 127.0.0.1). */
static pid_t
start_flooder(double seconds, int from)
{
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		double until = now_s() + seconds;
		int rounds = 0;
		while (now_s() < until) {
			int fd = raw_req_connect_from(tcp_url, from);
			bool closed = false, blocked = false;
			(void)flood(fd, &closed, &blocked);
			close(fd);
			rounds++;
		}
		_exit(rounds > 0 ? 0 : 1);
	}
	return pid;
}

static int
cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/*
 * A pool client's Stats latencies beside `flooders` flooding peers (each its
 * own connection), from one address or (spread) from one address each; the
 * client without a token over ipc://, or with its pool's token over tcp://.
 */
static void
starve_run(int flooders, bool spread, bool with_token)
{
	struct kvp_client_options o = {.url = ipc_url, .pool = "default", .timeout_ms = 6000,
	                               .retries = 0};
	if (with_token) {
		o.url = tcp_url;
		o.pool = "secure";
		o.token = TOKEN;
	}
	struct kvp_client *c = NULL;
	struct kvp_client_stats st;
	double lat[200];
	size_t n = 0, fast = 0;
	int rv = KVP_EBUSY;
	pid_t flooder[16];

	for (int i = 0; i < 100 && rv != KVP_OK; i++) {
		rv = kvp_client_open(&o, &c);
		if (rv != KVP_OK)
			sleep_ms(20);
	}
	assert_ok(rv);
	double cut_before = cuts();
	double unauth_before =
		metric_value("kvpool_connections_closed_total{reason=\"unauthenticated_bound\"}");
	for (int f = 0; f < flooders; f++)
		flooder[f] = start_flooder(5.0, spread ? 2 + f % 8 : 0);
	sleep_ms(500); /* the peers are at it */
	double t_end = now_s() + 4.0;
	while (now_s() < t_end && n < 200) {
		double t0 = now_s();
		assert_ok(kvp_client_stats(c, &st));
		lat[n] = now_s() - t0;
		fast += lat[n] < 0.1;
		n++;
		sleep_ms(50);
	}
	for (int f = 0; f < flooders; f++)
		if (kvp_wait_exit(flooder[f], 30000) != 0)
			fail_msg("a flooding peer did not finish within 30 s of its 5");
	qsort(lat, n, sizeof(*lat), cmp_double);
	double cut = cuts() - cut_before;
	double unauth = metric_value("kvpool_connections_closed_total{reason=\"unauthenticated_bound\"}") -
	                unauth_before;
	print_message("%zu Stats calls (%s) beside %d flooder(s) from %s: %zu within 100 ms, "
	              "median %.1f ms, p90 %.1f ms, max %.1f ms; %.0f of their connections cut off "
	              "(%.0f for the unauthenticated share)\n", n, with_token ? "token" : "no token",
	              flooders, spread ? "one address each" : "one address", fast, lat[n / 2] * 1e3,
	              lat[n * 9 / 10] * 1e3, lat[n - 1] * 1e3, cut, unauth);
	/* Before: 11-19% within 100 ms, half over 2 s (the measurement);
	 * with the pressure watch alone, 88-93% and a p90 of 20-110 ms here. */
	assert_true(fast * 100 >= n * 95);
	assert_true(lat[n * 9 / 10] < 0.1);
	assert_true(cut >= 1);
	kvp_client_close(c);
}

static void
test_service_starve_non_reader_cannot_starve_a_session(void **state)
{
	(void)state;
	starve_run(1, false, false);
}

/* Four such peers from one address, each on its own connection, at once. */
static void
test_service_starve_one_address_cannot_either(void **state)
{
	(void)state;
	starve_run(4, false, false);
}

/*
 * Eight peers at eight addresses, each of which holds a context once its
 * socket is full: no one connection or address need be over its share, but
 * together they could hold every context until the pressure watch (250 ms)
 * cut one. The client shows its pool's token: it keeps half the contexts.
 * (This flood pattern is also answered in time by the per-connection bound
 * and the watch alone, and its peers are mostly cut before their replies
 * have waited the 50 ms that make them count toward a share:
 * test_conn_bounds holds the shares themselves.)
 */
static void
test_service_starve_many_addresses_cannot_starve_a_token(void **state)
{
	(void)state;
	starve_run(8, true, true);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_service_starve_non_reader_cannot_starve_a_session),
		cmocka_unit_test(test_service_starve_one_address_cannot_either),
		cmocka_unit_test(test_service_starve_many_addresses_cannot_starve_a_token),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
