#define _POSIX_C_SOURCE 200809L

#include "service/dispatch.h"

#include "service/call.h"
#include "gpu/executor.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/manager.h"
#include "engine/pool.h"
#include "proto/wire.h"


int
kvpd_fail(struct call *c, int status, const char *fmt, ...)
{
	va_list ap;
	c->status = status;
	va_start(ap, fmt);
	vsnprintf(c->detail, sizeof(c->detail), fmt, ap);
	va_end(ap);
	return status;
}

/*
 * Zeroed memory that lives until the call's reply is packed. It comes from
 * the pool's arena (the pool's lock is held): a batch builds hundreds of
 * reply messages, and a heap allocation each cost more than the calls.
 */
void *
kvpd_scratch(struct call *c, size_t n)
{
	struct kvpd_arena *a = &c->p->arena;
	size_t need = (n + 15) & ~(size_t)15;

	if (need == 0)
		need = 16;
	if (a->cur == NULL || a->cur->used + need > a->cur->cap) {
		/* The next kept chunk if it fits, else a new one. */
		struct kvpd_chunk *next = a->cur ? a->cur->next : a->head;
		if (next == NULL || next->cap < need) {
			size_t cap = need > KVPD_CHUNK ? need : KVPD_CHUNK;
			struct kvpd_chunk *ch = calloc(1, sizeof(*ch) + cap);
			if (ch == NULL) {
				c->oom = true;
				return NULL;
			}
			ch->cap = cap;
			ch->next = next;
			if (a->cur)
				a->cur->next = ch;
			else
				a->head = ch;
			next = ch;
		}
		a->cur = next;
	}
	void *p = a->cur->data + a->cur->used;
	a->cur->used += need;
	return p;
}

/* Zeroes what the call used and keeps the chunks (freeing oversized ones). */
static void
scratch_reset(struct kvpd_pool *p)
{
	struct kvpd_arena *a = &p->arena;
	struct kvpd_chunk **link = &a->head;
	size_t kept = 0;

	while (*link) {
		struct kvpd_chunk *ch = *link;
		memset(ch->data, 0, ch->used);
		ch->used = 0;
		if (kept + ch->cap > KVPD_ARENA_KEEP) {
			*link = ch->next;
			free(ch);
			continue;
		}
		kept += ch->cap;
		link = &ch->next;
	}
	a->cur = NULL;
}

void
kvpd_arena_fini(struct kvpd_arena *a)
{
	while (a->head) {
		struct kvpd_chunk *ch = a->head;
		a->head = ch->next;
		free(ch);
	}
	a->cur = NULL;
}

/* A zeroed, initialised protobuf-c message that frees itself with the call. */
void *
kvpd_new_msg(struct call *c, const ProtobufCMessageDescriptor *d)
{
	void *m = kvpd_scratch(c, d->sizeof_message);
	if (m != NULL)
		protobuf_c_message_init(d, m);
	return m;
}


/* A batch call's oneof numbers are the request's: one switch serves both. */
#define SAME_CASE(x) \
	_Static_assert((int)KVPOOL__V1__BATCH_CALL__CALL_##x == (int)KVPOOL__V1__REQUEST__CALL_##x, #x)
SAME_CASE(ALLOCATE);
SAME_CASE(TOUCH);
SAME_CASE(FREE);
SAME_CASE(CACHE);
SAME_CASE(LOOKUP);
SAME_CASE(EVICT);
SAME_CASE(STATS);
SAME_CASE(ALLOCATE_SLOTS);
SAME_CASE(FREE_REQUEST);
SAME_CASE(GET_COMPUTED_BLOCKS);
#undef SAME_CASE

/* ---- sessions ---- */

static struct kvpd_session *
find_session(struct kvpd_pool *p, uint64_t id, size_t *index)
{
	for (size_t i = 0; i < p->num_sessions; i++)
		if (p->sessions[i]->id == id) {
			if (index)
				*index = i;
			return p->sessions[i];
		}
	return NULL;
}

static bool
token_ok(const char *want, const char *got)
{
	/* Compares every byte whatever the first difference: no timing hint. */
	size_t lw = strlen(want), lg = strlen(got);
	unsigned diff = (unsigned)(lw ^ lg);
	for (size_t i = 0; i < lw; i++)
		diff |= (unsigned char)want[i] ^ (unsigned char)(i < lg ? got[i] : 0);
	return diff == 0;
}

static uint64_t
new_session_id(struct kvpd_pool *p)
{
	uint64_t id;
	do {
		id = (uint64_t)nng_random() << 32 | nng_random();
	} while (id == 0 || find_session(p, id, NULL) != NULL);
	return id;
}

/* Fills the pool's description (Hello; Heartbeat for a resumed session). */
static int
pool_info(struct call *c, Kvpool__V1__PoolInfo *info, Kvpool__V1__GroupInfo *g,
          Kvpool__V1__GroupInfo **gl)
{
	struct kvpd_pool *p = c->p;

	info->name = p->cfg.name;
	info->num_blocks = kvp_pool_num_blocks(p->pool);
	info->hash_block_size = kvp_pool_hash_block_size(p->pool);
	info->hash_algorithm = "sha256_cbor";
	info->none_hash_fingerprint.data = p->none_fp;
	info->none_hash_fingerprint.len = sizeof(p->none_fp);
	g->group_id = 0;
	g->block_size = p->cfg.block_size;
	g->kind = "full_attention";
	gl[0] = g;
	info->groups = gl;
	info->n_groups = 1;
	info->medium = p->cfg.medium;
	info->event_epoch = p->stream.epoch;
	info->event_seq = p->stream.next_seq;
	info->max_model_len = p->cfg.max_model_len;
	info->max_ids_per_call = p->limits.max_ids;
	info->max_hash_len = kvp_pool_max_hash_len(p->pool);
	info->max_msg_bytes = (uint32_t)p->limits.max_reply_bytes;
	if (p->exec != NULL) {
		const struct kvp_kv_shape *sh = kvp_exec_shape(p->exec);
		Kvpool__V1__ExecutorInfo *x =
			NEW(c, Kvpool__V1__ExecutorInfo, kvpool__v1__executor_info__descriptor);
		if (x == NULL)
			return kvpd_fail(c, KVP_ENOMEM, "out of memory");
		x->backend = (char *)kvp_exec_backend_name(p->exec);
		x->num_layers = sh->num_layers;
		x->num_heads = sh->num_heads;
		x->head_size = sh->head_size;
		x->dtype = (char *)kvp_dtype_name(sh->dtype);
		x->layout = (char *)kvp_cache_layout_name(sh->layout);
		x->block_size = sh->block_size;
		x->block_bytes = kvp_exec_block_bytes(p->exec);
		x->memory_bytes = kvp_exec_memory_bytes(p->exec);
		info->executor = x;
	}
	return KVP_OK;
}

static int
h_hello(struct call *c, const Kvpool__V1__HelloRequest *m, uint64_t now_ms,
        Kvpool__V1__Reply *out)
{
	struct kvpd_pool *p = c->p;
	Kvpool__V1__HelloReply *r = NEW(c, Kvpool__V1__HelloReply, kvpool__v1__hello_reply__descriptor);
	Kvpool__V1__PoolInfo *info = NEW(c, Kvpool__V1__PoolInfo, kvpool__v1__pool_info__descriptor);
	Kvpool__V1__GroupInfo *g = NEW(c, Kvpool__V1__GroupInfo, kvpool__v1__group_info__descriptor);
	Kvpool__V1__GroupInfo **gl = kvpd_scratch(c, sizeof(*gl));

	if (r == NULL || info == NULL || g == NULL || gl == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	if (m->protocol_version != KVP_PROTOCOL_VERSION)
		return kvpd_fail(c, KVP_EVERSION, "protocol version %u; this daemon speaks %u",
		            m->protocol_version, KVP_PROTOCOL_VERSION);
	if (!token_ok(p->cfg.token, m->auth_token ? m->auth_token : ""))
		return kvpd_fail(c, KVP_EUNAUTH, "wrong auth token for pool %s", p->cfg.name);
	if (p->num_sessions >= p->limits.max_sessions)
		return kvpd_fail(c, KVP_EBUSY, "pool %s has %zu sessions, the limit", p->cfg.name,
		            p->num_sessions);
	if (p->num_sessions == p->cap_sessions) {
		size_t cap = p->cap_sessions ? p->cap_sessions * 2 : 8;
		struct kvpd_session **ns = realloc(p->sessions, cap * sizeof(*ns));
		if (ns == NULL)
			return kvpd_fail(c, KVP_ENOMEM, "out of memory");
		p->sessions = ns;
		p->cap_sessions = cap;
	}
	uint32_t lease = m->lease_ms ? m->lease_ms : p->limits.lease_ms;
	if (lease < 100)
		lease = 100;
	if (lease > 86400000u)
		lease = 86400000u;
	struct kvpd_session *s = kvpd_session_create(new_session_id(p), lease, m->client_name, now_ms);
	if (s == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	p->sessions[p->num_sessions++] = s;
	p->counters.sessions_opened++;

	if (pool_info(c, info, g, gl) != KVP_OK)
		return c->status;
	r->session_id = s->id;
	r->lease_ms = lease;
	r->pool = info;
	out->result_case = KVPOOL__V1__REPLY__RESULT_HELLO;
	out->hello = r;
	return KVP_OK;
}

size_t
kvpd_pool_release_session(struct kvpd_pool *p, struct kvpd_session *s)
{
	size_t n = 0;
	int32_t *ids;

	/* The session's requests first, newest first: each frees its blocks tail first. */
	while (s->num_reqs > 0) {
		struct kvpd_request_ref *r = &s->reqs[s->num_reqs - 1];
		(void)kvp_mgr_free_request(p->mgr, r->mgr_id);
		s->num_reqs--;
	}
	ids = kvpd_session_all_newest_first(s, &n);

	/* One block at a time, newest first, as the scheduler would have freed them. */
	for (size_t i = 0; i < n; i++) {
		int rv = kvp_pool_free_blocks(p->pool, &ids[i], 1);
		if (rv == KVP_OK)
			kvpd_session_remove(s, ids[i]);
	}
	free(ids);
	return n;
}

static void
drop_session(struct kvpd_pool *p, size_t index)
{
	struct kvpd_session *s = p->sessions[index];
	kvpd_pool_release_session(p, s);
	kvpd_session_destroy(s);
	p->sessions[index] = p->sessions[--p->num_sessions];
}

size_t
kvpd_pool_expire(struct kvpd_pool *p, uint64_t now_ms)
{
	size_t n = 0;
	for (size_t i = 0; i < p->num_sessions;) {
		struct kvpd_session *s = p->sessions[i];
		if (now_ms - s->last_seen_ms > s->lease_ms && now_ms > s->last_seen_ms) {
			drop_session(p, i);
			p->counters.leases_expired++;
			n++;
		} else {
			i++;
		}
	}
	if (n > 0)
		kvpd_pool_publish(p);
	return n;
}

/* ---- dispatch ---- */

static bool
mutating(Kvpool__V1__Request__CallCase cc)
{
	switch (cc) {
	case KVPOOL__V1__REQUEST__CALL_ALLOCATE:
	case KVPOOL__V1__REQUEST__CALL_TOUCH:
	case KVPOOL__V1__REQUEST__CALL_FREE:
	case KVPOOL__V1__REQUEST__CALL_CACHE:
	case KVPOOL__V1__REQUEST__CALL_EVICT:
	case KVPOOL__V1__REQUEST__CALL_RESET:
	case KVPOOL__V1__REQUEST__CALL_BATCH:
	case KVPOOL__V1__REQUEST__CALL_ALLOCATE_SLOTS:
	case KVPOOL__V1__REQUEST__CALL_FREE_REQUEST:
		return true;
	default:
		return false;
	}
}

static int run_batch(struct call *c, const Kvpool__V1__BatchRequest *m, Kvpool__V1__Reply *out);

/* Runs one call (a top-level call or one inside a batch). */
static int
run_one(struct call *c, int cc, void *msg, Kvpool__V1__Reply *out)
{
	switch (cc) {
	case KVPOOL__V1__REQUEST__CALL_ALLOCATE:
		return kvpd_h_allocate(c, msg, out);
	case KVPOOL__V1__REQUEST__CALL_TOUCH:
		return kvpd_h_touch(c, msg, out);
	case KVPOOL__V1__REQUEST__CALL_FREE:
		return kvpd_h_free(c, msg, out);
	case KVPOOL__V1__REQUEST__CALL_CACHE:
		return kvpd_h_cache(c, msg, out);
	case KVPOOL__V1__REQUEST__CALL_LOOKUP:
		return kvpd_h_lookup(c, msg, out);
	case KVPOOL__V1__REQUEST__CALL_EVICT:
		return kvpd_h_evict(c, msg, out);
	case KVPOOL__V1__REQUEST__CALL_RESET:
		return kvpd_h_reset(c, out);
	case KVPOOL__V1__REQUEST__CALL_STATS:
		return kvpd_h_stats(c, out);
	case KVPOOL__V1__REQUEST__CALL_BATCH:
		return run_batch(c, msg, out);
	case KVPOOL__V1__REQUEST__CALL_REPLAY:
		return kvpd_h_replay(c, msg, out);
	case KVPOOL__V1__REQUEST__CALL_SNAPSHOT:
		return kvpd_h_snapshot(c, out);
	case KVPOOL__V1__REQUEST__CALL_ALLOCATE_SLOTS:
		return kvpd_h_allocate_slots(c, msg, out);
	case KVPOOL__V1__REQUEST__CALL_FREE_REQUEST:
		return kvpd_h_free_request(c, msg, out);
	case KVPOOL__V1__REQUEST__CALL_GET_COMPUTED_BLOCKS:
		return kvpd_h_get_computed_blocks(c, msg, out);
	case KVPOOL__V1__REQUEST__CALL_WRITE_BLOCKS:
		return kvpd_h_write_blocks(c, msg, out);
	case KVPOOL__V1__REQUEST__CALL_READ_BLOCKS:
		return kvpd_h_read_blocks(c, msg, out);
	case KVPOOL__V1__REQUEST__CALL_COPY_BLOCKS:
		return kvpd_h_copy_blocks(c, msg, out);
	case KVPOOL__V1__REQUEST__CALL_WRITE_TOKENS:
		return kvpd_h_write_tokens(c, msg, out);
	default:
		return kvpd_fail(c, KVP_EINVAL, "no call in the request, or one this daemon does not know");
	}
}

static int
run_batch(struct call *c, const Kvpool__V1__BatchRequest *m, Kvpool__V1__Reply *out)
{
	Kvpool__V1__BatchReply *r = NEW(c, Kvpool__V1__BatchReply, kvpool__v1__batch_reply__descriptor);
	Kvpool__V1__Reply **replies = kvpd_scratch(c, m->n_calls * sizeof(*replies));

	if (r == NULL || replies == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	if (m->n_calls > c->p->limits.max_ids)
		return kvpd_fail(c, KVP_EINVAL, "%zu calls in one batch", m->n_calls);
	out->result_case = KVPOOL__V1__REPLY__RESULT_BATCH;
	out->batch = r;
	r->replies = replies;
	for (size_t i = 0; i < m->n_calls; i++) {
		const Kvpool__V1__BatchCall *bc = m->calls[i];
		Kvpool__V1__Reply *sub = NEW(c, Kvpool__V1__Reply, kvpool__v1__reply__descriptor);
		if (sub == NULL)
			return kvpd_fail(c, KVP_ENOMEM, "out of memory");
		replies[r->n_replies++] = sub;
		/* BatchCall's oneof numbers are the Request's, so one switch serves both. */
		int cc = (int)bc->call_case;
		int rv = cc == KVPOOL__V1__REQUEST__CALL_BATCH ? kvpd_fail(c, KVP_EINVAL, "nested batch")
		                                                : run_one(c, cc, bc->allocate, sub);
		sub->status = (Kvpool__V1__Status)rv;
		if (rv != KVP_OK) {
			/* The failing call's reply carries its own detail; the batch's says which. */
			char *d = kvpd_scratch(c, sizeof(c->detail));
			if (d != NULL) {
				memcpy(d, c->detail, sizeof(c->detail));
				sub->detail = d;
				snprintf(c->detail, sizeof(c->detail), "batch stopped at call %zu", i);
			}
			return rv; /* the batch stops at its first failure */
		}
	}
	return KVP_OK;
}

int
kvpd_pack_reply(const Kvpool__V1__Reply *r, struct kvpd_sink *sink)
{
	size_t n = kvpool__v1__reply__get_packed_size(r);
	uint8_t *buf = sink->alloc(sink->ctx, n);
	if (buf == NULL)
		return KVP_ENOMEM;
	sink->buf = buf;
	sink->len = kvpool__v1__reply__pack(r, buf);
	return KVP_OK;
}

int
kvpd_dispatch(struct kvpd_pool *p, const Kvpool__V1__Request *rq, uint64_t now_ms,
              struct kvpd_sink *sink)
{
	struct call c = {.p = p, .call_id = rq->call_id, .sink = sink};
	Kvpool__V1__Reply out = KVPOOL__V1__REPLY__INIT;
	size_t index = 0;
	int rv;

	p->counters.calls++;
	if (rq->call_case == KVPOOL__V1__REQUEST__CALL_HELLO) {
		rv = h_hello(&c, rq->hello, now_ms, &out);
	} else if ((c.sess = find_session(p, rq->session_id, &index)) == NULL) {
		rv = kvpd_fail(&c, KVP_EUNAUTH, "no session %llu on pool %s (Hello first; leases expire)",
		          (unsigned long long)rq->session_id, p->cfg.name);
	} else {
		c.sess->last_seen_ms = now_ms;
		const struct kvpd_cached_reply *cached =
			mutating(rq->call_case) ? kvpd_session_cached(c.sess, rq->call_id) : NULL;
		if (cached != NULL) {
			/* A retry: answer what the first attempt answered, apply nothing. */
			if ((sink->buf = sink->alloc(sink->ctx, cached->len)) == NULL)
				return KVP_ENOMEM;
			memcpy(sink->buf, cached->bytes, cached->len);
			sink->len = cached->len;
			return KVP_OK;
		}
		switch (rq->call_case) {
		case KVPOOL__V1__REQUEST__CALL_HEARTBEAT: {
			Kvpool__V1__HeartbeatReply *r =
				NEW(&c, Kvpool__V1__HeartbeatReply, kvpool__v1__heartbeat_reply__descriptor);
			if (r == NULL) {
				rv = kvpd_fail(&c, KVP_ENOMEM, "out of memory");
				break;
			}
			r->lease_ms = c.sess->lease_ms;
			if (rq->heartbeat != NULL && rq->heartbeat->with_pool_info) {
				Kvpool__V1__PoolInfo *info =
					NEW(&c, Kvpool__V1__PoolInfo, kvpool__v1__pool_info__descriptor);
				Kvpool__V1__GroupInfo *g =
					NEW(&c, Kvpool__V1__GroupInfo, kvpool__v1__group_info__descriptor);
				Kvpool__V1__GroupInfo **gl = kvpd_scratch(&c, sizeof(*gl));
				if (info == NULL || g == NULL || gl == NULL) {
					rv = kvpd_fail(&c, KVP_ENOMEM, "out of memory");
					break;
				}
				if ((rv = pool_info(&c, info, g, gl)) != KVP_OK)
					break;
				r->pool = info;
			}
			out.result_case = KVPOOL__V1__REPLY__RESULT_HEARTBEAT;
			out.heartbeat = r;
			rv = KVP_OK;
			break;
		}
		case KVPOOL__V1__REQUEST__CALL_GOODBYE: {
			Kvpool__V1__GoodbyeReply *r =
				NEW(&c, Kvpool__V1__GoodbyeReply, kvpool__v1__goodbye_reply__descriptor);
			if (r == NULL) {
				rv = kvpd_fail(&c, KVP_ENOMEM, "out of memory");
				break;
			}
			r->references_released = (uint32_t)c.sess->held;
			drop_session(p, index);
			c.sess = NULL;
			p->counters.goodbyes++;
			out.result_case = KVPOOL__V1__REPLY__RESULT_GOODBYE;
			out.goodbye = r;
			rv = KVP_OK;
			break;
		}
		default:
			rv = run_one(&c, (int)rq->call_case, rq->allocate, &out);
		}
	}
	if (c.oom && rv == KVP_OK)
		rv = kvpd_fail(&c, KVP_ENOMEM, "out of memory");
	if ((int)rq->call_case > 0 && (int)rq->call_case < KVPD_NUM_CALLS && rv >= 0 &&
	    rv < KVPD_NUM_STATUS)
		p->counters.by_call[rq->call_case][rv]++;
	if (rv != KVP_OK) {
		p->counters.call_errors++;
		/* An error reply carries no result, except a batch's partial list. */
		if (out.result_case != KVPOOL__V1__REPLY__RESULT_BATCH)
			out.result_case = KVPOOL__V1__REPLY__RESULT__NOT_SET;
	}
	out.call_id = rq->call_id;
	out.status = (Kvpool__V1__Status)rv;
	out.detail = rv == KVP_OK ? "" : c.detail;
	if (rv == KVP_OK && c.replied)
		rv = KVP_OK; /* the handler wrote the reply itself */
	else
		rv = kvpd_pack_reply(&out, sink);
	if (rv == KVP_OK && c.sess != NULL && mutating(rq->call_case))
		kvpd_session_remember(c.sess, rq->call_id, sink->buf, sink->len);
	scratch_reset(p);
	kvpd_pool_publish(p); /* one batch per call that produced events */
	return rv;
}

void
kvpd_pool_publish(struct kvpd_pool *p)
{
	struct timespec ts;

	/* The manager's take also names each BlockStored's spec kind. */
	if (kvp_mgr_take_events(p->mgr, &p->events) != KVP_OK ||
	    kvp_event_batch_count(&p->events) == 0)
		return;
	p->counters.events_emitted += kvp_event_batch_count(&p->events);
	clock_gettime(CLOCK_REALTIME, &ts);
	(void)kvpd_stream_emit(&p->stream, p->cfg.name, &p->events,
	                       (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec);
}

void
kvpd_pool_gauges(struct kvpd_pool *p, struct kvpd_pool_gauges *out)
{
	struct kvp_pool_stats ps;
	struct kvp_mgr_stats ms;

	memset(out, 0, sizeof(*out));
	kvp_pool_get_stats(p->pool, &ps);
	kvp_mgr_get_stats(p->mgr, &ms);
	out->num_blocks = kvp_pool_num_blocks(p->pool);
	out->num_free = kvp_pool_num_free(p->pool);
	out->num_cached_blocks = kvp_pool_num_cached_blocks(p->pool);
	out->num_cached_keys = kvp_pool_num_cached_keys(p->pool);
	out->usage = kvp_pool_usage(p->pool);
	out->blocks_allocated = ps.blocks_allocated;
	out->blocks_evicted = ps.blocks_evicted;
	out->alloc_failures = ps.alloc_failures + ms.alloc_failures;
	out->blocks_stored = ps.blocks_stored;
	out->resets = ps.resets;
	out->prefix_requests = ms.requests;
	out->prefix_queries = ms.queries;
	out->prefix_hits = ms.hits;
	out->active_requests = ms.active_requests;
}

int
kvpd_pool_check(struct kvpd_pool *p, char *detail, size_t len)
{
	int rv = kvp_pool_check(p->pool, detail, len);
	if (rv != KVP_OK)
		return rv;
	/* No block may be held by sessions more often than its ref count. */
	uint32_t nb = kvp_pool_num_blocks(p->pool);
	for (uint32_t id = 1; id < nb; id++) {
		uint64_t held = 0;
		for (size_t i = 0; i < p->num_sessions; i++)
			held += kvpd_session_held(p->sessions[i], (int32_t)id);
		if (held > (uint64_t)kvp_pool_ref_cnt(p->pool, (int32_t)id)) {
			snprintf(detail, len, "block %u: sessions hold %llu references, ref_cnt %d", id,
			         (unsigned long long)held, kvp_pool_ref_cnt(p->pool, (int32_t)id));
			return KVP_EINTERNAL;
		}
	}
	return KVP_OK;
}
