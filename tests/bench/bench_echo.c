/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvp-bench-echo URL: the raw round trip's server in a process of its own,
 * for `kvp-bench-step --pin`, which places it on the daemon's CPU so that the
 * raw baseline crosses CPUs and processes as the remote step does. A REP
 * socket on URL; each request's first 16 bytes say what to answer: the reply's
 * length (u64, little-endian), then how long to spin first, in ns (u64). It
 * replies with that many zero bytes, built as the daemon builds a reply, and
 * runs until SIGTERM (kvp_reap).
 */
#define _POSIX_C_SOURCE 200809L

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_raw.h"

static double
now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int
main(int argc, char **argv)
{
	nng_socket s;
	uint8_t *zero = NULL;
	size_t cap = 0;

	if (argc != 2) {
		fprintf(stderr, "usage: kvp-bench-echo URL\n");
		return 2;
	}
	if (nng_rep0_open(&s) != 0 || nng_listen(s, argv[1], NULL, 0) != 0) {
		fprintf(stderr, "kvp-bench-echo: cannot listen on %s\n", argv[1]);
		return 1;
	}
	for (;;) {
		nng_msg *m;
		uint64_t hdr[2] = {0, 0};
		if (nng_recvmsg(s, &m, 0) != 0)
			break;
		if (nng_msg_len(m) >= BENCH_ECHO_HDR)
			memcpy(hdr, nng_msg_body(m), sizeof(hdr)); /* little-endian hosts only */
		nng_msg_free(m);
		size_t len = hdr[0] > BENCH_ECHO_MAX ? BENCH_ECHO_MAX : (size_t)hdr[0];
		if (len > cap) {
			free(zero);
			if ((zero = calloc(1, len)) == NULL)
				break;
			cap = len;
		}
		for (double end = now_s() + (double)hdr[1] / 1e9; now_s() < end;)
			;
		if (nng_msg_alloc(&m, len) != 0)
			break;
		if (len)
			memcpy(nng_msg_body(m), zero, len);
		if (nng_sendmsg(s, m, 0) != 0)
			nng_msg_free(m);
	}
	free(zero);
	nng_close(s);
	return 0;
}
