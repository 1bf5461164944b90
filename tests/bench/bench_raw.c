/* SPDX-License-Identifier: Apache-2.0 */
/* bench_raw.c: raw nng REQ/REP round trips (see bench_raw.h). */
#define _GNU_SOURCE /* sched_setaffinity */

#include "bench_raw.h"

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>

#include "../spawn.h"

#include "bench_util.h"

struct echo {
	nng_socket sock;
	size_t reply_len;
	double spin_us;
	pthread_t th;
};

/* Busy (not asleep) for us microseconds: a CPU at work, as the daemon's is. */
static void
spin(double us)
{
	if (us <= 0)
		return;
	double end = now() + us / 1e6;
	while (now() < end)
		;
}

static void *
echo_main(void *arg)
{
	struct echo *e = arg;
	uint8_t *out = calloc(1, e->reply_len ? e->reply_len : 1);
	for (;;) {
		nng_msg *m;
		if (out == NULL || nng_recvmsg(e->sock, &m, 0) != 0)
			break;
		nng_msg_free(m);
		spin(e->spin_us);
		/* Reply with a message of the reply's size, built as the daemon builds one. */
		if (nng_msg_alloc(&m, e->reply_len) != 0)
			break;
		memcpy(nng_msg_body(m), out, e->reply_len);
		if (nng_sendmsg(e->sock, m, 0) != 0) {
			nng_msg_free(m);
			break;
		}
	}
	free(out);
	return NULL;
}

/* The client's side: n timed round trips on url (after 16 untimed). */
static int
client_loop(const char *url, const uint8_t *req, size_t req_len, uint64_t n, double *wall,
            double client_us)
{
	nng_socket s;
	int rv = -1;

	if (nng_req0_open(&s) != 0)
		return -1;
	if (nng_dial(s, url, NULL, 0) == 0) {
		rv = 0;
		for (uint64_t i = 0; i < n + 16 && rv == 0; i++) {
			nng_msg *m;
			spin(client_us);
			double t0 = now();
			if (nng_msg_alloc(&m, req_len) != 0) {
				rv = -1;
				break;
			}
			memcpy(nng_msg_body(m), req, req_len);
			if (nng_sendmsg(s, m, 0) != 0 || nng_recvmsg(s, &m, 0) != 0) {
				rv = -1;
				break;
			}
			nng_msg_free(m);
			if (i >= 16) /* after a warm-up */
				wall[i - 16] = now() - t0;
		}
	}
	nng_close(s);
	return rv;
}

int
bench_raw_run(const char *url, size_t req_len, size_t rep_len, uint64_t n, double *wall,
              double server_us, double client_us)
{
	struct echo e = {.reply_len = rep_len, .spin_us = server_us};
	uint8_t *req = calloc(1, req_len ? req_len : 1);
	int rv = -1;

	if (req == NULL || nng_rep0_open(&e.sock) != 0)
		goto out;
	if (nng_listen(e.sock, url, NULL, 0) != 0 ||
	    pthread_create(&e.th, NULL, echo_main, &e) != 0) {
		nng_close(e.sock);
		goto out;
	}
	rv = client_loop(url, req, req_len, n, wall, client_us);
	nng_close(e.sock);
	pthread_join(e.th, NULL);
out:
	free(req);
	return rv;
}

int
bench_raw_run_remote(const char *url, size_t req_len, size_t rep_len, uint64_t n, double *wall,
                     double server_us, double client_us)
{
	uint64_t hdr[2] = {rep_len, (uint64_t)(server_us * 1e3)};
	uint8_t *req;
	int rv;

	if (req_len < BENCH_ECHO_HDR || (req = calloc(1, req_len)) == NULL)
		return -1;
	memcpy(req, hdr, sizeof(hdr)); /* little-endian hosts only, as kvp-bench-echo reads it */
	rv = client_loop(url, req, req_len, n, wall, client_us);
	free(req);
	return rv;
}

int
bench_echo_start(const char *path, const char *url, int cpu)
{
	char c[16];
	snprintf(c, sizeof(c), "%d", cpu);
	const char *pinned[] = {"/usr/bin/taskset", "-c", c, path, url, NULL};
	const char *plain[] = {path, url, NULL};
	return (int)kvp_spawn(cpu >= 0 ? pinned : plain, NULL);
}

int
bench_pin_self(int cpu)
{
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	return sched_setaffinity(0, sizeof(set), &set);
}
