/* SPDX-License-Identifier: Apache-2.0 */
/*
 * daemon_util.h: starts a real kvpoold for integration tests, by fork+exec
 * (nng is not fork-safe, so the child execs before touching anything), and
 * stops it with SIGTERM, returning its exit status.
 */
#ifndef KVP_DAEMON_UTIL_H
#define KVP_DAEMON_UTIL_H

#define _POSIX_C_SOURCE 200809L

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "spawn.h"

/*
 * argv: extra kvpoold arguments, NULL-terminated; log_path: a file for its
 * stderr (its log), or NULL to share the test's. Returns the child's pid.
 */
static inline pid_t
daemon_start_log(const char *const *args, const char *log_path)
{
	const char *argv[64];
	size_t n = 0;
	argv[n++] = KVPOOLD_PATH;
	argv[n++] = "--quiet";
	for (size_t i = 0; args[i] && n < 62; i++)
		argv[n++] = args[i];
	argv[n] = NULL;
	return kvp_spawn(argv, log_path);
}

static inline pid_t
daemon_start(const char *const *args)
{
	return daemon_start_log(args, NULL);
}

/* Prints the last n lines of a daemon's log (at most 64 KiB back) to stdout. */
static inline void
print_log_tail(const char *log_path, int n)
{
	static char buf[65536];
	FILE *f = fopen(log_path, "r");
	if (f == NULL)
		return;
	long at = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : 0;
	at = at > (long)sizeof(buf) - 1 ? at - (long)sizeof(buf) + 1 : 0;
	size_t len = fseek(f, at, SEEK_SET) == 0 ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
	fclose(f);
	buf[len] = '\0';
	const char *p = buf + len;
	for (int lines = 0; p > buf && lines <= n;)
		lines += *--p == '\n';
	printf("kvpoold's log (%s), its last %d lines:\n%s\n", log_path, n, p + (*p == '\n'));
}

/* SIGTERM, then waits up to 10 s. Returns the exit status, or -1. */
static inline int
daemon_stop(pid_t pid)
{
	return kvp_reap(pid, 10000);
}

/*
 * A unique ipc:// URL, tcp port and admin port for this test process, all
 * below Linux's ephemeral range (32768-60999): a port there may be the
 * local end of some connection (or its TIME_WAIT), and then cannot be bound.
 */
static inline void
daemon_urls(char *ipc, size_t ipc_len, char *tcp, size_t tcp_len)
{
	snprintf(ipc, ipc_len, "ipc:///tmp/kvpool-test-%d.ipc", (int)getpid());
	snprintf(tcp, tcp_len, "tcp://127.0.0.1:%d", 20000 + (int)(getpid() % 12000));
}

static inline int
daemon_admin_port(void)
{
	return 8000 + (int)(getpid() % 12000);
}

/*
 * GET path from 127.0.0.1:port over a plain socket. Returns the HTTP status
 * (or -1) and the body in buf (NUL-terminated, truncated to cap).
 */
static inline int
http_get(int port, const char *path, char *buf, size_t cap)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	int fd = socket(AF_INET, SOCK_STREAM, 0), status = -1;
	size_t n = 0;
	char req[256];

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	/* Bounded: a daemon that stops answering is a failed probe, not a hung test. */
	struct timeval tv = {.tv_sec = 10};
	if (fd >= 0) {
		(void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
		(void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	}
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	int len = snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
	if (write(fd, req, (size_t)len) != len) {
		close(fd);
		return -1;
	}
	for (ssize_t r; n < cap - 1 && (r = read(fd, buf + n, cap - 1 - n)) > 0;)
		n += (size_t)r;
	buf[n] = '\0';
	close(fd);
	if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1)
		return -1;
	char *body = strstr(buf, "\r\n\r\n");
	if (body)
		memmove(buf, body + 4, strlen(body + 4) + 1);
	return status;
}

static inline void
sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

/*
 * The value of one series on the daemon's /metrics (admin on
 * daemon_admin_port()), named in full with its labels, e.g.
 * kvpool_blocks{pool="default"}; -1 if the page or the series is missing.
 * Not thread-safe (one static buffer).
 */
static inline double
metric_value(const char *series)
{
	static char body[1 << 18];
	char key[256];
	if (http_get(daemon_admin_port(), "/metrics", body, sizeof(body)) != 200)
		return -1;
	snprintf(key, sizeof(key), "\n%s ", series);
	const char *p = strstr(body, key);
	return p ? strtod(p + strlen(key), NULL) : -1;
}

/* Monotonic seconds, for timing. */
static inline double
now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A process's resident memory (VmRSS), in bytes; 0 if /proc does not say. */
static inline double
proc_rss_bytes(pid_t pid)
{
	char path[64], line[256];
	double kb = 0;
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	while (f != NULL && fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %lf kB", &kb) == 1)
			break;
	if (f != NULL)
		fclose(f);
	return kb * 1024;
}

#endif /* KVP_DAEMON_UTIL_H */
