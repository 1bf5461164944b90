/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The dispatcher: finds a request's row in the call table (calls.h), checks
 * its session, answers retries from the reply cache, runs the handler,
 * counts it and packs the reply. A call it runs can find rows too
 * (call.h: c->lookup), which is how Batch (handlers/calls_batch.c) runs
 * rows of the same table without naming it.
 */
#define _POSIX_C_SOURCE 200809L

#include "service/rpc/dispatch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/kvp_status.h"
#include "engine/manager.h"
#include "engine/pool.h"
#include "service/rpc/call.h"
#include "service/rpc/calls.h"
#include "proto/wire.h"

#define NO_CALL "no call in the request, or one this daemon does not know"

/* Why a call's session is not there: never opened, ended, or its lease ran out. */
static int
no_session(struct call *c, uint64_t id, uint64_t now_ms)
{
	const struct kvpd_gone_session *g = kvpd_pool_find_gone(c->p, id);
	const char *pool = c->p->cfg.name;
	unsigned long long sid = (unsigned long long)id;
	/* A call that arrived before its session ended is read after: 0 ms, not a wrap. */
	unsigned long long ago = g != NULL && now_ms > g->at_ms ? now_ms - g->at_ms : 0;

	if (id == 0)
		return kvpd_fail(c, KVP_EUNAUTH, "no session given on pool %s (call Hello first)", pool);
	if (g == NULL)
		return kvpd_fail(c, KVP_EUNAUTH, "no session %llu on pool %s (never opened here, or "
		                 "ended long ago; call Hello)", sid, pool);
	if (g->why == KVPD_GONE_GOODBYE)
		return kvpd_fail(c, KVP_EUNAUTH, "session %llu on pool %s was ended by Goodbye %llu ms "
		                 "ago (call Hello)", sid, pool, ago);
	return kvpd_fail(c, KVP_EUNAUTH, "session %llu on pool %s expired %llu ms ago: no call "
	                 "for its %u ms lease; its %llu block reference(s) were released (call Hello)",
	                 sid, pool, ago, g->lease_ms,
	                 (unsigned long long)g->released);
}

/* Why a call on a pool with a token is refused: it carried none, or another. */
static int
token_refused(struct call *c, size_t len)
{
	if (len == 0)
		return kvpd_fail(c, KVP_EUNAUTH, "pool %s has a token and this call carries none: "
		                 "every call of such a pool carries it, not only Hello (kvpool's "
		                 "clients do this themselves)", c->p->cfg.name);
	return kvpd_fail(c, KVP_EUNAUTH, "wrong auth token for pool %s on this call",
	                 c->p->cfg.name);
}

int
kvpd_dispatch_precheck(struct kvpd_pool *p, const struct kvpd_envelope *e, uint64_t now_ms,
                       struct kvpd_sink *sink, int *pack_rv)
{
	const struct kvpd_call_op *op = kvpd_call_lookup((int)e->call_case);
	struct call c = {.p = p, .call_id = e->call_id, .sink = sink, .now_ms = now_ms};
	size_t index;
	int rv;
	bool token_ok = p->cfg.token[0] != '\0' &&
	                kvpd_token_matches(p->cfg.token, e->token, e->token_len);
	/* A pool's token, shown: the transport gives this connection precedence. */
	sink->authenticated = sink->authenticated || token_ok;
	if (op == NULL || (op->flags & KVPD_CALL_NO_SESSION))
		return KVP_OK; /* the full dispatch decides */
	if (p->cfg.token[0] != '\0' && !token_ok)
		rv = token_refused(&c, e->token_len);
	else if (kvpd_pool_find_session(p, e->session_id, &index) == NULL)
		rv = no_session(&c, e->session_id, now_ms);
	else
		return KVP_OK;
	Kvpool__V1__Reply out = KVPOOL__V1__REPLY__INIT;
	p->counters.calls++;
	p->counters.call_errors++;
	p->counters.by_call[kvpd_call_index(op)][rv]++;
	kvpd_sink_refusal(sink, KVPD_REFUSED_AUTH, p->cfg.name, c.detail);
	out.call_id = e->call_id;
	out.status = (Kvpool__V1__Status)rv;
	out.detail = c.detail;
	*pack_rv = kvpd_pack_reply(&out, sink);
	kvpd_scratch_reset(p);
	return rv;
}

/*
 * Makes room for one more entry in p->ages: drops the entries whose reply
 * has gone (and those already taken from the front), then grows if it is
 * still over half full. O(1) amortized per entry. False if out of memory.
 */
static bool
ages_reserve(struct kvpd_pool *p)
{
	if (p->ages_len < p->ages_cap)
		return true;
	size_t k = 0;
	for (size_t i = p->ages_head; i < p->ages_len; i++) {
		const struct kvpd_session *s = kvpd_pool_find_session(p, p->ages[i].session_id, NULL);
		if (s != NULL && kvpd_session_holds_stamp(s, p->ages[i].stamp))
			p->ages[k++] = p->ages[i];
	}
	p->ages_head = 0;
	p->ages_len = k;
	if (2 * k < p->ages_cap)
		return true;
	size_t cap = p->ages_cap ? 2 * p->ages_cap : 64;
	struct kvpd_reply_age *v = realloc(p->ages, cap * sizeof(*v));
	if (v == NULL)
		return k < p->ages_cap;
	p->ages = v;
	p->ages_cap = cap;
	return true;
}

/*
 * Stores a mutating call's reply for retries, within the pool's byte budget
 * over every session: the pool's oldest stored replies (whoever's) go
 * first, found at the front of p->ages. Out of memory, the reply is not
 * stored (as one over the budget is not).
 */
static void
remember(struct kvpd_pool *p, struct kvpd_session *s, uint64_t call_id, uint32_t crc,
         const struct kvpd_sink *sink)
{
	size_t before = s->cache_bytes;
	if (sink->len > p->limits.reply_cache_bytes || !ages_reserve(p))
		return;
	kvpd_session_remember(s, call_id, crc, sink->buf, sink->len, ++p->reply_stamp);
	p->ages[p->ages_len++] = (struct kvpd_reply_age){s->id, p->reply_stamp};
	p->reply_cache_used = p->reply_cache_used - before + s->cache_bytes;
	while (p->reply_cache_used > p->limits.reply_cache_bytes && p->ages_head < p->ages_len) {
		/*
		 * Every stored reply has its entry here and the entries are in
		 * stamp order, so the front one is its session's oldest, or gone.
		 */
		struct kvpd_reply_age a = p->ages[p->ages_head++];
		struct kvpd_session *old = kvpd_pool_find_session(p, a.session_id, NULL);
		if (old == NULL || kvpd_session_oldest_stamp(old) != a.stamp)
			continue;
		p->reply_cache_used -= kvpd_session_forget_oldest(old);
		p->counters.replies_forgotten++;
	}
}

/* How far past deadline_ms (Unix ms; 0: none) the wall clock is, beyond the allowed skew; 0: not. */
static uint64_t
past_deadline(const struct kvpd_pool *p, uint64_t deadline_ms)
{
	struct timespec ts;
	if (deadline_ms == 0 || deadline_ms > UINT64_MAX - p->limits.deadline_skew_ms ||
	    clock_gettime(CLOCK_REALTIME, &ts) != 0)
		return 0;
	uint64_t now = (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
	uint64_t limit = deadline_ms + p->limits.deadline_skew_ms;
	return now > limit ? now - deadline_ms : 0;
}

int
kvpd_dispatch(struct kvpd_pool *p, const Kvpool__V1__Request *rq, uint32_t request_crc,
              uint64_t now_ms, const struct kvpd_precomputed *pre, struct kvpd_sink *sink)
{
	struct call c = {.p = p, .call_id = rq->call_id, .sink = sink, .now_ms = now_ms,
	                 .lookup = kvpd_call_lookup,
	                 .pre = pre};
	Kvpool__V1__Reply out = KVPOOL__V1__REPLY__INIT;
	const struct kvpd_call_op *op = kvpd_call_lookup((int)rq->call_case);
	bool mutating = op != NULL && (op->flags & KVPD_CALL_MUTATING);
	int rv;

	p->counters.calls++;
	uint64_t late_ms = past_deadline(p, rq->deadline_unix_ms);
	if (late_ms > 0) {
		/* Its client gave up: applying it now would lock or change state for no one. */
		rv = kvpd_fail(&c, KVP_EDEADLINE,
		               "the call's deadline passed %llu ms before the daemon read it (a stall "
		               "or a long wait; or clocks more than --deadline-skew-ms apart)",
		               (unsigned long long)late_ms);
		mutating = false;
	} else if (op != NULL && (op->flags & KVPD_CALL_NO_SESSION)) {
		rv = op->run(&c, rq->allocate, &out);
	} else if ((c.sess = kvpd_pool_find_session(p, rq->session_id, &c.sess_index)) == NULL) {
		rv = no_session(&c, rq->session_id, now_ms);
	} else {
		c.sess->last_seen_ms = now_ms;
		const struct kvpd_cached_reply *cached =
			mutating ? kvpd_session_cached(c.sess, rq->call_id) : NULL;
		if (cached != NULL && cached->request_crc != request_crc) {
			/* Not a retry: the caller reused a call id for another call. */
			rv = kvpd_fail(&c, KVP_EINVAL,
			               "call id %llu was already used for another call of this session "
			               "(a retry resends the same request)",
			               (unsigned long long)rq->call_id);
			mutating = false; /* the first reply stays the one a retry gets */
		} else if (cached != NULL) {
			/* A retry: answer what the first attempt answered, apply nothing. */
			if ((sink->buf = sink->alloc(sink->ctx, cached->len)) == NULL)
				return KVP_ENOMEM;
			memcpy(sink->buf, cached->bytes, cached->len);
			sink->len = cached->len;
			return KVP_OK;
		} else {
			rv = op == NULL ? kvpd_fail(&c, KVP_EINVAL, NO_CALL)
			                : op->run(&c, rq->allocate, &out);
		}
	}
	if (c.oom && rv == KVP_OK)
		rv = kvpd_fail(&c, KVP_ENOMEM, "out of memory");
	if (op != NULL && rv >= 0 && rv < KVPD_NUM_STATUS)
		p->counters.by_call[kvpd_call_index(op)][rv]++;
	if (rv != KVP_OK) {
		p->counters.call_errors++;
		/* An error reply carries no result, except a batch's partial list. */
		if (out.result_case != KVPOOL__V1__REPLY__RESULT_BATCH)
			out.result_case = KVPOOL__V1__REPLY__RESULT__NOT_SET;
	}
	if (rv == KVP_EUNAUTH) /* for the transport's log, with the peer's address */
		kvpd_sink_refusal(sink, KVPD_REFUSED_AUTH, p->cfg.name, c.detail);
	out.call_id = rq->call_id;
	out.status = (Kvpool__V1__Status)rv;
	out.detail = rv == KVP_OK ? "" : c.detail;
	if (rv == KVP_OK && c.replied)
		rv = KVP_OK; /* the handler wrote the reply itself */
	else
		rv = kvpd_pack_reply(&out, sink);
	if (rv == KVP_OK && c.sess != NULL && mutating)
		remember(p, c.sess, rq->call_id, request_crc, sink);
	kvpd_scratch_reset(p);
	kvpd_pool_publish(p); /* one batch per call that produced events */
	return rv;
}
