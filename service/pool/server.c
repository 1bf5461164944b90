/* SPDX-License-Identifier: Apache-2.0 */
#define _POSIX_C_SOURCE 200809L

#include "service/pool/server.h"
#include "service/pool/pool_exec.h"

#include <nng/nng.h>
#include <nng/supplemental/util/platform.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/crc32c.h"
#include "common/map_key.h"
#include "service/rpc/decode_arena.h"
#include "service/rpc/dispatch.h"
#include "service/rpc/envelope.h"
#include "service/rpc/disk.h"
#include "service/rpc/keep.h"
#include "gpu/executor.h"
#include "engine/manager.h"
#include "engine/pool.h"
#include "service/rpc/session.h"
#include "proto/pb_read.h"
#include "proto/wire.h"

const double kvpd_latency_bounds[KVPD_LATENCY_BUCKETS - 1] = {
	10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3,
};

/* ---- lifecycle ---- */

static void
pool_fini(struct kvpd_pool *p)
{
	kvpd_disk_close(p->disk); /* its thread first: it takes the pool's lock */
	p->disk = NULL;
	if (p->sessions != NULL) {
		for (size_t i = 0; i < p->num_sessions; i++) {
			kvpd_pool_release_session(p, p->sessions[i]);
			kvpd_session_destroy(p->sessions[i]);
		}
		free(p->sessions);
	}
	kvpd_u64map_fini(&p->session_index);
	free(p->ages);
	(void)kvpd_pool_release_pending(p, SIZE_MAX);
	free(p->ending);
	kvp_mgr_destroy(p->mgr);
	kvp_pool_destroy(p->pool);
	kvpd_keep_close(p->keep);
	kvp_exec_close(p->exec);
	free(p->row_crc);
	free(p->row_hits);
	kvpd_fill_fini(&p->fill);
	free(p->zeros);
	kvp_hasher_destroy(p->hasher);
	kvp_event_batch_fini(&p->events);
	kvpd_arena_fini(&p->arena);
	kvpd_stream_fini(&p->stream);
	if (p->lock)
		nng_mtx_free(p->lock);
	memset(p, 0, sizeof(*p));
}

/* clear=alloc: each block the pool hands out is zeroed before any caller can read it. */
static void
clear_blocks(void *ctx, const int32_t *ids, uint32_t n)
{
	struct kvpd_pool *p = ctx;
	size_t bb = kvp_exec_block_bytes(p->exec);

	for (uint32_t i = 0; i < n; i++)
		(void)kvp_exec_write_blocks(p->exec, &ids[i], 1, p->zeros, bb); /* ids are in range */
}

static int
pool_init(struct kvpd_pool *p, const struct kvpd_config *cfg, const struct kvpd_pool_config *pc,
          char *err, size_t err_len)
{
	/*
	 * Events cost encoding and a replay ring on every call; a daemon with no
	 * publisher (events and vllm-events both none) has no one to read them,
	 * so its pools record none and Replay answers NOT_SUPPORTED.
	 */
	bool events_on = cfg->events[0] != '\0' || cfg->vllm.endpoint[0] != '\0';
	struct kvp_pool_config kc = {
		.hash_block_size = pc->hash_block_size, .enable_caching = pc->caching,
		.enable_events = events_on,
	};
	struct kvp_mgr_config mc = {.num_groups = pc->num_groups, .groups = p->cfg.groups,
	                            .max_model_len = pc->max_model_len,
	                            .max_requests = cfg->max_sessions * 64u};
	int rv;

	memset(p, 0, sizeof(*p));
	p->cfg = *pc;
	p->events_on = events_on;
	if ((rv = kvpd_pool_exec_init(p, cfg, err, err_len)) != KVP_OK)
		return rv;
	/* Without an executor the pool stands for an engine's GPU BlockPool. */
	if (p->cfg.medium[0] == '\0')
		snprintf(p->cfg.medium, sizeof(p->cfg.medium), "GPU");
	kc.semantics = pc->vllm;
	kc.num_blocks = p->cfg.num_blocks;
	for (uint32_t g = 0; g < pc->num_groups && pc->caching && pc->vllm == KVP_VLLM_9AAF83EF5;
	     g++) {
		uint32_t len = pc->groups[g].block_size / pc->hash_block_size *
		               (uint32_t)kvp_hash_algo_len(pc->hash_algo);
		kc.max_hash_len = len > kc.max_hash_len ? len : kc.max_hash_len;
	}
	kc.hash_len = (uint32_t)kvp_hash_algo_len(pc->hash_algo);
	kc.medium = p->cfg.medium;
	if (pc->clear_on_alloc) {
		if (p->exec == NULL) {
			snprintf(err, err_len, "pool %s: clear=alloc needs an executor (this pool holds "
			         "no KV bytes to clear)", pc->name);
			return KVP_EINVAL;
		}
		if ((p->zeros = calloc(1, kvp_exec_block_bytes(p->exec))) == NULL) {
			snprintf(err, err_len, "pool %s: out of memory", pc->name);
			return KVP_ENOMEM;
		}
		kc.on_alloc = clear_blocks;
		kc.on_alloc_ctx = p;
	}
	p->limits.max_ids = cfg->max_ids;
	p->limits.lease_ms = cfg->lease_ms;
	p->limits.max_sessions = cfg->max_sessions;
	uint64_t refs16 = (uint64_t)p->cfg.num_blocks * 16;
	p->limits.max_refs = cfg->max_refs ? cfg->max_refs : refs16 > (1u << 20) ? refs16 : 1u << 20;
	/* One session's quota: half the pool, so a misbehaving one leaves room for the rest. */
	p->limits.session_refs = pc->session_refs ? pc->session_refs : p->limits.max_refs / 2;
	p->limits.session_rows = pc->session_rows ? pc->session_rows
	                         : p->cfg.num_blocks / 2 ? p->cfg.num_blocks / 2 : 1;
	p->limits.max_session_requests = cfg->max_session_requests;
	p->limits.reply_cache_bytes = (size_t)cfg->reply_cache_mib << 20;
	p->limits.max_reply_bytes = (size_t)cfg->max_msg_bytes;
	p->limits.deadline_skew_ms = cfg->deadline_skew_ms;
	kvp_event_batch_init(&p->events);
	if ((rv = kvpd_stream_init(&p->stream, cfg->replay_batches,
	                           (size_t)cfg->replay_mib << 20, pc->token[0] != '\0')) !=
	    KVP_OK) {
		snprintf(err, err_len, "pool %s: %s", pc->name,
		         rv == KVP_ENOMEM ? "cannot allocate the replay ring"
		                          : "cannot draw the event stream's key");
		return rv;
	}
	if (nng_mtx_alloc(&p->lock) != 0) {
		snprintf(err, err_len, "pool %s: cannot allocate a mutex", pc->name);
		return KVP_ENOMEM;
	}
	if ((rv = kvp_hasher_create_algo(kvpd_pool_seed(pc), pc->hash_algo,
	                                 &p->hasher)) != KVP_OK ||
	    (rv = kvp_hasher_set_keys_form(p->hasher, pc->vllm == KVP_VLLM_9AAF83EF5
	                                                      ? KVP_KEYS_PLAIN
	                                                      : KVP_KEYS_TAGGED)) != KVP_OK ||
	    (rv = kvp_pool_create(&kc, &p->pool)) != KVP_OK ||
	    (rv = kvp_mgr_create(p->pool, p->hasher, &mc, &p->mgr)) != KVP_OK ||
	    (p->row_crc && pc->cluster_wait_ms &&
	     (rv = kvpd_fill_init(&p->fill, kvp_pool_hash_len(p->pool) + KVP_MAP_KEY_GROUP_LEN,
	                          pc->cluster_wants, pc->cluster_wait_ms, pc->cluster_miss_ms)))) {
		snprintf(err, err_len, "pool %s: %s", pc->name, kvp_strerror(rv));
		return rv;
	}
	/* A fingerprint of NONE_HASH (its digest) lets clients check they hash alike. */
	uint8_t fp[KVP_HASH_LEN];
	if ((rv = kvp_hash_raw(p->hasher, kvp_hasher_none_hash(p->hasher),
	                       kvp_hasher_none_len(p->hasher), fp)) != KVP_OK) {
		snprintf(err, err_len, "pool %s: %s", pc->name, kvp_strerror(rv));
		return rv;
	}
	memcpy(p->none_fp, fp, sizeof(p->none_fp));
	if (pc->restart_warm && (rv = kvpd_keep_open(p, cfg->ipc_mode, err, err_len)) != KVP_OK)
		return rv;
	return pc->disk[0] ? kvpd_disk_open(p, pc->disk, pc->disk_rows, cfg->ipc_mode, err, err_len)
	                   : KVP_OK;
}

const char *
kvpd_server_pool_note(const struct kvpd_server *s, size_t i)
{
	return s && i < s->num_pools ? s->pools[i].exec_note : "";
}

int
kvpd_server_create(const struct kvpd_config *cfg, struct kvpd_server **out, char *err,
                   size_t err_len)
{
	struct kvpd_server *s;
	int rv;

	if (cfg == NULL || out == NULL || cfg->num_pools == 0) {
		snprintf(err, err_len, "no pools configured");
		return KVP_EINVAL;
	}
	if ((s = calloc(1, sizeof(*s))) == NULL ||
	    (s->pools = calloc(cfg->num_pools, sizeof(*s->pools))) == NULL) {
		free(s);
		snprintf(err, err_len, "out of memory");
		return KVP_ENOMEM;
	}
	s->cfg = *cfg;
	/* Regions a killed daemon left behind hold memory until someone removes them. */
	if (strcmp(cfg->region_dir, "none") != 0)
		(void)kvp_exec_region_sweep(cfg->region_dir, NULL);
	for (size_t i = 0; i < cfg->num_pools; i++) {
		if ((rv = pool_init(&s->pools[i], cfg, &cfg->pools[i], err, err_len)) != KVP_OK) {
			s->num_pools = i + 1;
			kvpd_server_destroy(s);
			return rv;
		}
	}
	s->num_pools = cfg->num_pools;
	*out = s;
	return KVP_OK;
}

void
kvpd_server_destroy(struct kvpd_server *s)
{
	if (s == NULL)
		return;
	for (size_t i = 0; i < s->num_pools; i++)
		pool_fini(&s->pools[i]);
	free(s->pools);
	free(s);
}

/* ---- requests ---- */

/* A reply with only a status (decode failures, unknown pools). */
static int
error_reply(uint64_t call_id, int status, const char *detail, struct kvpd_sink *sink)
{
	Kvpool__V1__Reply r = KVPOOL__V1__REPLY__INIT;
	r.call_id = call_id;
	r.status = (Kvpool__V1__Status)status;
	r.detail = (char *)detail;
	return kvpd_pack_reply(&r, sink);
}

static struct kvpd_pool *
find_pool(struct kvpd_server *s, const uint8_t *name, size_t len)
{
	for (size_t i = 0; i < s->num_pools; i++)
		if (strlen(s->pools[i].cfg.name) == len && memcmp(s->pools[i].cfg.name, name, len) == 0)
			return &s->pools[i];
	return NULL;
}

/* The plain sink: one malloc'd buffer. */
static void *
malloc_sink(void *ctx, size_t len)
{
	uint8_t **buf = ctx;
	free(*buf);
	*buf = malloc(len ? len : 1);
	return *buf;
}

int
kvpd_server_handle(struct kvpd_server *s, const uint8_t *req, size_t len, uint64_t now_ms,
                   uint8_t **reply, size_t *reply_len)
{
	uint8_t *buf = NULL;
	struct kvpd_sink sink = {.alloc = malloc_sink, .ctx = &buf};
	int rv = kvpd_server_handle_to(s, req, len, now_ms, &sink);
	if (rv != KVP_OK) {
		free(buf);
		*reply = NULL;
		*reply_len = 0;
		return rv;
	}
	*reply = sink.buf;
	*reply_len = sink.len;
	return KVP_OK;
}

/*
 * With p's lock held (and again on return): releases what ended sessions
 * still hold, a slice per lock hold, letting other calls in between. Only
 * the thread that ended a session (a Goodbye, the reaper) calls it, so the
 * work is not handed to a call that came by between two slices.
 */
static void
release_pending(struct kvpd_pool *p)
{
	while (kvpd_pool_release_pending(p, KVPD_RELEASE_SLICE)) {
		nng_mtx_unlock(p->lock);
		/*
		 * A waiting call must get the lock before the next slice: a mutex
		 * is not fair, and a yield returns before a waiter on another CPU
		 * has woken. 100 us per slice of up to ~2 ms.
		 */
		struct timespec pause = {0, 100000};
		nanosleep(&pause, NULL);
		nng_mtx_lock(p->lock);
	}
}

int
kvpd_server_handle_to(struct kvpd_server *s, const uint8_t *req, size_t len, uint64_t now_ms,
                      struct kvpd_sink *sink)
{
	Kvpool__V1__Request *rq;
	struct kvpd_pool *p;
	int rv;

	sink->buf = NULL;
	sink->len = 0;
	if (len > s->cfg.max_msg_bytes) {
		char why[96];
		snprintf(why, sizeof(why), "a %zu-byte request; max-msg-bytes is %u", len,
		         s->cfg.max_msg_bytes);
		kvpd_sink_refusal(sink, KVPD_REFUSED_TOO_LARGE, "", why);
		return error_reply(0, KVP_ETOOLARGE, "request larger than max-msg-bytes", sink);
	}
	/* The envelope first: no body is decoded for an unknown pool or session. */
	struct kvpd_envelope env;
	if (kvpd_envelope_scan(req, len, &env) != KVP_OK)
		return error_reply(0, KVP_EINVAL, "malformed request (not a kvpool.v1.Request)", sink);
	if (memchr(env.pool, '\0', env.pool_len) != NULL)
		return error_reply(env.call_id, KVP_EINVAL, "the pool name has a NUL byte in it", sink);
	if ((p = find_pool(s, env.pool, env.pool_len)) == NULL) {
		char detail[KVP_WIRE_MAX_NAME + 32];
		snprintf(detail, sizeof(detail), "no pool named '%.*s'",
		         (int)(env.pool_len < 128 ? env.pool_len : 128), (const char *)env.pool);
		return error_reply(env.call_id, KVP_EUNKNOWNPOOL, detail, sink);
	}
	nng_mtx_lock(p->lock);
	int pack_rv = KVP_OK;
	rv = kvpd_dispatch_precheck(p, &env, now_ms, sink, &pack_rv);
	nng_mtx_unlock(p->lock);
	if (rv != KVP_OK)
		return pack_rv;
	if (env.batch_calls > p->limits.max_ids) {
		char detail[96];
		snprintf(detail, sizeof(detail), "%zu calls in one batch; the limit is %u (max-ids)",
		         env.batch_calls, p->limits.max_ids);
		return error_reply(env.call_id, KVP_EINVAL, detail, sink);
	}

	struct kvpd_decode_arena *arena = kvpd_decode_arena_get();
	ProtobufCAllocator alloc = {.alloc = kvpd_decode_arena_alloc, .free = kvpd_decode_arena_free,
	                            .allocator_data = arena};
	ProtobufCAllocator *al = arena ? &alloc : NULL;
	/* Our own decoder first; protobuf-c for what it declines (and to judge bad input). */
	rq = al ? (Kvpool__V1__Request *)kvp_pb_read(&kvpool__v1__request__descriptor, al, req, len)
	        : NULL;
	if (rq == NULL && arena)
		kvpd_decode_arena_reset(arena);
	if (rq == NULL)
		rq = kvpool__v1__request__unpack(al, len, req);
	if (rq == NULL) {
		if (arena)
			kvpd_decode_arena_reset(arena);
		return error_reply(env.call_id, KVP_EINVAL,
		                   "malformed request (not a kvpool.v1.Request)", sink);
	}
	struct timespec t0, tl, t1;
	const struct kvpd_call_op *op = kvpd_call_lookup((int)rq->call_case);
	/* Outside the lock: only a call whose reply is kept for retries needs it. */
	uint32_t crc = op != NULL && (op->flags & KVPD_CALL_MUTATING) && rq->call_id != 0
	                       ? kvp_crc32c(0, req, len)
	                       : 0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	struct kvpd_precomputed pre = {0};
	if (rq->call_case == KVPOOL__V1__REQUEST__CALL_COMMIT) {
		/* Its rows found under the lock, their checksums taken outside it. */
		nng_mtx_lock(p->lock);
		kvpd_commit_prepare(p, rq, &pre);
		nng_mtx_unlock(p->lock);
		kvpd_commit_checksum(p, &pre);
	}
	nng_mtx_lock(p->lock);
	clock_gettime(CLOCK_MONOTONIC, &tl);
	size_t ending = p->num_ending;
	rv = kvpd_dispatch(p, rq, crc, now_ms, pre.n ? &pre : NULL, sink);
	if (p->num_ending > ending) /* this call ended a session: it does the releasing */
		release_pending(p);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	double held = (double)(t1.tv_sec - tl.tv_sec) + (double)(t1.tv_nsec - tl.tv_nsec) / 1e9;
	p->counters.lock_wait_s += secs - held;
	p->counters.lock_held_s += held;
	if (op != NULL) { /* a call with no row was refused, and is not a call */
		int b = 0, row = (int)kvpd_call_index(op);
		while (b < KVPD_LATENCY_BUCKETS - 1 && secs > kvpd_latency_bounds[b])
			b++;
		p->counters.latency[row][b]++;
		p->counters.latency_sum[row] += secs;
	}
	nng_mtx_unlock(p->lock);
	kvpd_precomputed_fini(&pre);
	/* Decoded into the arena: its reset frees it all, no walk of the message. */
	if (arena)
		kvpd_decode_arena_reset(arena);
	else
		kvpool__v1__request__free_unpacked(rq, NULL);
	if (rv != KVP_OK)
		return error_reply(0, rv, "out of memory", sink);
	return KVP_OK;
}

size_t
kvpd_server_expire(struct kvpd_server *s, uint64_t now_ms)
{
	size_t n = 0;

	for (size_t i = 0; i < s->num_pools; i++) {
		struct kvpd_pool *p = &s->pools[i];
		/*
		 * One session per lock hold: each releases at most max-session-refs
		 * references, so calls wait for one session's release, not for all
		 * of a burst of expiries; and each hold looks at a bounded number
		 * of sessions, the round going on from where the last one stopped.
		 */
		size_t k;
		bool more;
		do {
			nng_mtx_lock(p->lock);
			k = kvpd_pool_expire(p, now_ms, 1, &more);
			if (k > 0)
				release_pending(p);
			nng_mtx_unlock(p->lock);
			n += k;
		} while (more);
	}
	return n;
}

size_t
kvpd_server_gone(struct kvpd_server *s, size_t i, uint64_t *cursor,
                 struct kvpd_gone_session *out, size_t cap)
{
	size_t n = 0;
	if (s == NULL || i >= s->num_pools || cursor == NULL || (out == NULL && cap > 0))
		return 0;
	struct kvpd_pool *p = &s->pools[i];
	nng_mtx_lock(p->lock);
	if (p->gone_total - *cursor > KVPD_GONE_KEEP || *cursor > p->gone_total)
		*cursor = p->gone_total > KVPD_GONE_KEEP ? p->gone_total - KVPD_GONE_KEEP : 0;
	for (; n < cap && *cursor < p->gone_total; n++, (*cursor)++)
		out[n] = p->gone[*cursor % KVPD_GONE_KEEP];
	nng_mtx_unlock(p->lock);
	return n;
}

int
kvpd_server_check(struct kvpd_server *s, char *detail, size_t len)
{
	int rv = KVP_OK;

	for (size_t i = 0; i < s->num_pools && rv == KVP_OK; i++) {
		nng_mtx_lock(s->pools[i].lock);
		rv = kvpd_pool_check(&s->pools[i], detail, len);
		nng_mtx_unlock(s->pools[i].lock);
	}
	return rv;
}

uint64_t
kvpd_server_keep_sweep(struct kvpd_server *s, uint64_t max_bytes)
{
	uint64_t done = 0;
	for (size_t i = 0; i < s->num_pools; i++)
		done += kvpd_keep_sweep(&s->pools[i], max_bytes);
	return done;
}

void
kvpd_server_tick(struct kvpd_server *s)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	for (size_t i = 0; i < s->num_pools; i++) {
		nng_mtx_lock(s->pools[i].lock);
		kvpd_pool_publish(&s->pools[i]); /* what no call has published (a warm start's) */
		kvpd_stream_tick(&s->pools[i].stream, s->pools[i].cfg.name,
		                 (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec);
		nng_mtx_unlock(s->pools[i].lock);
	}
}

void
kvpd_server_set_publisher(struct kvpd_server *s, kvpd_publish_fn fn, void *ctx)
{
	for (size_t i = 0; i < s->num_pools; i++) {
		nng_mtx_lock(s->pools[i].lock);
		s->pools[i].stream.publish = fn;
		s->pools[i].stream.publish_ctx = ctx;
		nng_mtx_unlock(s->pools[i].lock);
	}
}

struct kvpd_vllm_counters *
kvpd_server_set_event_sink(struct kvpd_server *s, size_t i, kvpd_events_fn fn, void *ctx)
{
	if (i >= s->num_pools)
		return NULL;
	nng_mtx_lock(s->pools[i].lock);
	s->pools[i].stream.on_events = fn;
	s->pools[i].stream.on_events_ctx = ctx;
	nng_mtx_unlock(s->pools[i].lock);
	return &s->pools[i].stream.vllm;
}

const struct kvpd_pool_pods *
kvpd_server_pool_pods(const struct kvpd_server *s, size_t i)
{
	return i < s->num_pools ? &s->pools[i].pods : NULL;
}

size_t
kvpd_server_num_pools(const struct kvpd_server *s)
{
	return s->num_pools;
}

const char *
kvpd_server_pool_name(const struct kvpd_server *s, size_t i)
{
	return i < s->num_pools ? s->pools[i].cfg.name : NULL;
}

void
kvpd_server_pool_counters(struct kvpd_server *s, size_t i, struct kvpd_pool_counters *out)
{
	memset(out, 0, sizeof(*out));
	if (i >= s->num_pools)
		return;
	nng_mtx_lock(s->pools[i].lock);
	*out = s->pools[i].counters;
	out->sessions = (uint32_t)s->pools[i].num_sessions;
	out->event_batches = s->pools[i].stream.batches;
	out->replay_bytes = s->pools[i].stream.ring.bytes;
	out->reply_cache_bytes = s->pools[i].reply_cache_used;
	out->refs_held = s->pools[i].refs_held;
	out->cluster_pending = s->pools[i].fill.pending;
	out->cluster_dropped = s->pools[i].fill.dropped;
	struct kvpd_keep_stats ks;
	kvpd_keep_stats(s->pools[i].keep, &ks);
	out->warm = s->pools[i].keep != NULL;
	out->warm_kept = ks.kept;
	out->warm_dropped = ks.dropped;
	out->warm_unproven = ks.unproven;
	out->warm_proven = ks.proven;
	struct kvpd_disk_stats ds;
	kvpd_disk_stats(s->pools[i].disk, &ds);
	out->disk = s->pools[i].disk != NULL;
	out->disk_slots = ds.slots;
	out->disk_used = ds.used;
	out->disk_writes = ds.writes;
	out->disk_write_skips = ds.write_skips;
	out->disk_fills = ds.fills;
	out->disk_fill_failures = ds.fill_failures;
	out->disk_io_errors = ds.io_errors;
	out->replay_dropped_for_bytes = s->pools[i].stream.ring.dropped_for_bytes;
	out->vllm_on = s->pools[i].stream.on_events != NULL;
	nng_mtx_unlock(s->pools[i].lock);
	const struct kvpd_vllm_counters *v = &s->pools[i].stream.vllm;
	out->vllm_batches = atomic_load_explicit(&v->batches, memory_order_relaxed);
	out->vllm_bytes = atomic_load_explicit(&v->bytes, memory_order_relaxed);
	out->vllm_replays = atomic_load_explicit(&v->replays, memory_order_relaxed);
	out->vllm_bad_replay_requests =
		atomic_load_explicit(&v->bad_replay_requests, memory_order_relaxed);
	out->vllm_send_failures = atomic_load_explicit(&v->send_failures, memory_order_relaxed);
	out->vllm_replays_cut = atomic_load_explicit(&v->replays_cut, memory_order_relaxed);
	out->vllm_publisher_resets = atomic_load_explicit(&v->publisher_resets, memory_order_relaxed);
}

void
kvpd_server_pool_gauges(struct kvpd_server *s, size_t i, struct kvpd_pool_gauges *out)
{
	memset(out, 0, sizeof(*out));
	if (i >= s->num_pools)
		return;
	nng_mtx_lock(s->pools[i].lock);
	kvpd_pool_gauges(&s->pools[i], out);
	nng_mtx_unlock(s->pools[i].lock);
}

void
kvpd_server_count_close(struct kvpd_server *s, enum kvpd_close_reason r)
{
	if (s != NULL && (unsigned)r < KVPD_CLOSE_REASONS)
		atomic_fetch_add_explicit(&s->closes[r], 1, memory_order_relaxed);
}

uint64_t
kvpd_server_closes(const struct kvpd_server *s, enum kvpd_close_reason r)
{
	if (s == NULL || (unsigned)r >= KVPD_CLOSE_REASONS)
		return 0;
	return atomic_load_explicit(&((struct kvpd_server *)s)->closes[r], memory_order_relaxed);
}

const char *
kvpd_close_reason_name(enum kvpd_close_reason r)
{
	static const char *const names[KVPD_CLOSE_REASONS] = {
		"idle", "took_no_reply", "tls_handshake", "address_bound", "unauthenticated_bound"};
	return (unsigned)r < KVPD_CLOSE_REASONS ? names[r] : NULL;
}

void
kvpd_server_count_shm(struct kvpd_server *s, int channel_delta, uint64_t calls)
{
	if (s == NULL)
		return;
	if (channel_delta > 0)
		atomic_fetch_add_explicit(&s->shm_channels, 1, memory_order_relaxed);
	else if (channel_delta < 0)
		atomic_fetch_sub_explicit(&s->shm_channels, 1, memory_order_relaxed);
	if (calls > 0)
		atomic_fetch_add_explicit(&s->shm_calls, calls, memory_order_relaxed);
}

void
kvpd_server_shm(const struct kvpd_server *s, uint64_t *channels, uint64_t *calls)
{
	struct kvpd_server *m = (struct kvpd_server *)s;
	*channels = s ? atomic_load_explicit(&m->shm_channels, memory_order_relaxed) : 0;
	*calls = s ? atomic_load_explicit(&m->shm_calls, memory_order_relaxed) : 0;
}
