/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvp-bench-events: the event stream's throughput and latency, beside raw
 * nng PUB/SUB of messages of the same size measured in the same run.
 *
 * usage: kvp-bench-events [--quick] [--only-vllm] [PATH_TO_KVPOOLD]
 * For each transport (ipc://, tcp://127.0.0.1) it starts a kvpoold (fork+exec
 * before touching nng) whose pool is 100,000 blocks of block size 16, drives
 * it with Batches that evict and cache 64 blocks each (64 BlockRemoved and one
 * BlockStored of 64 hashes per batch), and counts what 1 and 4 subscribers
 * receive, checking each ends with an index identical to the pool's Snapshot.
 */
#define _POSIX_C_SOURCE 200809L

#include <nng/nng.h>
#include <nng/protocol/pubsub0/pub.h>
#include <nng/protocol/pubsub0/sub.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "bench_events.h"
#include "../spawn.h"
#include "bench_util.h"
#include <unistd.h>

#include "clients/c/kvindex.h"
#include "clients/c/kvpool.h"
#include "proto/event_seal.h"
#include "clients/c/subscriber.h"

static double seconds = 2.0;
static char rpc_url[256], ev_url[256];
/* The sealed rows' pool token (NULL: the clear rows); every client presents it. */
static const char *token;
#define BENCH_TOKEN "bench-token"

/* token_file: NULL, or a file holding BENCH_TOKEN: the pool seals its events. */
static pid_t
start_daemon(const char *daemon, const char *events, const char *token_file)
{
	const char *argv[] = {daemon, "--quiet", "--rpc", rpc_url, "--events", events, "--admin",
	                      "none", "--pool", "name=bench,blocks=100000,block_size=16",
	                      "--replay-batches", "20000", "--lease-ms", "600000",
	                      "--max-msg-bytes", "67108864", token_file ? "--token-file" : NULL,
	                      token_file, NULL};
	return kvp_spawn(argv, NULL);
}

/* ---- subscribers ---- */

struct subscriber {
	pthread_t th;
	struct kvp_sub *sub;
	struct kvp_index *ix;
	atomic_bool stop;
	uint64_t events, hashes, bytes;
	int failed;
};

static void
on_reset(void *ctx, const char *pool, uint64_t epoch, uint64_t next_seq,
         const struct kvp_snapshot_entry *e, size_t n)
{
	struct subscriber *s = ctx;
	(void)epoch;
	(void)next_seq;
	if (kvp_index_reset(s->ix, e, n) != KVP_OK)
		s->failed = 1;
}

static void
on_batch(void *ctx, const char *pool, uint64_t epoch, uint64_t seq, uint64_t ts,
         const struct kvp_event_batch *b)
{
	struct subscriber *s = ctx;
	(void)epoch;
	(void)seq;
	(void)ts;
	for (size_t i = 0; i < kvp_event_batch_count(b); i++) {
		struct kvp_event ev;
		(void)kvp_event_batch_get(b, i, &ev);
		s->events++;
		s->hashes += ev.num_hashes;
	}
	if (kvp_index_apply(s->ix, b) != KVP_OK)
		s->failed = 1;
}

static void *
sub_main(void *arg)
{
	struct subscriber *s = arg;
	while (!atomic_load(&s->stop))
		if (kvp_sub_poll(s->sub, 20) != KVP_OK)
			s->failed = 1;
	return NULL;
}

static int
sub_open(struct subscriber *s)
{
	struct kvp_sub_options o = {.events_url = ev_url, .rpc_url = rpc_url, .pool = "bench",
	                            .timeout_ms = 30000, .token = token};
	struct kvp_sub_handler h = {.ctx = s, .reset = on_reset, .batch = on_batch};
	memset(s, 0, sizeof(*s));
	if (kvp_index_create(&s->ix) != KVP_OK)
		return -1;
	for (int i = 0; i < 100; i++) {
		if (kvp_sub_open(&o, &h, &s->sub) == KVP_OK)
			return 0;
		nanosleep(&(struct timespec){0, 50000000}, NULL);
	}
	return -1;
}

/* ---- the load: Batches that evict 64 cached blocks and cache 64 new ones ---- */

int
load_step(struct load *l)
{
	uint8_t h[64 * 32];
	int64_t dummy = 0;
	size_t run;
	(void)dummy;
	kvp_batch_clear(l->b);
	if (l->have) {
		for (int i = 0; i < 64; i++) {
			memset(h + i * 32, 0x77, 32);
			l->counter++;
			memcpy(h + i * 32, &l->counter, 8);
		}
		struct kvp_client_cache ca = {.block_ids = l->held, .num_block_ids = 64,
		                              .num_full_blocks = 64, .hashes = h, .num_hashes = 64};
		int32_t rev[64];
		for (int i = 0; i < 64; i++)
			rev[i] = l->held[63 - i];
		if (kvp_batch_cache(l->b, &ca) != KVP_OK || kvp_batch_free(l->b, rev, 64) != KVP_OK)
			return -1;
	}
	if (kvp_batch_allocate(l->b, 64) != KVP_OK || kvp_client_batch(l->c, l->b, &run) != KVP_OK)
		return -1;
	const int32_t *ids;
	size_t n;
	if (kvp_batch_block_ids(l->b, run - 1, &ids, &n) != KVP_OK || n != 64)
		return -1;
	memcpy(l->held, ids, sizeof(l->held));
	l->have = 1;
	return 0;
}

struct row {
	double events_per_s, hashes_per_s, msgs_per_s, avg_msg;
	uint64_t gaps, replayed, resets;
	int exact, failed;
};

/* Extra producers: each drives the pool with its own session, for `seconds`. */
struct producer {
	pthread_t th;
	struct load l;
	double t0;
	int failed;
};

static void *
producer_main(void *arg)
{
	struct producer *p = arg;
	while (now() - p->t0 < seconds && !p->failed)
		p->failed |= load_step(&p->l) != 0;
	return NULL;
}

static struct row
measure_stream(int nsubs, int nprod)
{
	struct producer extra[3];
	struct subscriber subs[4];
	struct load l = {0};
	struct kvp_client_options o = {.url = rpc_url, .pool = "bench", .timeout_ms = 30000,
	                               .lease_ms = 600000, .token = token};
	struct row r = {0};
	uint64_t batches = 0;

	for (int i = 0; i < nsubs; i++)
		if (sub_open(&subs[i]) != 0)
			r.failed = 1;
	if (r.failed || kvp_client_open(&o, &l.c) != KVP_OK || kvp_batch_create(&l.b) != KVP_OK) {
		r.failed = 1;
		return r;
	}
	/* Warm the pool up until every block has been cached (evictions every batch). */
	for (int i = 0; i < 100000 / 64 + 2 && !r.failed; i++)
		r.failed |= load_step(&l) != 0;
	for (int i = 0; i < nsubs; i++) {
		/* Count from here. */
		while (kvp_sub_poll(subs[i].sub, 50) == KVP_OK) {
			struct kvp_sub_stats st;
			kvp_sub_get_stats(subs[i].sub, NULL, &st);
			if (st.lag == 0)
				break;
		}
		subs[i].events = subs[i].hashes = 0;
		pthread_create(&subs[i].th, NULL, sub_main, &subs[i]);
	}
	struct kvp_sub_stats st0;
	kvp_sub_get_stats(subs[0].sub, NULL, &st0);
	double t0 = now();
	for (int i = 0; i < nprod - 1; i++) {
		memset(&extra[i], 0, sizeof(extra[i]));
		extra[i].t0 = t0;
		if (kvp_client_open(&o, &extra[i].l.c) != KVP_OK ||
		    kvp_batch_create(&extra[i].l.b) != KVP_OK)
			r.failed = 1;
		else
			pthread_create(&extra[i].th, NULL, producer_main, &extra[i]);
	}
	while (now() - t0 < seconds && !r.failed) {
		r.failed |= load_step(&l) != 0;
		batches++;
	}
	for (int i = 0; i < nprod - 1; i++) {
		pthread_join(extra[i].th, NULL);
		r.failed |= extra[i].failed;
		kvp_batch_destroy(extra[i].l.b);
		kvp_client_close(extra[i].l.c);
	}
	/* Wait for the subscribers to catch up with the pool's last batch. */
	struct kvp_snapshot *snap = NULL;
	if (kvp_client_snapshot(l.c, &snap) != KVP_OK)
		r.failed = 1;
	double t_end = now();
	for (int i = 0; i < nsubs && snap; i++) {
		for (int k = 0; k < 3000; k++) {
			struct kvp_sub_stats st;
			kvp_sub_get_stats(subs[i].sub, NULL, &st);
			if (st.next_seq >= snap->next_seq)
				break;
			nanosleep(&(struct timespec){0, 2000000}, NULL);
		}
	}
	double dt = now() - t0;
	(void)t_end;
	r.exact = 1;
	for (int i = 0; i < nsubs; i++) {
		atomic_store(&subs[i].stop, true);
		pthread_join(subs[i].th, NULL);
		struct kvp_sub_stats st;
		kvp_sub_get_stats(subs[i].sub, NULL, &st);
		r.gaps += st.gaps;
		r.replayed += st.replayed;
		r.resets += st.resets - 1;
		r.events_per_s += (double)subs[i].events / dt / nsubs;
		r.hashes_per_s += (double)subs[i].hashes / dt / nsubs;
		r.failed |= subs[i].failed;
		if (!snap || st.next_seq != snap->next_seq ||
		    !kvp_index_equals(subs[i].ix, snap->entries, snap->num_entries))
			r.exact = 0;
		kvp_sub_close(subs[i].sub);
		kvp_index_destroy(subs[i].ix);
	}
	r.msgs_per_s = (double)(snap ? snap->next_seq - st0.next_seq : 0) / dt;
	kvp_snapshot_free(snap);
	/* The published message size: measure one batch. */
	kvp_batch_destroy(l.b);
	kvp_client_close(l.c);
	return r;
}

/* ---- raw nng PUB/SUB, messages of the same size ---- */

struct raw_sub {
	pthread_t th;
	nng_socket s;
	atomic_bool stop;
	uint64_t got;
};

static void *
raw_sub_main(void *arg)
{
	struct raw_sub *r = arg;
	/*
	 * Non-blocking receives with a short nap when the queue is empty: a
	 * blocked nng_recvmsg was seen to outlive both its timeout and the
	 * socket's close (nng 1.5.2), hanging the benchmark.
	 */
	while (!atomic_load(&r->stop)) {
		nng_msg *m;
		int rv = nng_recvmsg(r->s, &m, NNG_FLAG_NONBLOCK);
		if (rv == 0) {
			r->got++;
			nng_msg_free(m);
		} else if (rv == NNG_EAGAIN) {
			nanosleep(&(struct timespec){0, 100000}, NULL);
		} else {
			break;
		}
	}
	return NULL;
}

static double
measure_raw(const char *url, int nsubs, size_t msg_size)
{
	nng_socket pub;
	struct raw_sub subs[4];
	uint8_t *buf = calloc(1, msg_size);
	uint64_t sent = 0;

	if (nng_pub0_open(&pub) != 0 || nng_listen(pub, url, NULL, 0) != 0)
		return 0;
	(void)nng_socket_set_int(pub, NNG_OPT_SENDBUF, 8192);
	for (int i = 0; i < nsubs; i++) {
		memset(&subs[i], 0, sizeof(subs[i]));
		nng_sub0_open(&subs[i].s);
		nng_socket_set_int(subs[i].s, NNG_OPT_RECVBUF, 8192);
		nng_socket_set_ms(subs[i].s, NNG_OPT_RECVTIMEO, 50);
		nng_socket_set_size(subs[i].s, NNG_OPT_RECVMAXSZ, 64u << 20);
		nng_socket_set(subs[i].s, NNG_OPT_SUB_SUBSCRIBE, "", 0);
		nng_dial(subs[i].s, url, NULL, 0);
		pthread_create(&subs[i].th, NULL, raw_sub_main, &subs[i]);
	}
	nanosleep(&(struct timespec){0, 200000000}, NULL);
	double t0 = now();
	while (now() - t0 < seconds) {
		nng_msg *m;
		nng_msg_alloc(&m, 0);
		nng_msg_append(m, buf, msg_size);
		if (nng_sendmsg(pub, m, 0) != 0)
			nng_msg_free(m);
		sent++;
	}
	nanosleep(&(struct timespec){0, 300000000}, NULL);
	double dt = now() - t0;
	double got = 0;
	for (int i = 0; i < nsubs; i++)
		atomic_store(&subs[i].stop, true);
	for (int i = 0; i < nsubs; i++) {
		pthread_join(subs[i].th, NULL);
		got += (double)subs[i].got / nsubs;
	}
	/* The publisher first: closing a SUB socket while messages still pour in
	 * was seen to hang in nng 1.5.2. */
	nng_close(pub);
	nanosleep(&(struct timespec){0, 50000000}, NULL);
	for (int i = 0; i < nsubs; i++)
		nng_close(subs[i].s);
	free(buf);
	(void)sent;
	return got / dt;
}

/* ---- latency, replay and snapshot ---- */

static void
measure_latency(double *p50, double *p99)
{
	struct subscriber s;
	struct load l = {0};
	struct kvp_client_options o = {.url = rpc_url, .pool = "bench", .timeout_ms = 30000};
	enum { N = 500 };
	double lat[N];
	int n = 0;

	*p50 = *p99 = 0;
	if (sub_open(&s) != 0 || kvp_client_open(&o, &l.c) != KVP_OK || kvp_batch_create(&l.b) != 0)
		return;
	for (int i = 0; i < N; i++) {
		struct kvp_sub_stats st;
		kvp_sub_get_stats(s.sub, NULL, &st);
		uint64_t want = st.next_seq + 1;
		double t0 = now();
		if (load_step(&l) != 0)
			break;
		while (1) {
			if (kvp_sub_poll(s.sub, 1) != KVP_OK)
				break;
			kvp_sub_get_stats(s.sub, NULL, &st);
			if (st.next_seq >= want || now() - t0 > 1.0)
				break;
		}
		lat[n++] = now() - t0;
	}
	qsort(lat, (size_t)n, sizeof(*lat), cmp_d);
	*p50 = n ? lat[n / 2] * 1e6 : 0;
	*p99 = n ? lat[n * 99 / 100] * 1e6 : 0;
	kvp_batch_destroy(l.b);
	kvp_client_close(l.c);
	kvp_sub_close(s.sub);
	kvp_index_destroy(s.ix);
}

static void
count_batch(void *ctx, const uint8_t *b, size_t len)
{
	(void)b;
	(void)len;
	(*(uint64_t *)ctx)++;
}

static void
measure_repair(double *snap_ms, size_t *entries, double *replay_ms, uint64_t *replayed)
{
	struct kvp_client_options o = {.url = rpc_url, .pool = "bench", .timeout_ms = 60000};
	struct kvp_client *c = NULL;
	struct kvp_snapshot *snap = NULL;
	*snap_ms = *replay_ms = 0;
	*entries = 0;
	*replayed = 0;
	if (kvp_client_open(&o, &c) != KVP_OK)
		return;
	double t0 = now();
	if (kvp_client_snapshot(c, &snap) == KVP_OK) {
		*snap_ms = (now() - t0) * 1e3;
		*entries = snap->num_entries;
		bool available = false;
		uint64_t next = 0, from = snap->next_seq > 10000 ? snap->next_seq - 10000 : 0;
		t0 = now();
		if (kvp_client_replay(c, snap->epoch, from, &available, &next, count_batch, replayed) ==
		        KVP_OK && available)
			*replay_ms = (now() - t0) * 1e3;
		kvp_snapshot_free(snap);
	}
	kvp_client_close(c);
}

/*
 * The cipher alone: sealing (daemon) and opening (subscriber) one batch of
 * 8,000 bytes, beside a memcpy of the same bytes, and as a share of one
 * clear batch's whole cost on the 1x1 ipc row (1 / its batches/s).
 */
static void
measure_seal(double clear_batches_per_s)
{
	enum { LEN = 8000, N = 20000 };
	static uint8_t plain[LEN], copy[LEN];
	struct kvp_seal_key k;
	double t0, seal = 0, open = 0, cp;
	if (kvp_seal_key_new(&k) != KVP_OK)
		return;
	for (size_t i = 0; i < LEN; i++)
		plain[i] = (uint8_t)(i * 31);
	for (int i = 0; i < N; i++) {
		uint8_t *sealed = NULL, *back = NULL;
		size_t sl = 0, bl = 0;
		t0 = now();
		if (kvp_seal_batch(&k, (uint64_t)i + 1, "bench", plain, LEN, &sealed, &sl) != KVP_OK)
			return;
		seal += now() - t0;
		t0 = now();
		if (kvp_seal_open(&k, sealed, sl, &back, &bl, NULL) != KVP_OK || bl != LEN)
			return;
		open += now() - t0;
		free(sealed);
		free(back);
	}
	volatile uint8_t sink = 0;
	t0 = now();
	for (int i = 0; i < N; i++) {
		plain[i % LEN] ^= 1; /* the copy cannot be hoisted... */
		memcpy(copy, plain, LEN);
		sink ^= copy[(i * 7919) % LEN]; /* ...nor dropped */
	}
	cp = (now() - t0) / N;
	(void)sink;
	seal /= N;
	open /= N;
	printf("\nThe cipher alone, one 8,000-byte batch: seal %.2f us, open %.2f us (AES-256-GCM); "
	       "memcpy of the same bytes %.3f us (seal %.0fx it); seal + open = %.2f%% of one clear "
	       "ipc 1x1 batch's cost (%.0f us)\n", seal * 1e6, open * 1e6, cp * 1e6,
	       cp > 0 ? seal / cp : 0, clear_batches_per_s > 0 ? (seal + open) * clear_batches_per_s * 100 : 0,
	       clear_batches_per_s > 0 ? 1e6 / clear_batches_per_s : 0);
}

int
main(int argc, char **argv)
{
	const char *daemon = KVPOOLD_PATH;
	bool only_vllm = false;
	setvbuf(stdout, NULL, _IOLBF, 0); /* rows appear as they are measured */
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--quick") == 0)
			seconds = 0.3;
		else if (strcmp(argv[i], "--only-vllm") == 0)
			only_vllm = true; /* the vLLM wire's rows alone */
		else
			daemon = bench_daemon_arg("kvp-bench-events", "[--quick] [--only-vllm] [KVPOOLD]",
			                          argv[i]);
	}
	int pid = (int)getpid();
	snprintf(rpc_url, sizeof(rpc_url), "ipc:///tmp/kvpool-bev-%d.ipc", pid);
	const char *transports[2] = {"ipc", "tcp"};
	char ev_urls[2][128], raw_urls[2][128];
	snprintf(ev_urls[0], 128, "ipc:///tmp/kvpool-bev-pub-%d.ipc", pid);
	snprintf(ev_urls[1], 128, "tcp://127.0.0.1:%d", bench_tcp_port(0));
	snprintf(raw_urls[0], 128, "ipc:///tmp/kvpool-bev-raw-%d.ipc", pid);
	snprintf(raw_urls[1], 128, "tcp://127.0.0.1:%d", bench_tcp_port(1));

	/* The vLLM wire's daemons too: fork+exec before the first nng call. */
	struct vllm_bench vb;
	vllm_bench_start(&vb, daemon, pid);
	if (only_vllm) {
		nanosleep(&(struct timespec){0, 400000000}, NULL);
		return vllm_bench_run(&vb, seconds);
	}
	/* fork+exec both daemons before the first nng call: nng is not fork-safe. */
	/* Daemons 0 and 1: ipc and tcp in clear; 2: ipc with a token, so it seals its events. */
	pid_t daemons[3];
	char rpc_urls[3][128], sealed_ev[128], token_file[128];
	snprintf(sealed_ev, 128, "ipc:///tmp/kvpool-bev-sealed-%d.ipc", pid);
	snprintf(token_file, sizeof(token_file), "/tmp/kvpool-bev-token-%d", pid);
	FILE *tf = fopen(token_file, "w");
	if (tf == NULL || fputs(BENCH_TOKEN "\n", tf) < 0 || fclose(tf) != 0) {
		fprintf(stderr, "bench: cannot write %s\n", token_file);
		return 1;
	}
	for (int t = 0; t < 3; t++) {
		snprintf(rpc_urls[t], 128, "ipc:///tmp/kvpool-bev-%d-%d.ipc", pid, t);
		snprintf(rpc_url, sizeof(rpc_url), "%s", rpc_urls[t]);
		daemons[t] = start_daemon(daemon, t < 2 ? ev_urls[t] : sealed_ev,
		                          t < 2 ? NULL : token_file);
	}
	nanosleep(&(struct timespec){0, 400000000}, NULL);

	printf("kvp-bench-events: %.1f s per row; pool of 100,000 blocks, block size 16; each batch "
	       "evicts 64 blocks and caches 64 (65 events, 128 hashes)\n\n", seconds);
	printf("| transport | subscribers | producers | events/s per subscriber | hashes/s | batches/s | raw nng PUB/SUB msgs/s (same size) | ratio | gaps (replayed batches) | snapshot fallbacks | index exact |\n");
	printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
	int failed = 0;
	double p50 = 0, p99 = 0, snap_ms = 0, replay_ms = 0;
	size_t entries = 0;
	uint64_t replayed = 0;
	double clear[3] = {0}; /* ipc batches/s per shape, for the sealed rows */
	for (int t = 0; t < 2; t++) {
		snprintf(rpc_url, sizeof(rpc_url), "%s", rpc_urls[t]);
		snprintf(ev_url, sizeof(ev_url), "%s", ev_urls[t]);
		const int shapes[3][2] = {{1, 1}, {4, 1}, {4, 4}}; /* subscribers, producers */
		for (int k = 0; k < 3; k++) {
			int n = shapes[k][0];
			struct row r = measure_stream(n, shapes[k][1]);
			/* An EventBatch here is about 64 x 50 B of removals plus a 64-hash store. */
			double raw = measure_raw(raw_urls[t], n, 8000);
			failed |= r.failed || !r.exact;
			if (t == 0)
				clear[k] = r.msgs_per_s;
			printf("| %s | %d | %d | %.0f | %.0f | %.0f | %.0f | %.2f | %llu (%llu) | %llu | %s |\n",
			       transports[t], n, shapes[k][1], r.events_per_s, r.hashes_per_s, r.msgs_per_s, raw,
			       raw > 0 ? r.msgs_per_s / raw : 0, (unsigned long long)r.gaps,
			       (unsigned long long)r.replayed, (unsigned long long)r.resets,
			       r.exact ? "yes" : "NO");
			char row[160];
			snprintf(row, sizeof(row), "native stream over %s, %d subscriber%s, %d producer%s: "
			         "batches a subscriber receives%s", transports[t], n, n > 1 ? "s" : "",
			         shapes[k][1], shapes[k][1] > 1 ? "s" : "",
			         r.exact ? "" : " (its index NOT exact)");
			bench_json("events", row, r.msgs_per_s, "batches/s",
			           "raw nng PUB/SUB of 8,000-byte messages, same subscribers", raw,
			           "higher");
		}
		if (t == 0) {
			measure_latency(&p50, &p99);
			measure_repair(&snap_ms, &entries, &replay_ms, &replayed);
		}
	}
	/*
	 * The same load on a pool with a token: every batch and tick sealed
	 * (AES-256-GCM) by the daemon and opened by each subscriber. The
	 * baseline is the clear ipc row of the same shape, measured above.
	 */
	printf("\nSealed (a pool with a token), ipc, against the clear ipc rows above:\n\n");
	printf("| subscribers | producers | batches/s sealed | batches/s clear | sealed/clear | index exact |\n");
	printf("|---|---|---|---|---|---|\n");
	snprintf(rpc_url, sizeof(rpc_url), "%s", rpc_urls[2]);
	snprintf(ev_url, sizeof(ev_url), "%s", sealed_ev);
	token = BENCH_TOKEN;
	for (int k = 0; k < 3; k += 2) {
		int n = k == 0 ? 1 : 4;
		struct row r = measure_stream(n, n);
		failed |= r.failed || !r.exact;
		printf("| %d | %d | %.0f | %.0f | %.2f | %s |\n", n, n, r.msgs_per_s, clear[k],
		       clear[k] > 0 ? r.msgs_per_s / clear[k] : 0, r.exact ? "yes" : "NO");
	}
	token = NULL;
	unlink(token_file);
	measure_seal(clear[0]);
	printf("\nipc, 1 subscriber: a call's events reach the subscriber in p50 %.0f us, p99 %.0f us "
	       "(from the start of the Batch call to the batch delivered)\n", p50, p99);
	printf("Snapshot of the 100,000-block pool: %zu entries in %.1f ms; Replay of %llu batches "
	       "in %.1f ms\n", entries, snap_ms, (unsigned long long)replayed, replay_ms);
	failed |= vllm_bench_run(&vb, seconds);
	for (int t = 0; t < 3; t++) {
		failed |= kvp_reap(daemons[t], 10000) != 0;
	}
	if (failed)
		fprintf(stderr, "bench: a step failed, an index was not exact, or a daemon did not stop "
		                "cleanly\n");
	return failed;
}
