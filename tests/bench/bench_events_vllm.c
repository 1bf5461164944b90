/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvp-bench-events' rows for vLLM's ZMQ event wire: what 1 and 4 libzmq
 * subscribers receive from kvpoold's vLLM-wire publisher under the load,
 * beside raw libzmq PUB/SUB of same-size three-frame messages in the same
 * run; and what publishing the second wire costs the RPC path (the same
 * load against a daemon with the wire off and one with it on, alternating).
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "bench_events.h"
#include "../spawn.h"
#include "bench_util.h"

static pid_t
spawn(const char *daemon, const char *rpc, const char *events, const char *vllm)
{
	const char *argv[32] = {daemon, "--quiet", "--rpc", rpc, "--events", events, "--admin",
	                        "none", "--pool", "name=bench,blocks=100000,block_size=16",
	                        "--lease-ms", "600000", "--max-msg-bytes", "67108864"};
	int n = 14;
	if (vllm) {
		argv[n++] = "--vllm-events";
		argv[n++] = vllm;
	}
	argv[n] = NULL;
	return kvp_spawn(argv, NULL);
}

void
vllm_bench_start(struct vllm_bench *vb, const char *daemon, int pid)
{
	char ev_off[128], ev_on[128];
	snprintf(vb->rpc_off, sizeof(vb->rpc_off), "ipc:///tmp/kvpool-bvl-off-%d.ipc", pid);
	snprintf(vb->rpc_on, sizeof(vb->rpc_on), "ipc:///tmp/kvpool-bvl-on-%d.ipc", pid);
	snprintf(ev_off, sizeof(ev_off), "ipc:///tmp/kvpool-bvl-ev-off-%d.ipc", pid);
	snprintf(ev_on, sizeof(ev_on), "ipc:///tmp/kvpool-bvl-ev-on-%d.ipc", pid);
	snprintf(vb->pub, sizeof(vb->pub), "ipc:///tmp/kvpool-bvl-pub-%d.ipc", pid);
	snprintf(vb->raw, sizeof(vb->raw), "ipc:///tmp/kvpool-bvl-raw-%d.ipc", pid);
	vb->off = spawn(daemon, vb->rpc_off, ev_off, NULL);
	vb->on = spawn(daemon, vb->rpc_on, ev_on, vb->pub);
}

struct zsub {
	pthread_t th;
	void *s;
	atomic_bool stop;
	uint64_t msgs, bytes, gaps, last;
	int have;
};

static void *
zsub_main(void *arg)
{
	struct zsub *z = arg;
	while (!atomic_load(&z->stop)) {
		zmq_pollitem_t it = {.socket = z->s, .events = ZMQ_POLLIN};
		if (zmq_poll(&it, 1, 50) <= 0)
			continue;
		zmq_msg_t f[3];
		int nf = 0, more = 1;
		while (more && nf < 3) {
			zmq_msg_init(&f[nf]);
			if (zmq_msg_recv(&f[nf], z->s, 0) < 0)
				break;
			more = zmq_msg_more(&f[nf]);
			nf++;
		}
		if (nf == 3 && zmq_msg_size(&f[1]) == 8) {
			const uint8_t *b = zmq_msg_data(&f[1]);
			uint64_t seq = 0;
			for (int i = 0; i < 8; i++)
				seq = seq << 8 | b[i];
			if (z->have && seq != z->last + 1)
				z->gaps++;
			z->last = seq;
			z->have = 1;
			z->msgs++;
			z->bytes += zmq_msg_size(&f[2]);
		}
		for (int i = 0; i < nf; i++)
			zmq_msg_close(&f[i]);
	}
	return NULL;
}

static int
subs_open(void *ctx, struct zsub *z, int n, const char *url)
{
	for (int i = 0; i < n; i++) {
		int hwm = 100000;
		memset(&z[i], 0, sizeof(z[i]));
		z[i].s = zmq_socket(ctx, ZMQ_SUB);
		zmq_setsockopt(z[i].s, ZMQ_RCVHWM, &hwm, sizeof(hwm));
		zmq_setsockopt(z[i].s, ZMQ_SUBSCRIBE, "", 0);
		if (zmq_connect(z[i].s, url) != 0)
			return -1;
		pthread_create(&z[i].th, NULL, zsub_main, &z[i]);
	}
	nanosleep(&(struct timespec){0, 300000000}, NULL); /* subscriptions reach the PUB */
	return 0;
}

static void
subs_close(struct zsub *z, int n)
{
	for (int i = 0; i < n; i++) {
		atomic_store(&z[i].stop, true);
		pthread_join(z[i].th, NULL);
		int zero = 0;
		zmq_setsockopt(z[i].s, ZMQ_LINGER, &zero, sizeof(zero));
		zmq_close(z[i].s);
	}
}

static int
client(const char *url, struct load *l)
{
	struct kvp_client_options o = {.url = url, .pool = "bench", .timeout_ms = 30000,
	                               .lease_ms = 600000};
	memset(l, 0, sizeof(*l));
	for (int i = 0; i < 100; i++) {
		if (kvp_client_open(&o, &l->c) == KVP_OK)
			break;
		kvp_client_close(l->c);
		l->c = NULL;
		nanosleep(&(struct timespec){0, 50000000}, NULL);
	}
	if (l->c == NULL || kvp_batch_create(&l->b) != KVP_OK)
		return -1;
	/* Warm up until every block has been cached: each batch then evicts 64. */
	for (int i = 0; i < 100000 / 64 + 2; i++)
		if (load_step(l) != 0)
			return -1;
	return 0;
}

static double
run_load(struct load *l, double secs, int *failed)
{
	uint64_t n = 0;
	double t0 = now();
	while (now() - t0 < secs && !*failed) {
		*failed |= load_step(l) != 0;
		n++;
	}
	return (double)n / (now() - t0);
}

static int
cmp_rate(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Raw libzmq: one PUB sending [topic, 8 B, payload] as fast as it can for secs. */
static double
raw_rate(void *ctx, const char *url, int nsubs, size_t topic_len, size_t payload, double secs)
{
	void *pub = zmq_socket(ctx, ZMQ_PUB);
	int hwm = 100000, zero = 0;
	struct zsub z[4];
	char *buf = calloc(1, payload + topic_len + 8);
	zmq_setsockopt(pub, ZMQ_SNDHWM, &hwm, sizeof(hwm));
	zmq_setsockopt(pub, ZMQ_LINGER, &zero, sizeof(zero));
	if (buf == NULL || zmq_bind(pub, url) != 0 || subs_open(ctx, z, nsubs, url) != 0) {
		free(buf);
		zmq_close(pub);
		return 0;
	}
	double t0 = now();
	while (now() - t0 < secs) {
		zmq_send(pub, buf, topic_len, ZMQ_SNDMORE);
		zmq_send(pub, buf, 8, ZMQ_SNDMORE);
		zmq_send(pub, buf, payload, 0);
	}
	nanosleep(&(struct timespec){0, 100000000}, NULL);
	double dt = now() - t0;
	subs_close(z, nsubs);
	uint64_t got = 0;
	for (int i = 0; i < nsubs; i++)
		got += z[i].msgs;
	zmq_close(pub);
	free(buf);
	return (double)got / nsubs / dt;
}

int
vllm_bench_run(struct vllm_bench *vb, double seconds)
{
	struct load off, on;
	int failed = 0;
	void *ctx = zmq_ctx_new();

	if (client(vb->rpc_off, &off) != 0 || client(vb->rpc_on, &on) != 0) {
		fprintf(stderr, "bench: the vLLM-wire daemons did not answer\n");
		failed = 1;
		goto out;
	}
	/*
	 * The RPC path with the second wire off and on: rounds alternate which
	 * daemon goes first (a later run in a round was measured slower on these
	 * VMs whatever it ran), and each round's on/off ratio is kept.
	 */
	enum { ROUNDS = 8 };
	double r_off[ROUNDS], r_on[ROUNDS], ratio[ROUNDS];
	for (int k = 0; k < ROUNDS; k++) {
		if (k % 2 == 0) {
			r_off[k] = run_load(&off, seconds / 2, &failed);
			r_on[k] = run_load(&on, seconds / 2, &failed);
		} else {
			r_on[k] = run_load(&on, seconds / 2, &failed);
			r_off[k] = run_load(&off, seconds / 2, &failed);
		}
		ratio[k] = r_off[k] > 0 ? r_on[k] / r_off[k] : 0;
	}
	qsort(r_off, ROUNDS, sizeof(double), cmp_rate);
	qsort(r_on, ROUNDS, sizeof(double), cmp_rate);
	qsort(ratio, ROUNDS, sizeof(double), cmp_rate);
	printf("\nvLLM wire (ipc, map events, int hashes). RPC path: Batches evicting and caching 64 "
	       "blocks (65 events), one client, %d rounds of %.1f s per daemon, the first daemon "
	       "of a round alternating; medians:\n\n", ROUNDS, seconds / 2);
	printf("| daemon | Batches/s | on/off per round (median, min, max) |\n|---|---|---|\n");
	printf("| native stream only | %.0f | |\n", (r_off[3] + r_off[4]) / 2);
	printf("| native stream + vLLM wire | %.0f | %.2f (%.2f .. %.2f) |\n\n",
	       (r_on[3] + r_on[4]) / 2, (ratio[3] + ratio[4]) / 2, ratio[0], ratio[ROUNDS - 1]);
	bench_json("events", "the RPC path while kvpoold also publishes vLLM's wire: Batches",
	           (r_on[3] + r_on[4]) / 2, "Batches/s", "the same daemon, native stream only",
	           (r_off[3] + r_off[4]) / 2, "higher");

	printf("| wire | subscribers | events/s per subscriber | batches/s | payload bytes | raw "
	       "libzmq PUB/SUB msgs/s (same size) | ratio | gaps |\n|---|---|---|---|---|---|---|---|\n");
	for (int n = 1; n <= 4; n += 3) {
		struct zsub z[4];
		if (subs_open(ctx, z, n, vb->pub) != 0) {
			failed = 1;
			break;
		}
		double t0 = now();
		run_load(&on, seconds, &failed);
		nanosleep(&(struct timespec){0, 100000000}, NULL);
		double dt = now() - t0;
		subs_close(z, n);
		uint64_t msgs = 0, bytes = 0, gaps = 0;
		for (int i = 0; i < n; i++) {
			msgs += z[i].msgs;
			bytes += z[i].bytes;
			gaps += z[i].gaps;
		}
		size_t avg = msgs ? (size_t)(bytes / msgs) : 0;
		double per_sub = (double)msgs / n / dt;
		double raw = raw_rate(ctx, vb->raw, n, 24, avg ? avg : 1, seconds);
		failed |= msgs == 0;
		printf("| vLLM (kvpoold) | %d | %.0f | %.0f | %zu | %.0f | %.2f | %llu |\n", n,
		       per_sub * 65, per_sub, avg, raw, raw > 0 ? per_sub / raw : 0,
		       (unsigned long long)gaps);
	}
out:
	kvp_batch_destroy(off.b);
	kvp_client_close(off.c);
	kvp_batch_destroy(on.b);
	kvp_client_close(on.c);
	zmq_ctx_term(ctx);
	pid_t d[2] = {vb->off, vb->on};
	for (int i = 0; i < 2; i++) {
		failed |= kvp_reap(d[i], 10000) != 0;
	}
	return failed;
}
