/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The same-host call channel (common/shm_chan.h, docs/service.md "Same-host
 * calls") through a real kvpoold over ipc: a client's calls go through it
 * (kvpool_shm_calls_total), KVPOOL_SHM=0 keeps one on nng, a closed client
 * ends its channel, even with a fork's child alive; a SIGSTOPped daemon costs a call its timeout once, not
 * twice, and calls go on over nng after SIGCONT, the channel coming back;
 * a peer that writes garbage or a length past the area gets an error reply
 * and the daemon serves on; a socket at PATH.shm that hands over nothing
 * leaves the client on nng.
 */
#define _GNU_SOURCE /* syscall (the futex) */
#include "daemon_util.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "kvp_test.h"

#include "clients/c/kvpool.h"
#include "common/shm_chan.h"

static char ipc_url[128], tcp_url[128], admin[64];

static pid_t daemon_pid;

static struct kvp_client *
client(uint32_t timeout_ms, uint32_t retries)
{
	struct kvp_client_options o = {.url = ipc_url, .timeout_ms = timeout_ms, .retries = retries};
	struct kvp_client *c = NULL;
	assert_int_equal(kvp_client_open(&o, &c), KVP_OK);
	return c;
}

static double
shm_calls(void)
{
	return metric_value("kvpool_shm_calls_total");
}

/* The gauge, once it settles on want (a closed channel ends within its 100 ms wait). */
static double
channels_become(double want)
{
	double v = -1;
	for (int i = 0; i < 100 && (v = metric_value("kvpool_shm_channels")) != want; i++)
		sleep_ms(10);
	return v;
}

static void
test_shm_calls_go_through_the_channel(void **state)
{
	(void)state;
	struct kvp_client_stats st;
	struct kvp_client *c = client(2000, 1);
	assert_true(channels_become(1) == 1);
	double before = shm_calls();
	for (int i = 0; i < 100; i++)
		assert_int_equal(kvp_client_stats(c, &st), KVP_OK);
	assert_true(st.num_blocks == 64);
	double through = shm_calls() - before;
	print_message("100 Stats calls: %.0f of them through the channel\n", through);
	assert_true(through >= 100);

	/* KVPOOL_SHM=0: this client stays on nng. */
	setenv("KVPOOL_SHM", "0", 1);
	struct kvp_client *n = client(2000, 1);
	unsetenv("KVPOOL_SHM");
	before = shm_calls();
	for (int i = 0; i < 20; i++)
		assert_int_equal(kvp_client_stats(n, &st), KVP_OK);
	assert_true(shm_calls() - before < 1);
	assert_true(metric_value("kvpool_shm_channels") == 1);
	kvp_client_close(n);
	kvp_client_close(c);
	assert_true(channels_become(0) == 0);
}

/* A fork's child holds no channel open: its parent's close ends the channel at once. */
static void
test_shm_a_fork_does_not_keep_the_channel(void **state)
{
	(void)state;
	struct kvp_client_stats st;
	struct kvp_client *c = client(2000, 1);
	assert_int_equal(kvp_client_stats(c, &st), KVP_OK);
	assert_true(channels_become(1) == 1);
	pid_t child = fork();
	if (child == 0) {
		sleep(3); /* a worker that lives on; it never calls */
		_exit(0);
	}
	assert_true(child > 0);
	kvp_client_close(c);
	double left = channels_become(0);
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	print_message("channels open after the parent closed its client, the child alive: %.0f\n",
	              left);
	assert_true(left == 0);
}

/* A stalled daemon: one timeout for a call with no retries, then nng, then the channel again. */
static void
test_shm_stalled_daemon_costs_one_timeout(void **state)
{
	(void)state;
	struct kvp_client_stats st;
	struct kvp_client *c = client(300, 0);
	assert_int_equal(kvp_client_stats(c, &st), KVP_OK);
	kill(daemon_pid, SIGSTOP);
	sleep_ms(50); /* stopped, not still answering */
	uint64_t t0 = (uint64_t)(now_s() * 1000);
	int rv = kvp_client_stats(c, &st);
	uint64_t took = (uint64_t)(now_s() * 1000) - t0;
	kill(daemon_pid, SIGCONT);
	print_message("a call to a stopped daemon: %s after %llu ms (timeout 300 ms, no retries)\n",
	              kvp_status_name(rv), (unsigned long long)took);
	assert_int_equal(rv, KVP_EBUSY);
	assert_true(took >= 290 && took < 600);
	/* Calls go on (over nng until the channel is asked for again, within 2 s). */
	int ok = 0;
	for (int i = 0; i < 40; i++) {
		ok += kvp_client_stats(c, &st) == KVP_OK;
		sleep_ms(100);
	}
	assert_true(ok >= 38);
	double before = shm_calls();
	assert_int_equal(kvp_client_stats(c, &st), KVP_OK);
	assert_true(shm_calls() - before >= 1);
	kvp_client_close(c);
}

/* Connects to PATH.shm as a client would and maps the channel; returns the socket. */
static int
raw_channel(unsigned char **map, uint64_t *area)
{
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	snprintf(a.sun_path, sizeof(a.sun_path), "%.100s.shm", ipc_url + 6);
	int s = socket(AF_UNIX, SOCK_STREAM, 0);
	assert_true(s >= 0);
	assert_int_equal(connect(s, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(send(s, KVP_CHAN_HELLO, 8, 0), 8);
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = {.iov_base = area, .iov_len = sizeof(*area)};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
	                   .msg_controllen = sizeof(u.buf)};
	assert_int_equal(recvmsg(s, &m, MSG_WAITALL), (ssize_t)sizeof(*area));
	int fd;
	memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&m)), sizeof(int));
	*map = mmap(NULL, KVP_CHAN_HDR + 2 * *area, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	assert_true(*map != MAP_FAILED);
	return s;
}

/* One raw call: 1 + the reply's length once answered (an empty one: no reply), 0: not in 2 s. */
static uint32_t
raw_call(unsigned char *map, const void *req, uint32_t len, uint32_t claimed, uint32_t seq)
{
	struct kvp_chan_hdr *h = (struct kvp_chan_hdr *)map;
	memcpy(kvp_chan_req(map), req, len);
	atomic_store(&h->req_len, claimed);
	atomic_store(&h->req_seq, seq);
	kvp_futex_wake(&h->req_seq);
	for (int i = 0; i < 200 && atomic_load(&h->rep_seq) != seq; i++)
		sleep_ms(10);
	return atomic_load(&h->rep_seq) == seq ? 1 + atomic_load(&h->rep_len) : 0;
}

static void
test_shm_garbage_gets_an_error_reply(void **state)
{
	(void)state;
	unsigned char *map;
	uint64_t area = 0;
	int s = raw_channel(&map, &area);
	unsigned char junk[256];
	memset(junk, 0xff, sizeof(junk));
	/*
	 * Bytes that are no Request, a length past the area, nothing: each is
	 * answered (with no reply, as nng drops them), and the daemon serves on.
	 */
	assert_true(raw_call(map, junk, sizeof(junk), sizeof(junk), 1) > 0);
	assert_true(raw_call(map, junk, 16, (uint32_t)area + 1, 2) > 0);
	assert_true(raw_call(map, junk, 0, 0, 3) > 0);
	munmap(map, KVP_CHAN_HDR + 2 * area);
	close(s);
	struct kvp_client_stats st;
	struct kvp_client *c = client(2000, 1);
	assert_int_equal(kvp_client_stats(c, &st), KVP_OK);
	kvp_client_close(c);
}

/* A unix socket at PATH.shm that hands over nothing: the client keeps nng. */
static void
test_shm_a_socket_that_hands_nothing_over(void **state)
{
	(void)state;
	char url[160], path[64];
	snprintf(path, sizeof(path), "/tmp/kvpool-shmfake-%d.ipc", (int)getpid());
	snprintf(url, sizeof(url), "ipc://%s", path);
	const char *args[] = {"--rpc", url, "--admin", "none", "--events", "none", "--pool",
	                      "name=default,blocks=8", "--shm-channels", "0", NULL};
	pid_t d = daemon_start(args);
	assert_true(d > 0);
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	snprintf(a.sun_path, sizeof(a.sun_path), "%.64s.shm", path);
	int l = socket(AF_UNIX, SOCK_STREAM, 0);
	assert_int_equal(bind(l, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(listen(l, 4), 0);
	struct kvp_client_options o = {.url = url, .timeout_ms = 2000, .retries = 1};
	struct kvp_client *c = NULL;
	struct kvp_client_stats st;
	/* The fake accepts (the backlog), never answers: the client waits 100 ms, then nng. */
	uint64_t t0 = (uint64_t)(now_s() * 1000);
	assert_int_equal(kvp_client_open(&o, &c), KVP_OK);
	print_message("open beside a socket that answers nothing: %llu ms\n",
	              (unsigned long long)((uint64_t)(now_s() * 1000) - t0));
	assert_true((uint64_t)(now_s() * 1000) - t0 < 1000);
	assert_int_equal(kvp_client_stats(c, &st), KVP_OK);
	assert_int_equal(st.num_blocks, 8);
	kvp_client_close(c);
	close(l);
	unlink(a.sun_path);
	assert_int_equal(daemon_stop(d), 0);
}

static int
setup(void **state)
{
	(void)state;
	daemon_urls(ipc_url, sizeof(ipc_url), tcp_url, sizeof(tcp_url));
	snprintf(admin, sizeof(admin), "http://127.0.0.1:%d", daemon_admin_port());
	const char *args[] = {"--rpc", ipc_url, "--admin", admin, "--events", "none", "--pool",
	                      "name=default,blocks=64", NULL};
	daemon_pid = daemon_start(args);
	return daemon_pid > 0 ? 0 : -1;
}

static int
teardown(void **state)
{
	(void)state;
	return daemon_stop(daemon_pid) == 0 ? 0 : -1;
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_shm_calls_go_through_the_channel),
		cmocka_unit_test(test_shm_a_fork_does_not_keep_the_channel),
		cmocka_unit_test(test_shm_stalled_daemon_costs_one_timeout),
		cmocka_unit_test(test_shm_garbage_gets_an_error_reply),
		cmocka_unit_test(test_shm_a_socket_that_hands_nothing_over),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
