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
		kvpd_pool_drop_session(p, old_index, KVPD_GONE_GOODBYE, now_ms);
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
	kvpd_pool_drop_session(c->p, c->sess_index, KVPD_GONE_GOODBYE, c->now_ms);
	c->sess = NULL;
	c->p->counters.goodbyes++;
	out->result_case = KVPOOL__V1__REPLY__RESULT_GOODBYE;
	out->goodbye = r;
	return KVP_OK;
}
