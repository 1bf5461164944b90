/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_step_core.c: kvp-bench-step's core run: the step's encoded Batch
 * through the daemon's handler in process (kvpd_server_handle: decode,
 * dispatch, encode), with no transport (bench_step.h).
 */
#define _POSIX_C_SOURCE 200809L

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_step.h"
#include "bench_util.h"
#include "common/kvp_status.h"
#include "kvpool.pb-c.h"
#include "service/config/config.h"
#include "service/pool/server.h"

/* ---- core: the daemon's handling of the encoded step, in process ---- */

static struct kvpd_server *
core_create(bool events)
{
	struct kvpd_config cfg;
	struct kvpd_server *srv = NULL;
	char err[512];
	char *argv[] = {"kvpoold", "--quiet", "--executor", "none", "--admin", "none", "--events",
	                events ? "ipc:///tmp/kvpool-step-core.ipc" : "none", "--pool",
	                "name=s256,blocks=32768,block_size=16,max_model_len=8192,seed=0,"
	                "hash_algo=sha256_cbor",
	                "--lease-ms", "600000", "--max-msg-bytes", "67108864", "--replay-mib",
	                replay_mib, NULL};
	FILE *devnull = fopen("/dev/null", "w");
	int rv = kvpd_config_load(&cfg, (int)(sizeof(argv) / sizeof(argv[0])) - 1, argv, NULL, devnull,
	                          devnull);
	if (devnull)
		fclose(devnull);
	if (rv != 0 || kvpd_server_create(&cfg, &srv, err, sizeof(err)) != KVP_OK) {
		fprintf(stderr, "bench: core: %s\n", rv ? "bad configuration" : err);
		return NULL;
	}
	return srv;
}

/* One request through the daemon's handler; the decoded reply (caller frees) or NULL. */
static Kvpool__V1__Reply *
core_call(struct kvpd_server *srv, Kvpool__V1__Request *rq, double *secs)
{
	size_t n = kvpool__v1__request__get_packed_size(rq);
	uint8_t *req = malloc(n ? n : 1), *rep = NULL;
	size_t rlen = 0;
	Kvpool__V1__Reply *r = NULL;
	if (req == NULL)
		return NULL;
	kvpool__v1__request__pack(rq, req);
	double t0 = now();
	int rv = kvpd_server_handle(srv, req, n, 1000, &rep, &rlen);
	if (secs)
		*secs = now() - t0;
	if (rv == KVP_OK)
		r = kvpool__v1__reply__unpack(NULL, rlen, rep);
	free(req);
	free(rep);
	return r;
}

/* A slots run's reply of n calls, every one OK, into the digest; false if not. */
static bool
run_digest(const Kvpool__V1__Reply *sub, size_t n, uint64_t *digest)
{
	const Kvpool__V1__SlotsRunReply *r = sub->slots_run;
	size_t off = 0;
	if (sub->result_case != KVPOOL__V1__REPLY__RESULT_SLOTS_RUN || r->n_statuses != n ||
	    r->num_groups != 1 || r->n_new_blocks_per_group != n)
		return false;
	for (size_t i = 0; i < n; i++) {
		size_t m = r->new_blocks_per_group[i];
		if (r->statuses[i] != 0 || m > r->n_new_block_ids - off)
			return false;
		*digest = digest_call(*digest, r->new_block_ids + off, m);
		off += m;
	}
	return true;
}

int
run_core(uint64_t w_steps, uint64_t n_steps, bool events, struct timing *t, struct checks *c)
{
	struct kvpd_server *srv = core_create(events);
	struct step *st = malloc(sizeof(*st));
	enum { MAXC = RUNNING + FINISH + ARRIVE };
	Kvpool__V1__BatchCall *calls = calloc(MAXC, sizeof(*calls)), *cp[MAXC];
	Kvpool__V1__AllocateSlotsRequest *as = calloc(MAXC, sizeof(*as));
	Kvpool__V1__FreeRequestRequest fr[FINISH];
	Kvpool__V1__SlotsRunRequest run;
	Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
	Kvpool__V1__HelloRequest hello = KVPOOL__V1__HELLO_REQUEST__INIT;
	Kvpool__V1__BatchRequest br = KVPOOL__V1__BATCH_REQUEST__INIT;
	Kvpool__V1__Reply *r = NULL;
	struct kvp_hasher *h = NULL;
	struct wl w;
	int rv = -1;

	wl_init(&w);
	if (srv == NULL || st == NULL || calls == NULL || as == NULL ||
	    kvp_hasher_create(NULL, &h) != KVP_OK)
		goto out;
	hello.protocol_version = 1;
	rq.pool = "s256";
	rq.call_case = KVPOOL__V1__REQUEST__CALL_HELLO;
	rq.hello = &hello;
	if ((r = core_call(srv, &rq, NULL)) == NULL || r->status != 0)
		goto out;
	rq.session_id = r->hello->session_id;
	hex8(r->hello->pool->none_hash_fingerprint.data, c->none_fp);
	kvpool__v1__reply__free_unpacked(r, NULL);
	r = NULL;
	for (uint64_t s = 0; s < w_steps + n_steps; s++) {
		wl_next(&w, st);
		size_t k = 0, nrun = 0;
		if (!plain_wire && st->ndec > 0) { /* as kvp_batch_allocate_slots_n sends them */
			kvpool__v1__slots_run_request__init(&run);
			run.request_ids = st->dec;
			run.n_request_ids = run.n_num_new_tokens = run.n_num_token_ids = st->ndec;
			run.num_new_tokens = run.num_token_ids = ones;
			run.token_ids = st->dec_tok;
			run.n_token_ids = st->ndec;
			kvpool__v1__batch_call__init(&calls[k]);
			calls[k].call_case = KVPOOL__V1__BATCH_CALL__CALL_SLOTS_RUN;
			calls[k++].slots_run = &run;
			nrun = st->ndec;
		}
		for (size_t i = 0; plain_wire && i < st->ndec; i++, k++) {
			kvpool__v1__allocate_slots_request__init(&as[k]);
			as[k].request_id = st->dec[i];
			as[k].new_token_ids = &st->dec_tok[i];
			as[k].n_new_token_ids = 1;
			as[k].num_new_tokens = 1;
			kvpool__v1__batch_call__init(&calls[k]);
			calls[k].call_case = KVPOOL__V1__BATCH_CALL__CALL_ALLOCATE_SLOTS;
			calls[k].allocate_slots = &as[k];
		}
		for (size_t i = 0; i < st->nfin; i++, k++) {
			kvpool__v1__free_request_request__init(&fr[i]);
			fr[i].request_id = st->fin[i];
			kvpool__v1__batch_call__init(&calls[k]);
			calls[k].call_case = KVPOOL__V1__BATCH_CALL__CALL_FREE_REQUEST;
			calls[k].free_request = &fr[i];
		}
		for (size_t i = 0; i < ARRIVE; i++, k++) {
			/* As the client sends a prompt to this daemon: 32-bit ids (PoolInfo.prompt_u32). */
			static uint32_t p32[ARRIVE][PROMPT];
			for (size_t j = 0; j < PROMPT; j++)
				p32[i][j] = (uint32_t)st->prompt[i][j];
			kvpool__v1__allocate_slots_request__init(&as[k]);
			as[k].request_id = st->arr[i];
			as[k].prompt_token_ids_u32 = p32[i];
			as[k].n_prompt_token_ids_u32 = PROMPT;
			as[k].use_prefix_cache = true;
			kvpool__v1__batch_call__init(&calls[k]);
			calls[k].call_case = KVPOOL__V1__BATCH_CALL__CALL_ALLOCATE_SLOTS;
			calls[k].allocate_slots = &as[k];
		}
		for (size_t i = 0; i < k; i++)
			cp[i] = &calls[i];
		br.calls = cp;
		br.n_calls = k;
		br.continue_on_error = true;
		rq.call_case = KVPOOL__V1__REQUEST__CALL_BATCH;
		rq.batch = &br;
		rq.call_id = s + 1;
		double secs = 0;
		cold_touch();
		if ((r = core_call(srv, &rq, &secs)) == NULL || r->status != 0 ||
		    r->result_case != KVPOOL__V1__REPLY__RESULT_BATCH || r->batch->n_replies != k) {
			fprintf(stderr, "bench: core: step %" PRIu64 ": %s\n", s,
			        r ? r->detail : "no reply");
			goto out;
		}
		/* The decodes' results, from the run's arrays. */
		if (nrun > 0 && !run_digest(r->batch->replies[0], nrun, &w.digest))
			goto out;
		for (size_t i = nrun > 0 ? 1 : 0; i < k; i++) {
			size_t call = i + (nrun > 0 ? nrun - 1 : 0);
			if (call >= st->ndec && call < st->ndec + st->nfin)
				continue;
			const Kvpool__V1__AllocateSlotsReply *a = r->batch->replies[i]->allocate_slots;
			if (a == NULL)
				goto out;
			w.digest = digest_call(w.digest, a->new_block_ids, a->n_new_block_ids);
			if (call >= st->ndec + st->nfin)
				w.hit_tokens += a->hit_tokens;
		}
		kvpool__v1__reply__free_unpacked(r, NULL);
		r = NULL;
		if (s >= w_steps) {
			t->wall[s - w_steps] = secs;
			t->cpu[s - w_steps] = secs;
			t->build[s - w_steps] = 0;
		}
	}
	/* The checks, from Stats and a Snapshot through the same handler. */
	Kvpool__V1__StatsRequest sr = KVPOOL__V1__STATS_REQUEST__INIT;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_STATS;
	rq.stats = &sr;
	if ((r = core_call(srv, &rq, NULL)) == NULL || r->status != 0)
		goto out;
	c->steps = w.steps;
	c->arrivals = w.next_arrival;
	c->running = w.nrun;
	c->hit_tokens = w.hit_tokens;
	c->free = r->stats->num_free;
	c->blocks_in_use = NUM_BLOCKS - 1 - r->stats->num_free;
	c->cached_blocks = r->stats->num_cached_blocks;
	c->cached_keys = r->stats->num_cached_keys;
	c->digest = w.digest;
	c->num_events = r->stats->events_emitted;
	c->removed = r->stats->blocks_evicted;
	kvpool__v1__reply__free_unpacked(r, NULL);
	Kvpool__V1__SnapshotRequest snr = KVPOOL__V1__SNAPSHOT_REQUEST__INIT;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_SNAPSHOT;
	rq.snapshot = &snr;
	if ((r = core_call(srv, &rq, NULL)) == NULL || r->status != 0)
		goto out;
	size_t n = 0;
	for (size_t i = 0; i < r->snapshot->n_entries; i++)
		n += r->snapshot->entries[i]->num_blocks;
	uint8_t *hs = malloc((n ? n : 1) * KVP_HASH_LEN);
	size_t k = 0;
	for (size_t i = 0; hs != NULL && i < r->snapshot->n_entries; i++)
		for (uint32_t j = 0; j < r->snapshot->entries[i]->num_blocks; j++)
			memcpy(hs + KVP_HASH_LEN * k++, r->snapshot->entries[i]->hash.data, KVP_HASH_LEN);
	if (hs == NULL || hash_set(h, hs, n, c->hash_set) != 0) {
		free(hs);
		goto out;
	}
	free(hs);
	t->daemon_cpu = 0;
	rv = 0;
out:
	if (rv != 0)
		fprintf(stderr, "bench: core step failed at step %" PRIu64 "\n", w.steps);
	kvpool__v1__reply__free_unpacked(r, NULL);
	kvp_hasher_destroy(h);
	kvpd_server_destroy(srv);
	free(calls);
	free(as);
	free(st);
	return rv;
}
