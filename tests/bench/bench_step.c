/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvp-bench-step: S256, a continuous-batching scheduler step reduced to its
 * KV-cache calls (../shared/reference/step-workload-s256.md), run three ways
 * in one process and one run, so the ratios compare like with like:
 *
 *   engine   the step in process on kvp_mgr (the floor for the daemon's work)
 *   remote   the step as one Batch to a real kvpoold over ipc:// (what a
 *            remote scheduler pays: building, encoding, the round trip, the
 *            daemon's work, decoding)
 *   raw      a raw nng REQ/REP round trip of the remote step's request and
 *            reply sizes (the floor for the transport)
 *   busy raw the same round trip with the echo server busy for core's
 *            time before each reply and the client busy for its CPU time
 *            per step before each request (bench_raw.c): what the step's
 *            compute costs the transport on this machine, where a CPU left
 *            idle for ~100 us wakes slowly, with none of our code
 *   core     the daemon's own work on the step's encoded Batch, in process
 *            with no transport (kvpd_server_handle: decode, dispatch, encode;
 *            the part of remote that is ours; deterministic under callgrind)
 *
 * Each in two variants, events off and on (engine: take_events once per
 * step; remote: a daemon with an event publisher, against one with none).
 * Prints S256's correctness values and checks them against the reference
 * table when W and N are one of its rows; exits 1 on a mismatch or a failed
 * call. Aim (issue #16): remote <= 1.5 x (engine + raw).
 *
 * This file runs engine, remote and raw and prints the tables; the workload
 * and its checks are in bench_step_wl.c, the core run in bench_step_core.c.
 *
 * usage: kvp-bench-step [--quick] [--warmup W] [--steps N] [--rounds R]
 *                       [--only engine|remote|core] [--events off|on] [--cold MIB]
 *                       [--replay-mib MIB] [--plain]
 *                       [KVPOOLD]
 */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../spawn.h"
#include "bench_raw.h"
#include "bench_step.h"
#include "bench_util.h"
#include "clients/c/kvpool.h"
#include "engine/manager.h"
#include "engine/pool.h"

/* ---- engine: the step in process ---- */

static int
run_engine(uint64_t w_steps, uint64_t n_steps, bool events, struct timing *t, struct checks *c)
{
	struct kvp_pool_config pc = {.num_blocks = NUM_BLOCKS, .hash_block_size = BS,
	                             .enable_caching = true, .enable_events = events};
	uint32_t bsz[1] = {BS};
	struct kvp_mgr_config mc = {.num_groups = 1, .block_sizes = bsz, .max_model_len = 8192};
	struct kvp_pool *pool = NULL;
	struct kvp_hasher *h = NULL;
	struct kvp_mgr *m = NULL;
	struct kvp_event_batch evb;
	struct step *st = malloc(sizeof(*st));
	struct wl w;
	int32_t blocks[MAX_NEW + 64], hit[MAX_NEW];
	int32_t *const nb[1] = {blocks};
	int32_t *const hb[1] = {hit};
	int rv = -1;

	kvp_event_batch_init(&evb);
	wl_init(&w);
	if (st == NULL || kvp_hasher_create(seed == 0 ? "0" : "1", &h) != KVP_OK ||
	    kvp_pool_create(&pc, &pool) != KVP_OK || kvp_mgr_create(pool, h, &mc, &m) != KVP_OK)
		goto out;
	for (uint64_t s = 0; s < w_steps + n_steps; s++) {
		wl_next(&w, st);
		bool timed = s >= w_steps;
		cold_touch();
		double t0 = now(), c0 = thread_cpu();
		for (size_t i = 0; i < st->ndec; i++) {
			struct kvp_alloc_args a = {.num_new_tokens = 1};
			size_t cnt[1];
			if (kvp_mgr_append_tokens(m, st->dec[i], &st->dec_tok[i], 1) != KVP_OK ||
			    kvp_mgr_allocate_slots(m, st->dec[i], &a, nb, MAX_NEW, cnt) != KVP_OK)
				goto out;
			w.digest = digest_call(w.digest, blocks, cnt[0]);
		}
		for (size_t i = 0; i < st->nfin; i++)
			if (kvp_mgr_free_request(m, st->fin[i]) != KVP_OK)
				goto out;
		for (size_t i = 0; i < ARRIVE; i++) {
			struct kvp_request_desc d = {.prompt = st->prompt[i], .num_prompt = PROMPT};
			uint32_t ht;
			size_t cnt[1];
			if (kvp_mgr_add_request(m, st->arr[i], &d) != KVP_OK ||
			    kvp_mgr_get_computed_blocks(m, st->arr[i], hb, MAX_NEW, &ht) != KVP_OK)
				goto out;
			struct kvp_alloc_args a = {.num_new_tokens = PROMPT - ht,
			                           .num_new_computed_tokens = ht,
			                           .computed_blocks = ht ? (const int32_t *const *)hb : NULL};
			if (kvp_mgr_allocate_slots(m, st->arr[i], &a, nb, MAX_NEW, cnt) != KVP_OK)
				goto out;
			w.digest = digest_call(w.digest, blocks, cnt[0]);
			w.hit_tokens += ht;
		}
		if (events) {
			if (kvp_mgr_take_events(m, &evb) != KVP_OK)
				goto out;
			w.num_events += kvp_event_batch_count(&evb);
		}
		if (timed) {
			t->wall[s - w_steps] = now() - t0;
			t->cpu[s - w_steps] = thread_cpu() - c0;
			t->build[s - w_steps] = 0;
		}
	}
	/* The checks. */
	struct kvp_pool_stats ps;
	kvp_pool_get_stats(pool, &ps);
	c->steps = w.steps;
	c->arrivals = w.next_arrival;
	c->running = w.nrun;
	c->hit_tokens = w.hit_tokens;
	c->free = kvp_pool_num_free(pool);
	c->blocks_in_use = NUM_BLOCKS - 1 - c->free;
	c->cached_blocks = kvp_pool_num_cached_blocks(pool);
	c->cached_keys = kvp_pool_num_cached_keys(pool);
	c->digest = w.digest;
	c->num_events = w.num_events;
	c->removed = ps.blocks_evicted;
	uint8_t *hs = malloc((size_t)NUM_BLOCKS * KVP_HASH_LEN), fp[KVP_HASH_LEN];
	size_t n = 0;
	for (int32_t id = 1; hs != NULL && id < NUM_BLOCKS; id++) {
		size_t len;
		const uint8_t *k = kvp_pool_block_key(pool, id, &len);
		if (k != NULL && len >= KVP_HASH_LEN)
			memcpy(hs + KVP_HASH_LEN * n++, k, KVP_HASH_LEN);
	}
	if (hs == NULL || hash_set(h, hs, n, c->hash_set) != 0 ||
	    kvp_hash_raw(h, kvp_hasher_none_hash(h), KVP_HASH_LEN, fp) != KVP_OK) {
		free(hs);
		goto out;
	}
	free(hs);
	hex8(fp, c->none_fp);
	t->daemon_cpu = 0;
	rv = 0;
out:
	if (rv != 0)
		fprintf(stderr, "bench: engine step failed at step %" PRIu64 "\n", w.steps);
	kvp_event_batch_fini(&evb);
	kvp_mgr_destroy(m);
	kvp_pool_destroy(pool);
	kvp_hasher_destroy(h);
	free(st);
	return rv;
}

/* ---- remote: the step as one Batch ---- */

static int
cmp_size(const void *a, const void *b)
{
	size_t x = *(const size_t *)a, y = *(const size_t *)b;
	return (x > y) - (x < y);
}

static int
run_remote(const char *url, pid_t daemon, uint64_t w_steps, uint64_t n_steps, bool events,
           struct timing *t, struct checks *c)
{
	struct kvp_client_options o = {.url = url, .pool = "s256", .timeout_ms = 30000};
	struct kvp_client *cl = NULL;
	struct kvp_batch *b = NULL;
	struct kvp_client_stats cs;
	struct kvp_snapshot *snap = NULL;
	struct kvp_hasher *h = NULL;
	struct step *st = malloc(sizeof(*st));
	struct wl w;
	double dcpu0 = 0;
	size_t *req = calloc(n_steps ? n_steps : 1, sizeof(*req));
	size_t *rep = calloc(n_steps ? n_steps : 1, sizeof(*rep));
	int rv = -1;

	wl_init(&w);
	if (st == NULL || req == NULL || rep == NULL || kvp_client_open(&o, &cl) != KVP_OK ||
	    kvp_batch_create(&b) != KVP_OK ||
	    kvp_batch_set_flags(b, KVP_BATCH_CONTINUE | KVP_BATCH_BORROW) != KVP_OK) {
		fprintf(stderr, "bench: cannot open a session on %s: %s\n", url,
		        cl ? kvp_client_last_detail(cl) : "see above");
		goto out;
	}
	for (uint64_t s = 0; s < w_steps + n_steps; s++) {
		wl_next(&w, st);
		bool timed = s >= w_steps;
		if (s == w_steps)
			dcpu0 = proc_cpu(daemon);
		double t0 = now(), c0 = thread_cpu();
		size_t run;
		kvp_batch_clear(b);
		for (size_t i = 0; plain_wire && i < st->ndec; i++) {
			struct kvp_client_slots a = {.request_id = st->dec[i], .new_tokens = &st->dec_tok[i],
			                             .num_new_token_ids = 1, .num_new_tokens = 1};
			if (kvp_batch_allocate_slots(b, &a) != KVP_OK)
				goto out;
		}
		if (!plain_wire && kvp_batch_allocate_slots_n(b, st->ndec, st->dec, ones, ones,
		                                              st->dec_tok, 0, false) != KVP_OK)
			goto out;
		for (size_t i = 0; i < st->nfin; i++)
			if (kvp_batch_free_request(b, st->fin[i], false) != KVP_OK)
				goto out;
		for (size_t i = 0; i < ARRIVE; i++) {
			struct kvp_client_slots a = {.request_id = st->arr[i], .prompt = st->prompt[i],
			                             .num_prompt = PROMPT, .use_prefix_cache = true};
			if (kvp_batch_allocate_slots(b, &a) != KVP_OK)
				goto out;
		}
		double t1 = now();
		if (kvp_client_batch(cl, b, &run) != KVP_OK) {
			fprintf(stderr, "bench: step %" PRIu64 ": %s\n", s, kvp_client_last_detail(cl));
			goto out;
		}
		/* Every call's results: the digest words and the arrivals' hits. */
		size_t ncalls = kvp_batch_count(b);
		for (size_t i = 0; i < ncalls; i++) {
			struct kvp_batch_result r;
			if (kvp_batch_result(b, i, &r) != KVP_OK || r.status != KVP_OK)
				goto out;
			if (i >= st->ndec && i < st->ndec + st->nfin)
				continue; /* frees add nothing */
			w.digest = digest_call(w.digest, r.block_ids, r.num_block_ids);
			if (i >= st->ndec + st->nfin)
				w.hit_tokens += r.slots.hit_tokens;
		}
		if (timed) {
			uint64_t k = s - w_steps;
			t->wall[k] = now() - t0;
			t->cpu[k] = thread_cpu() - c0;
			t->build[k] = t1 - t0;
			kvp_batch_wire_bytes(b, &req[k], &rep[k]);
		}
	}
	t->daemon_cpu = (proc_cpu(daemon) - dcpu0) / (double)(n_steps ? n_steps : 1);
	qsort(req, n_steps, sizeof(*req), cmp_size);
	qsort(rep, n_steps, sizeof(*rep), cmp_size);
	t->req_bytes = req[n_steps / 2];
	t->rep_bytes = rep[n_steps / 2];
	/* The checks, from Stats and a Snapshot. */
	if (kvp_client_stats(cl, &cs) != KVP_OK || kvp_client_snapshot(cl, &snap) != KVP_OK ||
	    kvp_hasher_create(NULL, &h) != KVP_OK)
		goto out;
	c->steps = w.steps;
	c->arrivals = w.next_arrival;
	c->running = w.nrun;
	c->hit_tokens = w.hit_tokens;
	c->free = cs.num_free;
	c->blocks_in_use = NUM_BLOCKS - 1 - cs.num_free;
	c->cached_blocks = cs.num_cached_blocks;
	c->cached_keys = cs.num_cached_keys;
	c->digest = w.digest;
	c->num_events = cs.events_emitted;
	c->removed = cs.blocks_evicted;
	hex8(kvp_client_info(cl)->none_hash_fingerprint, c->none_fp);
	size_t n = 0;
	for (size_t i = 0; i < snap->num_entries; i++)
		n += snap->entries[i].num_blocks;
	uint8_t *hs = malloc((n ? n : 1) * KVP_HASH_LEN);
	size_t k = 0;
	for (size_t i = 0; hs != NULL && i < snap->num_entries; i++)
		for (uint32_t j = 0; j < snap->entries[i].num_blocks; j++)
			memcpy(hs + KVP_HASH_LEN * k++, snap->entries[i].hash, KVP_HASH_LEN);
	if (hs == NULL || hash_set(h, hs, n, c->hash_set) != 0) {
		free(hs);
		goto out;
	}
	free(hs);
	(void)events;
	rv = 0;
out:
	if (rv != 0)
		fprintf(stderr, "bench: remote step failed at step %" PRIu64 "%s%s\n", w.steps,
		        cl ? ": " : "", cl ? kvp_client_last_detail(cl) : "");
	kvp_snapshot_free(snap);
	kvp_hasher_destroy(h);
	kvp_batch_destroy(b);
	kvp_client_close(cl);
	free(st);
	free(req);
	free(rep);
	return rv;
}

/* ---- the daemons ---- */

/* --pin: the bench's CPU and the daemons' (and the raw echo's); -1: not pinned. */
static int pin_cpu[2] = {-1, -1};
#define CPU_LIMIT 1024

static pid_t
start_daemon(const char *path, const char *url, const char *events)
{
	char cpu[16];
	snprintf(cpu, sizeof(cpu), "%d", pin_cpu[1]);
	const char *argv[] = {"/usr/bin/taskset", "-c", cpu, path, "--quiet", "--rpc", url,
	                      "--admin", "none", "--events", events, "--executor", "none", "--pool",
	                      "name=s256,blocks=32768,block_size=16,max_model_len=8192,seed=0,"
	                      "hash_algo=sha256_cbor",
	                      "--lease-ms", "600000", "--max-msg-bytes", "67108864", "--replay-mib",
	                      replay_mib, NULL};
	return kvp_spawn(pin_cpu[1] >= 0 ? argv : argv + 3, NULL);
}

static int
stop_daemon(pid_t pid)
{
	return kvp_reap(pid, 10000) == 0 ? 0 : -1;
}

/* The raw round trips: against kvp-bench-echo if it runs (--pin), else in process. */
static int
raw_run(int echo, const char *url_raw, const char *url_echo, size_t req_b, size_t rep_b,
        uint64_t n, double *raw, double server_us, double client_us)
{
	if (echo > 0)
		return bench_raw_run_remote(url_echo, req_b, rep_b, n, raw, server_us, client_us);
	return bench_raw_run(url_raw, req_b, rep_b, n, raw, server_us, client_us);
}

/* ---- main ---- */

struct stat3 {
	double p10, p50, p90;
};

static struct stat3
stats_of(double *v, uint64_t n)
{
	struct stat3 s = {0, 0, 0};
	if (n == 0)
		return s;
	qsort(v, n, sizeof(*v), cmp_d);
	s.p10 = v[n / 10] * 1e6;
	s.p50 = v[n / 2] * 1e6; /* the upper middle for an even count */
	s.p90 = v[n * 9 / 10] * 1e6;
	return s;
}

static void
usage(FILE *f)
{
	fprintf(f, "usage: kvp-bench-step [--quick] [--warmup W] [--steps N] [--rounds R]\n"
	           "                      [--only engine|remote|core] [--events off|on] [--cold MIB]\n"
	           "                      [--replay-mib MIB] [--plain] [--pin C,D] [KVPOOLD]\n"
	           "S256 (step-workload-s256.md): the scheduler step in process on the engine, the\n"
	           "daemon's handling of it in process (core), as one Batch to kvpoold over ipc://,\n"
	           "and a raw nng round trip of its sizes, in one run.\n"
	           "Defaults: W=256 N=256 (--quick: 160 and 16), 1 round, both event variants.\n"
	           "--cold MIB: write MIB MiB before each in-process step (untimed): cold caches.\n"
	           "--replay-mib MIB: the daemons' replay ring (default 4: it wraps in the warm-up,\n"
	           "so events-on steps are timed in steady state; 64, kvpoold's default, times\n"
	           "the ring's first fill, when every batch lands on fresh pages).\n"
	           "--plain: send the decodes as 248 AllocateSlots messages, not as one slots run\n"
	           "(kvp_batch_allocate_slots_n's encoding, the default).\n"
	           "--pin C,D: this bench on CPU C, the daemons on CPU D, and the raw baseline's\n"
	           "echo in a process of its own (kvp-bench-echo) on CPU D too.\n");
}

static int
parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
	char *end;
	unsigned long long v;
	if (s == NULL || *s == '\0' || *s == '-')
		return -1;
	v = strtoull(s, &end, 10);
	if (*end != '\0' || v < lo || v > hi)
		return -1;
	*out = v;
	return 0;
}

int
main(int argc, char **argv)
{
	const char *daemon = KVPOOLD_PATH, *only = NULL, *ev_only = NULL;
	uint64_t w = 256, n = 256, rounds = 1, cold_mib = 0, rmib = 4;
	int failed = 0;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (strcmp(a, "--quick") == 0) {
			w = 160;
			n = 16;
		} else if (strcmp(a, "--warmup") == 0 && parse_u64(v, 32, 100000, &w) == 0) {
			i++;
		} else if (strcmp(a, "--steps") == 0 && parse_u64(v, 1, 100000, &n) == 0) {
			i++;
		} else if (strcmp(a, "--rounds") == 0 && parse_u64(v, 1, 100, &rounds) == 0) {
			i++;
		} else if (strcmp(a, "--only") == 0 && v &&
		           (strcmp(v, "engine") == 0 || strcmp(v, "remote") == 0 ||
		            strcmp(v, "core") == 0)) {
			only = argv[++i];
		} else if (strcmp(a, "--events") == 0 && v &&
		           (strcmp(v, "off") == 0 || strcmp(v, "on") == 0)) {
			ev_only = argv[++i];
		} else if (strcmp(a, "--cold") == 0 && parse_u64(v, 1, 1024, &cold_mib) == 0) {
			i++;
		} else if (strcmp(a, "--pin") == 0 && v &&
		           sscanf(v, "%d,%d", &pin_cpu[0], &pin_cpu[1]) == 2 && pin_cpu[0] >= 0 &&
		           pin_cpu[1] >= 0 && pin_cpu[0] < CPU_LIMIT && pin_cpu[1] < CPU_LIMIT) {
			i++;
		} else if (strcmp(a, "--replay-mib") == 0 && parse_u64(v, 1, 4096, &rmib) == 0) {
			snprintf(replay_mib, sizeof(replay_mib), "%" PRIu64, rmib);
			i++;
		} else if (strcmp(a, "--plain") == 0) {
			plain_wire = true;
		} else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
			usage(stdout);
			return 0;
		} else if (a[0] != '-' && i == argc - 1) {
			daemon = a;
		} else {
			fprintf(stderr, "kvp-bench-step: bad argument '%s'%s\n", a,
			        v || a[0] != '-' ? "" : " (missing value)");
			usage(stderr);
			return 2;
		}
	}
	for (size_t i = 0; i < RUNNING; i++)
		ones[i] = 1;
	if (cold_mib > 0) {
		cold_len = (size_t)cold_mib << 20;
		if ((cold_buf = calloc(1, cold_len)) == NULL)
			return 1;
	}
	if (!check_vectors()) {
		fprintf(stderr, "bench: the token generator does not match S256's test vectors\n");
		return 1;
	}
	bool do_engine = only == NULL || strcmp(only, "engine") == 0;
	bool do_remote = only == NULL || strcmp(only, "remote") == 0;
	bool do_core = only == NULL || strcmp(only, "core") == 0;
	int pid = (int)getpid();
	char url_off[96], url_on[96], url_ev[96], url_raw[96];
	snprintf(url_off, sizeof(url_off), "ipc:///tmp/kvpool-step-%d-off.ipc", pid);
	snprintf(url_on, sizeof(url_on), "ipc:///tmp/kvpool-step-%d-on.ipc", pid);
	snprintf(url_ev, sizeof(url_ev), "ipc:///tmp/kvpool-step-%d-ev.ipc", pid);
	snprintf(url_raw, sizeof(url_raw), "ipc:///tmp/kvpool-step-%d-raw.ipc", pid);
	/* fork+exec before the first nng call: nng is not fork-safe. */
	pid_t d_off = -1, d_on = -1;
	bool ev_off = ev_only == NULL || strcmp(ev_only, "off") == 0;
	bool ev_on = ev_only == NULL || strcmp(ev_only, "on") == 0;
	if (do_remote && ev_off)
		d_off = start_daemon(daemon, url_off, "none");
	if (do_remote && ev_on)
		d_on = start_daemon(daemon, url_on, url_ev);
	char url_echo[96];
	snprintf(url_echo, sizeof(url_echo), "ipc:///tmp/kvpool-step-%d-echo.ipc", pid);
	int echo = pin_cpu[1] >= 0 && do_remote ? bench_echo_start(ECHO_PATH, url_echo, pin_cpu[1])
	                                        : -1;
	if (pin_cpu[0] >= 0 && bench_pin_self(pin_cpu[0]) != 0) {
		fprintf(stderr, "kvp-bench-step: cannot run on CPU %d\n", pin_cpu[0]);
		return 1;
	}
	if (do_remote)
		nanosleep(&(struct timespec){0, 300000000}, NULL);

	printf("kvp-bench-step: S256, W=%" PRIu64 " warm-up + N=%" PRIu64 " timed steps, %" PRIu64
	       " round(s); 272 request calls per step, the decodes %s; us per step (p10 / median / "
	       "p90)\n\n", w, n, rounds, plain_wire ? "as 248 messages (--plain)" : "as one slots run");
	double *wall = calloc(n, sizeof(double)), *cpu = calloc(n, sizeof(double)),
	       *build = calloc(n, sizeof(double)), *raw = calloc(2 * n, sizeof(double));
	if (wall == NULL || cpu == NULL || build == NULL || raw == NULL)
		return 1;
	struct timing t = {.wall = wall, .cpu = cpu, .build = build};
	for (int e = 0; e < 2; e++) {
		bool events = e == 1;
		if ((events && !ev_on) || (!events && !ev_off))
			continue;
		double eng_med[100], rem_med[100], raw_med[100], dcpu[100], ccpu[100], bld[100];
		double core_med[100], gap_med[100], ecpu[100];
		size_t req_b = 0, rep_b = 0;
		for (uint64_t r = 0; r < rounds; r++) {
			struct checks c;
			eng_med[r] = rem_med[r] = raw_med[r] = dcpu[r] = ccpu[r] = bld[r] = core_med[r] = 0;
			gap_med[r] = ecpu[r] = 0;
			if (do_engine) {
				memset(&c, 0, sizeof(c));
				if (run_engine(w, n, events, &t, &c) != 0)
					return 1;
				eng_med[r] = stats_of(wall, n).p50;
				if (r == 0)
					failed |= report_checks(events ? "engine, events on" : "engine, events off",
					                        &c, w, n, events);
			}
			if (do_core) {
				memset(&c, 0, sizeof(c));
				if (run_core(w, n, events, &t, &c) != 0)
					return 1;
				core_med[r] = stats_of(wall, n).p50;
				if (r == 0)
					failed |= report_checks(events ? "core, events on" : "core, events off", &c,
					                        w, n, events);
			}
			if (do_remote) {
				memset(&c, 0, sizeof(c));
				if (run_remote(events ? url_on : url_off, events ? d_on : d_off, w, n, events, &t,
				               &c) != 0) {
					failed = 1;
					break;
				}
				struct stat3 sw = stats_of(wall, n);
				rem_med[r] = sw.p50;
				ccpu[r] = stats_of(cpu, n).p50;
				bld[r] = stats_of(build, n).p50;
				dcpu[r] = t.daemon_cpu * 1e6;
				req_b = t.req_bytes;
				rep_b = t.rep_bytes;
				if (r == 0)
					failed |= report_checks(events ? "remote, events on" : "remote, events off",
					                        &c, w, n, events);
				printf("round %" PRIu64 ", events %s: remote p10 %.0f / p50 %.0f / p90 %.0f us",
				       r + 1, events ? "on" : "off", sw.p10, sw.p50, sw.p90);
				/* The echo's CPU per idle round trip (16 warm-ups included): nng's share. */
				double e0 = echo > 0 ? proc_cpu(echo) : 0;
				int rr = raw_run(echo, url_raw, url_echo, req_b, rep_b, n, raw, 0, 0);
				ecpu[r] = echo > 0 ? (proc_cpu(echo) - e0) / (double)(n + 16) * 1e6 : 0;
				if (rr != 0 || (do_core && raw_run(echo, url_raw, url_echo, req_b, rep_b, n,
				                                   raw + n, core_med[r], ccpu[r]) != 0)) {
					fprintf(stderr, "bench: the raw nng round trip failed\n");
					failed = 1;
					break;
				}
				raw_med[r] = stats_of(raw, n).p50;
				printf(", raw %.0f us, engine %.0f us", raw_med[r], eng_med[r]);
				if (do_core) {
					gap_med[r] = stats_of(raw + n, n).p50;
					printf(", raw with both sides busy %.0f us", gap_med[r]);
				}
				printf("\n");
			}
		}
		if (failed)
			break;
		double E = median(eng_med, (int)rounds), R = median(rem_med, (int)rounds);
		double X = median(raw_med, (int)rounds), D = median(dcpu, (int)rounds);
		double C = median(ccpu, (int)rounds), B = median(bld, (int)rounds);
		double K = median(core_med, (int)rounds), G = median(gap_med, (int)rounds);
		printf("\n| events %s | us per step | us per call |\n|---|---|---|\n", events ? "on" : "off");
		if (do_engine)
			printf("| engine, in process (floor for the daemon) | %.0f | %.2f |\n", E, E / 272);
		if (do_core)
			printf("| daemon core, in process: decode + calls + encode | %.0f | %.2f |\n", K,
			       K / 272);
		if (do_remote) {
			printf("| remote, one Batch over ipc:// (client-observed) | %.0f | %.2f |\n", R, R / 272);
			printf("| - daemon CPU (mean) | %.0f | %.2f |\n", D, D / 272);
			printf("| - client CPU (median) | %.0f | %.2f |\n", C, C / 272);
			printf("| - client building the batch (median) | %.0f | %.2f |\n", B, B / 272);
			printf("| raw nng REQ/REP, %zu B request, %zu B reply | %.0f | |\n", req_b, rep_b, X);
			if (echo > 0)
				printf("| - kvp-bench-echo's CPU per round trip (nng's server side) | %.0f | |\n",
				       median(ecpu, (int)rounds));
			if (do_core)
				printf("| raw nng REQ/REP, same sizes, the echo busy for core's time and the "
				       "client for its CPU time between calls | %.0f | |\n", G);
		}
		if (do_engine && do_remote) {
			printf("\nremote / (engine + raw) = %.2f (aim <= 1.5); daemon CPU / engine = %.2f",
			       R / (E + X), D / E);
			bench_json("s256", events ? "S256 step as one Batch over ipc://, events on"
			                          : "S256 step as one Batch over ipc://, events off",
			           R, "µs per step",
			           "the engine in process + a raw nng round trip of the same bytes", E + X,
			           "lower");
		}
		if (do_engine && do_core)
			bench_json("s256", events ? "the daemon's core in process (decode, calls, encode), "
			                            "events on"
			                          : "the daemon's core in process (decode, calls, encode), "
			                            "events off",
			           K, "µs per step", "the engine in process", E, "lower");
		if (do_engine && do_core)
			printf("%score / engine = %.2f", do_remote ? "; " : "\n", K / E);
		if (do_core && do_remote)
			printf("\nremote - client CPU - raw with both sides busy = %.0f us per step: the "
			       "daemon's cost beyond its in-process core and a busy round trip", R - C - G);
		printf("\n\n");
	}
	free(wall);
	free(cpu);
	free(build);
	free(raw);
	free(cold_buf);
	if (echo > 0)
		(void)kvp_reap(echo, 2000); /* it runs until SIGTERM */
	if ((d_off > 0 && stop_daemon(d_off) != 0) || (d_on > 0 && stop_daemon(d_on) != 0)) {
		fprintf(stderr, "bench: a daemon did not stop cleanly\n");
		failed = 1;
	}
	return failed ? 1 : 0;
}
