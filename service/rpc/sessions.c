/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pool's session table (dispatch.h): finding a session or an ended
 * one, the token check, ending a session (Goodbye, a replaced session,
 * lease expiry) and releasing what ended sessions held, in slices. Beneath
 * the dispatcher, the server and the session calls, which all use it;
 * calls no handler.
 */
#include "service/rpc/dispatch.h"

#include <stdlib.h>
#include <string.h>

#include "engine/manager.h"
#include "engine/pool.h"

struct kvpd_session *
kvpd_pool_find_session(struct kvpd_pool *p, uint64_t id, size_t *index)
{
	uint64_t at = kvpd_u64map_get(&p->session_index, id);
	if (at == 0)
		return NULL;
	if (index)
		*index = (size_t)(at - 1);
	return p->sessions[at - 1];
}

bool
kvpd_token_matches(const char *want, const uint8_t *got, size_t lg)
{
	/* Compares every byte whatever the first difference: no timing hint. */
	size_t lw = strlen(want);
	unsigned diff = lw != lg;
	for (size_t i = 0; i < lw; i++)
		diff |= (unsigned char)want[i] ^ (i < lg ? got[i] : 0u);
	return diff == 0;
}

/* A session that named a pod ends: the pod's count goes down, and the pod with it at 0. */
static void
pod_release(struct kvpd_pool *p, const char *pod)
{
	struct kvpd_pool_pods *ps = &p->pods;
	for (size_t i = 0; pod[0] != '\0' && i < ps->n; i++)
		if (strcmp(ps->pod[i].name, pod) == 0) {
			if (--ps->pod[i].sessions == 0)
				ps->pod[i] = ps->pod[--ps->n];
			return;
		}
}

static void
free_request(void *mgr, uint64_t mgr_id)
{
	(void)kvp_mgr_free_request(mgr, mgr_id);
}

static int
free_one(void *pool, int32_t id)
{
	return kvp_pool_free_blocks(pool, &id, 1);
}

size_t
kvpd_pool_release_session(struct kvpd_pool *p, struct kvpd_session *s)
{
	size_t n = s->held;
	/* The session's requests first, newest first: each frees its blocks tail first. */
	kvpd_session_end_requests(s, free_request, p->mgr);
	/* Then one block at a time, newest first, as the scheduler would have freed them. */
	kvpd_session_release_some(s, SIZE_MAX, free_one, p->pool);
	return n;
}

/* Forgets an ended session whose references are all released. */
static void
finish(struct kvpd_pool *p, struct kvpd_session *s)
{
	p->refs_held -= s->held; /* 0, unless the engine refused a release */
	kvpd_session_destroy(s);
}

bool
kvpd_pool_release_pending(struct kvpd_pool *p, size_t max)
{
	while (p->num_ending > 0 && max > 0) {
		struct kvpd_session *s = p->ending[0];
		size_t seen = kvpd_session_release_some(s, max, free_one, p->pool);
		max -= seen < max ? seen : max;
		if (s->held == 0 || s->log_len == 0) {
			finish(p, s);
			memmove(p->ending, p->ending + 1, --p->num_ending * sizeof(*p->ending));
		}
	}
	return p->num_ending > 0;
}

const struct kvpd_gone_session *
kvpd_pool_find_gone(const struct kvpd_pool *p, uint64_t id)
{
	uint64_t n = p->gone_total < KVPD_GONE_KEEP ? p->gone_total : KVPD_GONE_KEEP;
	for (uint64_t k = 1; k <= n; k++) { /* newest first */
		const struct kvpd_gone_session *g = &p->gone[(p->gone_total - k) % KVPD_GONE_KEEP];
		if (g->id == id)
			return g;
	}
	return NULL;
}

/*
 * Ends a session: it leaves the table at once (no call finds it), its
 * requests end and its stored replies go; its references join the pool's
 * pending releases, which kvpd_pool_release_pending works through in
 * slices, so one session's end never holds the lock for all of them.
 */
void
kvpd_pool_drop_session(struct kvpd_pool *p, size_t index, enum kvpd_gone_why why,
                       uint64_t now_ms)
{
	struct kvpd_session *s = p->sessions[index];
	struct kvpd_gone_session *g = &p->gone[p->gone_total++ % KVPD_GONE_KEEP];
	*g = (struct kvpd_gone_session){.id = s->id, .at_ms = now_ms, .released = s->held,
	                                .lease_ms = s->lease_ms, .requests = (uint32_t)s->reqs.n,
	                                .why = (uint8_t)why};
	memcpy(g->client, s->client, sizeof(g->client));
	pod_release(p, s->vllm_pod);
	(void)kvpd_u64map_del(&p->session_index, s->id);
	p->sessions[index] = p->sessions[--p->num_sessions];
	if (index < p->num_sessions) /* the last session moved into the hole: a replace, no growth */
		(void)kvpd_u64map_put(&p->session_index, p->sessions[index]->id, index + 1);
	kvpd_session_end_requests(s, free_request, p->mgr);
	p->reply_cache_used -= kvpd_session_forget_replies(s);
	if (s->held > 0 && p->num_ending == p->cap_ending) {
		size_t cap = p->cap_ending ? 2 * p->cap_ending : 8;
		struct kvpd_session **e = realloc(p->ending, cap * sizeof(*e));
		if (e != NULL) {
			p->ending = e;
			p->cap_ending = cap;
		}
	}
	if (s->held > 0 && p->num_ending < p->cap_ending) {
		p->ending[p->num_ending++] = s;
		return;
	}
	kvpd_session_release_some(s, SIZE_MAX, free_one, p->pool); /* out of memory: at once */
	finish(p, s);
}

size_t
kvpd_pool_expire(struct kvpd_pool *p, uint64_t now_ms, size_t max, bool *more)
{
	size_t n = 0, looked = 0, i = p->expire_at;
	/*
	 * From where the last call stopped: a round of calls looks at each
	 * session once, however many expire, and no call looks at more than
	 * KVPD_EXPIRE_SCAN (a dropped session's slot takes the last one, so i
	 * is looked at again).
	 */
	while (i < p->num_sessions && n < max && looked < KVPD_EXPIRE_SCAN) {
		struct kvpd_session *s = p->sessions[i];
		looked++;
		if (now_ms - s->last_seen_ms > s->lease_ms && now_ms > s->last_seen_ms) {
			kvpd_pool_drop_session(p, i, KVPD_GONE_EXPIRED, now_ms);
			p->counters.leases_expired++;
			n++;
		} else {
			i++;
		}
	}
	*more = i < p->num_sessions;
	p->expire_at = *more ? i : 0;
	if (n > 0)
		kvpd_pool_publish(p);
	return n;
}
