/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvp-bench-echo URL: the raw round trip's server in a process of its own,
 * for `kvp-bench-step --pin` and `kvp-bench-service --pin`, which place it on
 * the daemon's CPU so that the raw baseline crosses CPUs and processes as the
 * remote calls do. It serves as kvpoold's transport does: a REP socket on URL
 * with eight contexts, each an aio whose callback does the work and sends the
 * reply (service/net/transport.c), so its round trips pay the same thread
 * handoffs. Each request's first 16 bytes say what to answer: the reply's
 * length (u64, little-endian), then how long to spin first, in ns of the
 * thread's CPU time (u64). It replies with that many zero bytes, built as the
 * daemon builds a reply, and runs until SIGTERM (kvp_reap).
 */
#define _POSIX_C_SOURCE 200809L

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_raw.h"

#define CONTEXTS 8 /* kvpoold's default --contexts */

struct worker {
	nng_ctx ctx;
	nng_aio *aio;
	int sending;
};

static struct worker workers[CONTEXTS];

/*
 * This thread's CPU time: the spin stands for the daemon's handler, so it
 * counts CPU spent, not wall time (preempted by the other contexts' threads
 * on the same CPU, a wall-clock spin would charge their time twice).
 */
static double
cpu_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The request's answer: a zeroed reply of the length it names, after its spin. */
static nng_msg *
answer(nng_msg *req)
{
	uint64_t hdr[2] = {0, 0};
	nng_msg *m;

	if (nng_msg_len(req) >= BENCH_ECHO_HDR)
		memcpy(hdr, nng_msg_body(req), sizeof(hdr)); /* little-endian hosts only */
	nng_msg_free(req);
	size_t len = hdr[0] > BENCH_ECHO_MAX ? BENCH_ECHO_MAX : (size_t)hdr[0];
	for (double end = cpu_s() + (double)hdr[1] / 1e9; cpu_s() < end;)
		;
	if (nng_msg_alloc(&m, len) != 0)
		return NULL;
	memset(nng_msg_body(m), 0, len);
	return m;
}

static void
worker_cb(void *arg)
{
	struct worker *w = arg;
	if (w->sending) {
		w->sending = 0;
		if (nng_aio_result(w->aio) != 0)
			nng_msg_free(nng_aio_get_msg(w->aio));
		nng_ctx_recv(w->ctx, w->aio);
		return;
	}
	if (nng_aio_result(w->aio) != 0) /* closed: stop; else a broken pipe: go on */
		return;
	nng_msg *rep = answer(nng_aio_get_msg(w->aio));
	if (rep == NULL) {
		nng_ctx_recv(w->ctx, w->aio);
		return;
	}
	nng_aio_set_msg(w->aio, rep);
	w->sending = 1;
	nng_ctx_send(w->ctx, w->aio);
}

int
main(int argc, char **argv)
{
	nng_socket s;
	sigset_t set;
	int sig;

	if (argc != 2) {
		fprintf(stderr, "usage: kvp-bench-echo URL\n");
		return 2;
	}
	/* SIGTERM waited for, not delivered: the process ends through main. */
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	if (pthread_sigmask(SIG_BLOCK, &set, NULL) != 0 || nng_rep0_open(&s) != 0 ||
	    nng_listen(s, argv[1], NULL, 0) != 0) {
		fprintf(stderr, "kvp-bench-echo: cannot listen on %s\n", argv[1]);
		return 1;
	}
	for (int i = 0; i < CONTEXTS; i++) {
		if (nng_aio_alloc(&workers[i].aio, worker_cb, &workers[i]) != 0 ||
		    nng_ctx_open(&workers[i].ctx, s) != 0) {
			fprintf(stderr, "kvp-bench-echo: out of memory\n");
			return 1;
		}
		nng_ctx_recv(workers[i].ctx, workers[i].aio);
	}
	(void)sigwait(&set, &sig);
	nng_close(s);
	for (int i = 0; i < CONTEXTS; i++)
		nng_aio_free(workers[i].aio);
	return 0;
}
