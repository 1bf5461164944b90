/* SPDX-License-Identifier: Apache-2.0 */
/* Sessions: Hello, Heartbeat, Goodbye, leases and releasing what a session held. */
#include "service/rpc/call.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kvp_version.h"
#include "engine/manager.h"
#include "engine/pool.h"
#include "gpu/executor.h"
#include "proto/wire.h"
#include "service/rpc/dispatch.h"

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

static uint64_t
new_session_id(struct kvpd_pool *p)
{
	uint64_t id;
	do {
		id = (uint64_t)nng_random() << 32 | nng_random();
	} while (id == 0 || kvpd_pool_find_session(p, id, NULL) != NULL);
	return id;
}

/* The pool's description (Hello; Heartbeat for a resumed session), or NULL (status set). */
static Kvpool__V1__PoolInfo *
pool_info(struct call *c)
{
	struct kvpd_pool *p = c->p;
	Kvpool__V1__PoolInfo *info = NEW(c, Kvpool__V1__PoolInfo, kvpool__v1__pool_info__descriptor);
	uint32_t ng = kvp_mgr_num_groups(p->mgr);
	Kvpool__V1__GroupInfo **gl = kvpd_scratch(c, ng * sizeof(*gl));

	if (info == NULL || gl == NULL) {
		kvpd_fail(c, KVP_ENOMEM, "out of memory");
		return NULL;
	}
	for (uint32_t i = 0; i < ng; i++) {
		const struct kvp_group_spec *s = kvp_mgr_group_spec(p->mgr, i);
		Kvpool__V1__GroupInfo *g = NEW(c, Kvpool__V1__GroupInfo,
		                               kvpool__v1__group_info__descriptor);
		if (g == NULL) {
			kvpd_fail(c, KVP_ENOMEM, "out of memory");
			return NULL;
		}
		g->group_id = i;
		g->block_size = s->block_size;
		g->kind = (char *)kvp_group_kind_name(s->kind);
		if (s->kind == KVP_GROUP_SLIDING_WINDOW)
			g->sliding_window = s->window;
		if (s->kind == KVP_GROUP_CHUNKED_LOCAL)
			g->attention_chunk_size = s->window;
		if (s->kind == KVP_GROUP_MAMBA)
			g->mamba_cache_mode = (char *)kvp_mamba_mode_name(s->mamba_mode);
		gl[i] = g;
	}
	info->name = p->cfg.name;
	info->num_blocks = kvp_pool_num_blocks(p->pool);
	info->hash_block_size = kvp_pool_hash_block_size(p->pool);
	info->hash_algorithm = (char *)kvp_hash_algo_name(kvp_hasher_algo(p->hasher));
	info->none_hash_fingerprint.data = p->none_fp;
	info->none_hash_fingerprint.len = sizeof(p->none_fp);
	info->prefix_caching = kvp_pool_caching_enabled(p->pool);
	info->groups = gl;
	info->n_groups = ng;
	info->medium = p->cfg.medium;
	info->event_epoch = p->stream.epoch;
	if (p->stream.sealed) { /* only sessions reach here: they presented the token */
		info->event_key.data = p->stream.key.key;
		info->event_key.len = KVP_SEAL_KEY_LEN;
		info->event_key_id = p->stream.key.id;
	}
	info->event_seq = p->stream.next_seq;
	info->max_model_len = p->cfg.max_model_len;
	info->max_ids_per_call = p->limits.max_ids;
	info->max_hash_len = kvp_pool_max_hash_len(p->pool);
	info->hash_len = kvp_pool_hash_len(p->pool);
	info->slots_runs = true;
	info->prompt_u32 = true;
	info->max_msg_bytes = (uint32_t)p->limits.max_reply_bytes;
	if (p->exec != NULL) {
		const struct kvp_kv_shape *sh = kvp_exec_shape(p->exec);
		Kvpool__V1__ExecutorInfo *x =
			NEW(c, Kvpool__V1__ExecutorInfo, kvpool__v1__executor_info__descriptor);
		if (x == NULL) {
			kvpd_fail(c, KVP_ENOMEM, "out of memory");
			return NULL;
		}
		x->backend = (char *)kvp_exec_backend_name(p->exec);
		x->num_layers = sh->num_layers;
		x->num_heads = sh->num_heads;
		x->head_size = sh->head_size;
		x->dtype = (char *)kvp_dtype_name(sh->dtype);
		x->layout = (char *)kvp_cache_layout_name(sh->layout);
		x->block_size = sh->block_size;
		x->block_bytes = kvp_exec_block_bytes(p->exec);
		x->memory_bytes = kvp_exec_memory_bytes(p->exec);
		x->region = p->row_crc != NULL;
		info->executor = x;
	}
	return info;
}

/*
 * The pod slot a session naming pod takes: its existing slot, or a new one;
 * -1 if pod is not a pod name ([A-Za-z0-9._:-], 1..63) or every slot is
 * taken (the failure is set).
 */
static int
pod_slot(struct call *c, const char *pod)
{
	struct kvpd_pool_pods *ps = &c->p->pods;
	size_t len = strlen(pod);
	if (len == 0 || len >= sizeof(ps->pod[0].name) ||
	    strspn(pod, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-") != len)
		return kvpd_fail(c, KVP_EINVAL, "vllm_pod: 1 to 63 of [A-Za-z0-9._:-] (a pod name "
		                 "or address, as the vLLM wire's {pod})"), -1;
	for (size_t i = 0; i < ps->n; i++)
		if (strcmp(ps->pod[i].name, pod) == 0)
			return (int)i;
	if (ps->n == KVPD_MAX_POOL_PODS)
		return kvpd_fail(c, KVP_EBUSY, "pool %s already credits %d engine pods, the limit",
		                 c->p->cfg.name, KVPD_MAX_POOL_PODS), -1;
	return (int)ps->n;
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

static void drop_session(struct kvpd_pool *p, size_t index, enum kvpd_gone_why why,
                         uint64_t now_ms);

int
kvpd_h_hello(struct call *c, const Kvpool__V1__HelloRequest *m, Kvpool__V1__Reply *out)
{
	uint64_t now_ms = c->now_ms;
	struct kvpd_pool *p = c->p;
	Kvpool__V1__HelloReply *r = NEW(c, Kvpool__V1__HelloReply, kvpool__v1__hello_reply__descriptor);
	Kvpool__V1__PoolInfo *info;

	if (r == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	if (m->protocol_version != KVP_PROTOCOL_VERSION)
		return kvpd_fail(c, KVP_EVERSION, "protocol version %u; this daemon speaks %u",
		            m->protocol_version, KVP_PROTOCOL_VERSION);
	const char *tok = m->auth_token ? m->auth_token : "";
	if (p->cfg.token[0] != '\0' && tok[0] == '\0')
		return kvpd_fail(c, KVP_EUNAUTH, "pool %s needs an auth token and none was given",
		                 p->cfg.name);
	if (!kvpd_token_matches(p->cfg.token, (const uint8_t *)tok, strlen(tok)))
		return kvpd_fail(c, KVP_EUNAUTH, "wrong auth token for pool %s", p->cfg.name);
	/* A renewal: the session it replaces ends first, as by Goodbye (the token is checked). */
	size_t old_index;
	if (m->replaces != 0 && kvpd_pool_find_session(p, m->replaces, &old_index) != NULL) {
		drop_session(p, old_index, KVPD_GONE_GOODBYE, now_ms);
		p->counters.goodbyes++;
	}
	if (p->num_sessions >= p->limits.max_sessions) {
		kvpd_fail(c, KVP_EBUSY, "pool %s has %zu sessions, the limit", p->cfg.name,
		          p->num_sessions);
		kvpd_sink_refusal(c->sink, KVPD_REFUSED_SESSION_LIMIT, p->cfg.name, c->detail);
		return KVP_EBUSY;
	}
	if (p->num_sessions == p->cap_sessions) {
		size_t cap = p->cap_sessions ? p->cap_sessions * 2 : 8;
		struct kvpd_session **ns = realloc(p->sessions, cap * sizeof(*ns));
		if (ns == NULL)
			return kvpd_fail(c, KVP_ENOMEM, "out of memory");
		p->sessions = ns;
		p->cap_sessions = cap;
	}
	/* The operator's --lease-ms is the longest lease a client can have. */
	uint32_t lease = m->lease_ms ? m->lease_ms : p->limits.lease_ms;
	if (lease > p->limits.lease_ms)
		lease = p->limits.lease_ms;
	if (lease < 100)
		lease = 100;
	/* Everything that can fail before the session exists: a refusal leaves none. */
	const char *pod = m->vllm_pod ? m->vllm_pod : "";
	int slot = -1;
	if (pod[0] != '\0' && (slot = pod_slot(c, pod)) < 0)
		return c->status;
	if ((info = pool_info(c)) == NULL)
		return c->status;
	struct kvpd_session *s = kvpd_session_create(new_session_id(p), lease, m->client_name, now_ms);
	if (s != NULL)
		s->pool_held = &p->refs_held;
	if (s == NULL || kvpd_u64map_put(&p->session_index, s->id, p->num_sessions + 1) != KVP_OK) {
		kvpd_session_destroy(s);
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	}
	p->sessions[p->num_sessions++] = s;
	p->counters.sessions_opened++;
	if (slot >= 0) {
		snprintf(s->vllm_pod, sizeof(s->vllm_pod), "%s", pod);
		if ((size_t)slot == p->pods.n)
			snprintf(p->pods.pod[p->pods.n++].name, sizeof(p->pods.pod[0].name), "%s", pod);
		p->pods.pod[slot].sessions++;
	}
	r->session_id = s->id;
	r->lease_ms = lease;
	r->server_version = KVP_VERSION " (commit " KVP_GIT_COMMIT ")";
	r->pool = info;
	out->result_case = KVPOOL__V1__REPLY__RESULT_HELLO;
	out->hello = r;
	return KVP_OK;
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
static void
drop_session(struct kvpd_pool *p, size_t index, enum kvpd_gone_why why, uint64_t now_ms)
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
			drop_session(p, i, KVPD_GONE_EXPIRED, now_ms);
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

int
kvpd_h_heartbeat(struct call *c, const Kvpool__V1__HeartbeatRequest *m, Kvpool__V1__Reply *out)
{
	Kvpool__V1__HeartbeatReply *r =
		NEW(c, Kvpool__V1__HeartbeatReply, kvpool__v1__heartbeat_reply__descriptor);
	if (r == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	r->lease_ms = c->sess->lease_ms;
	if (m != NULL && m->with_pool_info && (r->pool = pool_info(c)) == NULL)
		return c->status;
	out->result_case = KVPOOL__V1__REPLY__RESULT_HEARTBEAT;
	out->heartbeat = r;
	return KVP_OK;
}

int
kvpd_h_goodbye(struct call *c, const Kvpool__V1__GoodbyeRequest *m, Kvpool__V1__Reply *out)
{
	Kvpool__V1__GoodbyeReply *r =
		NEW(c, Kvpool__V1__GoodbyeReply, kvpool__v1__goodbye_reply__descriptor);
	if (r == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	r->references_released = (uint32_t)c->sess->held;
	drop_session(c->p, c->sess_index, KVPD_GONE_GOODBYE, c->now_ms);
	c->sess = NULL;
	c->p->counters.goodbyes++;
	out->result_case = KVPOOL__V1__REPLY__RESULT_GOODBYE;
	out->goodbye = r;
	return KVP_OK;
}
