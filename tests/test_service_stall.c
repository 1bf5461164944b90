/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A peer that never reads its replies (issue #15, item 1): with no token it
 * pipelines framed requests over tcp://127.0.0.1 and stops reading, so its
 * replies fill the socket and each further reply would hold a request
 * context. The daemon must close that connection after --send-timeout-ms
 * (or, when nng has already stopped reading it with one reply in flight,
 * after --idle-timeout-ms, since no request arrives from it any more, or
 * leave it stuck alone) and keep serving everyone else. And a peer that
 * connects and then sends nothing is closed after --idle-timeout-ms, while
 * a live client idle as long redials by itself. Both closes are counted in
 * /metrics. Loopback only; bounded in time.
 */
#include "daemon_util.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "kvp_test.h"

#include "clients/c/kvpool.h"
#include "raw_peer.h"

/* service/net/admin.h's KVPD_ADMIN_MAX_REQUEST (the test does not include the daemon's headers). */
#define KVP_ADMIN_MAX_REQUEST_TEST 8192

static char ipc_url[256], tcp_url[256], admin[64];
static pid_t daemon_pid;

static int
setup(void **state)
{
	(void)state;
	daemon_urls(ipc_url, sizeof(ipc_url), tcp_url, sizeof(tcp_url));
	snprintf(admin, sizeof(admin), "http://127.0.0.1:%d", daemon_admin_port());
	const char *args[] = {"--rpc", ipc_url, "--rpc", tcp_url, "--admin", admin, "--events",
	                      "none", "--pool", "name=default,blocks=64", "--contexts", "4",
	                      "--send-timeout-ms", "300", "--idle-timeout-ms", "3000", NULL};
	daemon_pid = daemon_start(args);
	return daemon_pid > 0 ? 0 : -1;
}

static int
teardown(void **state)
{
	(void)state;
	return daemon_stop(daemon_pid) == 0 ? 0 : -1;
}

/* kvpool_connections_closed_total{reason} from /metrics (-1 if absent). */
static double
closes(const char *reason)
{
	char series[96];
	snprintf(series, sizeof(series), "kvpool_connections_closed_total{reason=\"%s\"}", reason);
	return metric_value(series);
}

static void
test_service_stall_non_reading_peer_is_cut_off_others_served(void **state)
{
	struct kvp_client_options o = {.url = ipc_url, .pool = "default", .timeout_ms = 1000,
	                               .retries = 0};
	struct kvp_client *c = NULL;
	struct kvp_client_stats st;
	int rv = KVP_EBUSY;

	(void)state;
	for (int i = 0; i < 100 && rv != KVP_OK; i++) {
		rv = kvp_client_open(&o, &c);
		if (rv != KVP_OK)
			nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
	}
	assert_ok(rv);
	int fd = raw_req_connect(tcp_url);
	bool closed = false, blocked = false;
	size_t sent = flood(fd, &closed, &blocked);
	print_message("non-reading peer pipelined %zu requests%s\n", sent,
	              closed    ? ", then the daemon closed it"
	              : blocked ? ", then the daemon stopped reading it"
	                        : " and the daemon kept taking them");
	/*
	 * Either way the peer's replies are stuck. Without a send bound every
	 * request context would wait on this peer forever, and so would everyone:
	 * the check below is what fails then.
	 */
	assert_true(closed || blocked);

	/* Everyone else is served at once, the peer still connected or not. */
	double t0 = now_s(), served_at = -1;
	while (now_s() - t0 < 5.0) {
		if (kvp_client_stats(c, &st) == KVP_OK) {
			served_at = now_s() - t0;
			break;
		}
	}
	print_message("another client served %.2f s after the flood\n", served_at);
	/*
	 * At once: contexts held by the peer's replies would wait until its
	 * idle close, a second after the flood gave up (idle timeout 3 s).
	 */
	assert_true(served_at >= 0 && served_at < 0.5);
	for (int i = 0; i < 20; i++)
		assert_ok(kvp_client_stats(c, &st));
	/*
	 * A close is counted: for a reply not taken (or for holding more than an
	 * unauthenticated address's share of the contexts), or, where nng stopped
	 * reading the peer before a second reply queued, for idling (the test
	 * machine's timing decides which comes first). A peer nng stopped
	 * reading and the idle timeout has not closed yet is not counted.
	 */
	double cut = 0, idle = 0;
	t0 = now_s();
	do { /* the daemon counts a close just after it closes; c stays busy meanwhile */
		assert_ok(kvp_client_stats(c, &st));
		cut = closes("took_no_reply") + closes("address_bound") +
		      closes("unauthenticated_bound");
		idle = closes("idle");
		if (closed && cut + idle < 1)
			nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
	} while (closed && cut + idle < 1 && now_s() - t0 < 2.0);
	print_message("kvpool_connections_closed_total{reason=\"took_no_reply\" or one of the "
	              "shares} %.0f, {reason=\"idle\"} %.0f\n", cut, idle);
	assert_true(cut >= 0 && idle >= 0);
	assert_true(closed ? cut + idle >= 1 : true);
	close(fd);
	kvp_client_close(c);
}

/*
 * Waits until the daemon serves a new client: a pause before (the test
 * before this one) may have left its endpoint deaf for the moment its watch
 * takes to listen again (nng 1.5; transport_listen.c).
 */
static void
wait_served(void)
{
	struct kvp_client_options patient = {.url = ipc_url, .pool = "default", .timeout_ms = 2000,
	                                     .retries = 2};
	struct kvp_client *c = NULL;
	assert_ok(kvp_client_open(&patient, &c));
	kvp_client_close(c);
}

/* Seconds one Stats call takes on a daemon that is stopped (SIGSTOP). */
static double
stalled_call_s(uint32_t retries)
{
	struct kvp_client_options o = {.url = ipc_url, .pool = "default", .timeout_ms = 300,
	                               .retries = retries};
	struct kvp_client *c = NULL;
	struct kvp_client_stats st;

	wait_served();
	assert_ok(kvp_client_open(&o, &c));
	assert_int_equal(kill(daemon_pid, SIGSTOP), 0);
	/* Every thread stopped: a thread running on another CPU stops a moment later. */
	nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
	double t0 = now_s();
	int rv = kvp_client_stats(c, &st);
	double took = now_s() - t0;
	assert_int_equal(kill(daemon_pid, SIGCONT), 0);
	assert_int_not_equal(rv, KVP_OK);
	/* The client comes back by itself (a fresh socket after the timeout). */
	double t1 = now_s();
	while ((rv = kvp_client_stats(c, &st)) != KVP_OK && now_s() - t1 < 3.0)
		;
	assert_int_equal(rv, KVP_OK);
	kvp_client_close(c);
	return took;
}

/*
 * retries = 0 means no retry: a call on a stalled daemon gives up after one
 * timeout_ms (vLLM's tier opens its scheduler's client so, to bound a step).
 * KVP_RETRIES_DEFAULT is the library's 2 retries: three timeouts.
 */
static void
test_service_stall_zero_retries_wait_one_timeout(void **state)
{
	(void)state;
	double none = stalled_call_s(0), dflt = stalled_call_s(KVP_RETRIES_DEFAULT);
	print_message("a call on a stopped daemon gave up after %.2f s (retries 0), %.2f s "
	              "(the default)\n", none, dflt);
	assert_true(none >= 0.29 && none < 0.6);
	assert_true(dflt >= 0.89 && dflt < 1.5);
}

/*
 * A call its client gave up on is never applied: an Allocate sent to a
 * stopped daemon times out; when the daemon runs again, past the call's
 * deadline and the allowed skew, it refuses the call (DEADLINE_EXCEEDED,
 * counted) instead of taking blocks no one will free.
 */
static void
test_service_stall_call_past_its_deadline_is_not_applied(void **state)
{
	struct kvp_client_options o = {.url = ipc_url, .pool = "default", .timeout_ms = 300,
	                               .retries = 0};
	struct kvp_client *c = NULL;
	struct kvp_client_stats st;
	int32_t ids[4];
	const char *expired = "kvpool_rpc_calls_total{pool=\"default\",call=\"allocate\","
	                      "status=\"DEADLINE_EXCEEDED\"}";

	(void)state;
	wait_served();
	assert_ok(kvp_client_open(&o, &c));
	assert_ok(kvp_client_stats(c, &st));
	uint32_t free0 = st.num_free;
	double e0 = metric_value(expired);
	assert_int_equal(kill(daemon_pid, SIGSTOP), 0);
	nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
	assert_status(kvp_client_allocate(c, 4, ids), KVP_EBUSY); /* the client gives up */
	/* Stopped past the deadline (300 ms) and the skew allowed (--deadline-skew-ms 1000). */
	nanosleep(&(struct timespec){1, 200 * 1000 * 1000}, NULL);
	assert_int_equal(kill(daemon_pid, SIGCONT), 0);
	double e1 = e0;
	for (int i = 0; i < 100 && e1 <= e0; i++) {
		nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
		e1 = metric_value(expired);
	}
	assert_ok(kvp_client_stats(c, &st));
	print_message("an Allocate read 1.5 s after it was sent: %.0f refused past its deadline, "
	              "%u of %u blocks free as before\n", e1 - (e0 < 0 ? 0 : e0), st.num_free, free0);
	assert_true(e1 - (e0 < 0 ? 0 : e0) == 1);
	assert_int_equal(st.num_free, free0);
	kvp_client_close(c);
}

/* Seconds until a new client of o opens and is answered a Stats, or -1 after 5 s. */
static double
seconds_until_served(const struct kvp_client_options *o)
{
	struct kvp_client *c = NULL;
	struct kvp_client_stats st;
	double t0 = now_s();

	while (now_s() - t0 < 5.0) {
		bool ok = kvp_client_open(o, &c) == KVP_OK && kvp_client_stats(c, &st) == KVP_OK;
		kvp_client_close(c);
		c = NULL;
		if (ok)
			return now_s() - t0;
	}
	return -1;
}

/*
 * A client that gave up connecting while the daemon was stopped must not
 * leave the endpoint deaf: nng 1.5's ipc listener accepts nothing more
 * after such a connection fails its handshake, and the daemon listens
 * again. A new client is served within 3 s of SIGCONT; a session opened
 * before goes on.
 */
static void
test_service_stall_abandoned_dial_leaves_the_endpoint_serving(void **state)
{
	struct kvp_client_options o = {.url = ipc_url, .pool = "default", .timeout_ms = 500,
	                               .retries = 0, .connect_timeout_ms = 300};
	struct kvp_client_options patient = {.url = ipc_url, .pool = "default", .timeout_ms = 2000,
	                                     .retries = 2};
	struct kvp_client *before = NULL, *gave_up = NULL;
	struct kvp_client_stats st;

	(void)state;
	assert_ok(kvp_client_open(&patient, &before));
	assert_int_equal(kill(daemon_pid, SIGSTOP), 0);
	nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
	assert_int_not_equal(kvp_client_open(&o, &gave_up), KVP_OK);
	assert_int_equal(kill(daemon_pid, SIGCONT), 0);
	double served = seconds_until_served(&o);
	print_message("a new client was served %.2f s after SIGCONT\n", served);
	assert_true(served >= 0 && served < 3.0);
	assert_ok(kvp_client_stats(before, &st));
	kvp_client_close(before);
}

/* The daemon's CPU time so far, in seconds (-1 if /proc cannot tell). */
static double
daemon_cpu_s(void)
{
	char path[64], buf[1024];
	unsigned long ut = 0, st = 0;
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)daemon_pid);
	FILE *f = fopen(path, "r");
	if (f == NULL)
		return -1;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	const char *p = strrchr(buf, ')'); /* past the command, which may hold spaces */
	if (p == NULL || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut,
	                        &st) != 2)
		return -1;
	return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/*
 * A client that connects and leaves at once (one giving up on a daemon
 * still starting) costs nothing after: nng 1.5 holds such a connection on
 * its stuck listener and would poll it at 100% CPU for the daemon's life.
 * Once the endpoint serves again the idle daemon uses under a quarter of a
 * CPU, and the session opened before goes on.
 */
static void
test_service_stall_client_gone_at_once_costs_no_cpu(void **state)
{
	struct kvp_client_options o = {.url = ipc_url, .pool = "default", .timeout_ms = 500,
	                               .retries = 0, .connect_timeout_ms = 300};
	struct kvp_client *before = NULL;
	struct kvp_client_stats st;
	struct sockaddr_un a = {.sun_family = AF_UNIX};

	(void)state;
	assert_ok(kvp_client_open(&o, &before));
	assert_true(strlen(ipc_url + 6) < sizeof(a.sun_path));
	memcpy(a.sun_path, ipc_url + 6, strlen(ipc_url + 6) + 1);
	for (int i = 0; i < 3; i++) {
		int fd = socket(AF_UNIX, SOCK_STREAM, 0);
		assert_true(fd >= 0);
		assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
		close(fd);
		sleep_ms(20);
	}
	double served = seconds_until_served(&o);
	assert_true(served >= 0);
	sleep_ms(1000); /* the watch closes what it finds hung up at two looks */
	double c0 = daemon_cpu_s(), w0 = now_s();
	sleep_ms(1000);
	double cpu = (daemon_cpu_s() - c0) / (now_s() - w0);
	print_message("served again after %.2f s; then the idle daemon used %.0f%% of a CPU\n",
	              served, 100 * cpu);
	assert_true(c0 >= 0 && cpu < 0.25);
	assert_ok(kvp_client_stats(before, &st));
	kvp_client_close(before);
}

/* Seconds until the daemon closes fd (read gives EOF or an error), or -1 after limit_s. */
static double
seconds_until_closed(int fd, double limit_s)
{
	double t0 = now_s();
	uint8_t buf[256];

	while (now_s() - t0 < limit_s) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		if (poll(&p, 1, 50) > 0 && read(fd, buf, sizeof(buf)) <= 0)
			return now_s() - t0;
	}
	return -1;
}

static void
test_service_stall_silent_peer_is_closed_live_client_redials(void **state)
{
	struct kvp_client_options o = {.url = tcp_url, .timeout_ms = 3000};
	struct kvp_client *c = NULL;
	struct kvp_client_stats st;

	(void)state;
	assert_ok(kvp_client_open(&o, &c));
	/* An SP peer that completes the handshake, then says nothing. */
	int fd = raw_req_connect(tcp_url);
	double idle0 = closes("idle");
	double closed_after = seconds_until_closed(fd, 7.0);
	print_message("a silent peer was closed after %.2f s (idle timeout 3 s)\n", closed_after);
	assert_true(closed_after >= 2.8 && closed_after < 5.0);
	/* The daemon counts a close just after it closes: give the counter a moment. */
	double idle = 0, t0 = now_s();
	while ((idle = closes("idle")) < idle0 + 1 && now_s() - t0 < 2.0)
		nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
	assert_true(idle0 >= 0 && idle >= idle0 + 1);
	close(fd);
	/* The client was idle as long: its next calls redial and succeed. */
	nanosleep(&(struct timespec){0, 500 * 1000 * 1000}, NULL);
	for (int i = 0; i < 3; i++)
		assert_ok(kvp_client_stats(c, &st));
	kvp_client_close(c);
}

/* A loopback connection to the admin port; -1 if it cannot connect. */
static int
admin_dial(void)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)daemon_admin_port())};
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
		close(fd);
		fd = -1;
	}
	return fd;
}

/* Sends req on a fresh admin connection and returns the status of the reply (or -1). */
static int
admin_status(const char *req, size_t len)
{
	char buf[512] = "";
	int fd = admin_dial(), status = -1;
	if (fd < 0)
		return -1;
	if (send(fd, req, len, MSG_NOSIGNAL) == (ssize_t)len) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		if (poll(&p, 1, 3000) > 0 && read(fd, buf, sizeof(buf) - 1) > 0)
			(void)sscanf(buf, "HTTP/1.1 %d", &status);
	}
	close(fd);
	return status;
}

/*
 * The admin endpoint bounds what a peer can hold (service/net/admin.h): headers
 * past the size limit get 431; slow senders holding every slot cannot keep
 * probes out (a newcomer takes the oldest sender's slot, which gets 408),
 * even while they keep coming back; a half-sent request left alone is
 * answered 408 and closed at the deadline.
 */
static void
test_service_admin_endpoint_cannot_be_held(void **state)
{
	static const char get[] = "GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n";
	static const char head[] = "GET /healthz HTTP/1.1\r\nX: ", part[] = "GET /healthz HTTP/1.1\r\nHo";
	static char big[KVP_ADMIN_MAX_REQUEST_TEST + 64];
	int fds[64], half, ok = 0;
	char buf[256] = "";

	(void)state;
	assert_int_equal(admin_status(get, sizeof(get) - 1), 200);
	memset(big, 'a', sizeof(big));
	memcpy(big, head, sizeof(head) - 1);
	assert_int_equal(admin_status(big, sizeof(big)), 431);

	/* 64 slow senders hold every slot (each half a request); probes still get 200. */
	for (int i = 0; i < 64; i++) {
		assert_true((fds[i] = admin_dial()) >= 0);
		(void)!send(fds[i], part, sizeof(part) - 1, MSG_NOSIGNAL);
	}
	nanosleep(&(struct timespec){0, 300 * 1000 * 1000}, NULL);
	assert_int_equal(admin_status(get, sizeof(get) - 1), 200);
	/* one of the oldest senders gave its slot up, told 408 */
	struct pollfd ps[64];
	for (int i = 0; i < 64; i++)
		ps[i] = (struct pollfd){.fd = fds[i], .events = POLLIN};
	assert_true(poll(ps, 64, 2000) >= 1);
	int told = 0;
	for (int i = 0; i < 64; i++) {
		if (!(ps[i].revents & POLLIN) || read(fds[i], buf, sizeof(buf) - 1) <= 0)
			continue;
		assert_memory_equal(buf, "HTTP/1.1 408", 12);
		told++;
	}
	assert_int_equal(told, 1);
	/* and while they keep coming back, 20 probes in a row are answered */
	for (int round = 0; round < 20; round++) {
		int k = round % 64;
		close(fds[k]);
		assert_true((fds[k] = admin_dial()) >= 0);
		(void)!send(fds[k], part, sizeof(part) - 1, MSG_NOSIGNAL);
		nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
		ok += admin_status(get, sizeof(get) - 1) == 200;
	}
	print_message("%d of 20 probes answered 200 under 64 slow senders\n", ok);
	assert_int_equal(ok, 20);
	for (int i = 0; i < 64; i++)
		close(fds[i]);

	/* Left alone, half a request is answered 408 at the deadline. */
	nanosleep(&(struct timespec){0, 200 * 1000 * 1000}, NULL);
	half = admin_dial();
	assert_true(half >= 0);
	assert_int_equal(send(half, part, sizeof(part) - 1, MSG_NOSIGNAL), (ssize_t)sizeof(part) - 1);
	double t0 = now_s();
	struct pollfd p = {.fd = half, .events = POLLIN};
	assert_int_equal(poll(&p, 1, 8000), 1);
	assert_true(read(half, buf, sizeof(buf) - 1) > 0);
	double after = now_s() - t0;
	print_message("half a request answered \"%.28s\" after %.2f s\n", buf, after);
	assert_memory_equal(buf, "HTTP/1.1 408", 12);
	assert_true(after > 4.0 && after < 7.0);
	assert_int_equal(admin_status(get, sizeof(get) - 1), 200);
	close(half);
}

static void
each_batch(void *ctx, const uint8_t *b, size_t len)
{
	(void)b;
	(void)len;
	++*(int *)ctx;
}

/* This daemon has no publisher (events none): it records no events and says so. */
static void
test_service_without_publisher_records_no_events(void **state)
{
	struct kvp_client_options o = {.url = ipc_url, .timeout_ms = 3000};
	struct kvp_client *c = NULL;
	struct kvp_client_stats st;
	struct kvp_client_slots_result res;
	int32_t ids[8];
	int64_t prompt[40];
	bool available = true;
	uint64_t next = 7;
	int calls = 0;

	(void)state;
	for (int i = 0; i < 40; i++)
		prompt[i] = 300 + i;
	assert_ok(kvp_client_open(&o, &c));
	struct kvp_client_slots a = {.request_id = 1, .prompt = prompt, .num_prompt = 40};
	assert_ok(kvp_client_allocate_slots(c, &a, ids, 8, &res)); /* caches 2 blocks */
	assert_ok(kvp_client_free_request(c, 1, false));
	assert_ok(kvp_client_stats(c, &st));
	assert_int_equal(st.num_cached_blocks, 2);
	assert_int_equal(st.events_emitted, 0);
	assert_status(kvp_client_replay(c, kvp_client_info(c)->event_epoch, 0, &available, &next,
	                                each_batch, &calls),
	              KVP_ENOTSUP);
	assert_non_null(strstr(kvp_client_last_detail(c), "records no events"));
	assert_int_equal(calls, 0);
	kvp_client_close(c);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		/* The pauses first: the flood below may leave a stuck peer holding a context. */
		cmocka_unit_test(test_service_stall_zero_retries_wait_one_timeout),
		cmocka_unit_test(test_service_stall_call_past_its_deadline_is_not_applied),
		cmocka_unit_test(test_service_stall_abandoned_dial_leaves_the_endpoint_serving),
		cmocka_unit_test(test_service_stall_client_gone_at_once_costs_no_cpu),
		cmocka_unit_test(test_service_stall_non_reading_peer_is_cut_off_others_served),
		cmocka_unit_test(test_service_without_publisher_records_no_events),
		cmocka_unit_test(test_service_stall_silent_peer_is_closed_live_client_redials),
		cmocka_unit_test(test_service_admin_endpoint_cannot_be_held),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
