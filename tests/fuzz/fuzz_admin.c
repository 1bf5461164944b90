/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target: arbitrary bytes at kvpoold's admin HTTP endpoint
 * (service/net/admin.c over nng's HTTP server), the way a scanner or a broken
 * probe reaches it. One endpoint on 127.0.0.1 lives for the whole run; each
 * input is written to a fresh connection, which is then half-closed. The
 * endpoint must answer or close that connection within 5 s, and after
 * every 32 inputs a well-formed GET /healthz must still get 200 and GET
 * /metrics must still render: the run aborts (a finding) otherwise.
 */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/kvp_status.h"
#include "service/net/admin.h"
#include "service/config/config.h"
#include "service/pool/server.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct kvpd_server *srv;
static struct kvpd_admin *adm;
static atomic_bool ready = true;
static int port;
static unsigned long inputs;

static double
now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int
dial(void)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0)
		return fd;
	if (fd >= 0)
		close(fd);
	return -1;
}

/* Reads until the peer closes or limit_s passes; returns bytes read, or -1 on timeout. */
static long
drain(int fd, char *keep, size_t cap, double limit_s)
{
	double t0 = now_s();
	long n = 0;
	char buf[4096];
	while (now_s() - t0 < limit_s) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		if (poll(&p, 1, 100) <= 0)
			continue;
		ssize_t r = read(fd, buf, sizeof(buf));
		if (r <= 0)
			return n;
		if (keep != NULL && (size_t)n + (size_t)r < cap)
			memcpy(keep + n, buf, (size_t)r);
		n += r;
	}
	return -1;
}

static void
die(const char *what)
{
	fprintf(stderr, "fuzz_admin: %s (after %lu inputs)\n", what, inputs);
	abort(); /* a finding: libFuzzer saves the input */
}

/* The endpoint still serves a well-formed request for path with a 200 and a body holding want. */
static void
still_serves(const char *path, const char *want)
{
	static char resp[1 << 18];
	char req[128];
	int fd = dial();
	if (fd < 0)
		die("the admin endpoint no longer accepts connections");
	int len = snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
	                   path);
	if (send(fd, req, (size_t)len, MSG_NOSIGNAL) != len)
		die("cannot send a well-formed request");
	memset(resp, 0, sizeof(resp));
	long n = drain(fd, resp, sizeof(resp) - 1, 5.0);
	close(fd);
	if (n <= 0 || strncmp(resp, "HTTP/1.1 200", 12) != 0 || strstr(resp, want) == NULL)
		die("a well-formed request no longer gets its 200");
}

int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
	static char *args[] = {"fuzz", "--pool", "name=fuzz,blocks=64,block_size=4", "--events",
	                       "none", "--executor", "none", "--quiet", NULL};
	static struct kvpd_config cfg;
	char err[256] = "", url[64];
	(void)argc;
	(void)argv;
	port = 6000 + (int)(getpid() % 2000); /* below the ephemeral range, apart from the tests' */
	snprintf(url, sizeof(url), "http://127.0.0.1:%d", port);
	if (kvpd_config_load(&cfg, 8, args, NULL, stdout, stderr) != 0 ||
	    kvpd_server_create(&cfg, &srv, err, sizeof(err)) != KVP_OK ||
	    kvpd_admin_open(srv, url, &ready, &adm, err, sizeof(err)) != KVP_OK) {
		fprintf(stderr, "fuzz_admin: cannot start the endpoint: %s\n", err);
		abort(); /* the harness itself is broken: not an input */
	}
	still_serves("/healthz", "ok");
	return 0;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int fd = dial();
	if (fd < 0)
		die("the admin endpoint no longer accepts connections");
	/* The endpoint may answer (and close) before taking every byte: EPIPE is fine. */
	for (size_t off = 0; off < size;) {
		ssize_t w = send(fd, data + off, size - off, MSG_NOSIGNAL);
		if (w <= 0)
			break;
		off += (size_t)w;
	}
	shutdown(fd, SHUT_WR);
	if (drain(fd, NULL, 0, 5.0) < 0)
		die("a half-closed connection was neither answered nor closed within 5 s");
	/* Close with a reset: thousands of client-side TIME_WAITs would hold ephemeral ports. */
	struct linger lg = {.l_onoff = 1, .l_linger = 0};
	(void)setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	close(fd);
	if (++inputs % 32 == 0) {
		still_serves("/healthz", "ok");
		still_serves("/metrics", "kvpool_build_info");
	}
	return 0;
}
