/* SPDX-License-Identifier: Apache-2.0 */
/* The vLLM wire's settings (vllm-*, and each pool's dp_rank/model): parsed and resolved here. */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "proto/vllm_wire.h"
#include "service/config/config.h"
#include "service/config/config_impl.h"

static int
parse_choice(const char *v, const char *no, const char *yes, bool *out)
{
	if (v != NULL && strcmp(v, no) == 0)
		*out = false;
	else if (v != NULL && strcmp(v, yes) == 0)
		*out = true;
	else
		return -1;
	return 0;
}

/* One vllm-* setting (name without the prefix). 0, -1 bad value, -2 unknown. */
int
kvpd_cfg_apply_vllm(struct kvpd_vllm_config *w, const char *name, const char *v)
{
	if (strcmp(name, "events") == 0)
		return kvpd_cfg_copy_str(w->endpoint, KVPD_PATH_MAX, v && strcmp(v, "none") == 0 ? "" : v);
	if (strcmp(name, "replay") == 0)
		return kvpd_cfg_copy_str(w->replay, KVPD_PATH_MAX, v && strcmp(v, "none") == 0 ? "" : v);
	if (strcmp(name, "replay-plain") == 0)
		return kvpd_cfg_copy_str(w->replay_plain, KVPD_PATH_MAX,
		                         v && strcmp(v, "none") == 0 ? "" : v);
	if (strcmp(name, "topic") == 0)
		return kvpd_cfg_copy_str(w->topic, KVPD_PATH_MAX, v);
	if (strcmp(name, "pod") == 0)
		return kvpd_cfg_copy_str(w->pod, KVPD_NAME_MAX, v);
	if (strcmp(name, "format") == 0)
		return parse_choice(v, "map", "array", &w->array_form);
	if (strcmp(name, "hashes") == 0)
		return parse_choice(v, "int", "bytes", &w->hash_bytes);
	if (strcmp(name, "replay-topic") == 0)
		return kvpd_cfg_parse_bool(v, &w->replay_topic);
	if (strcmp(name, "buffer-steps") == 0)
		return kvpd_cfg_parse_u32(v, 1, 1u << 24, &w->buffer_steps);
	if (strcmp(name, "buffer-mib") == 0)
		return kvpd_cfg_parse_u32(v, 1, 1u << 20, &w->buffer_mib);
	/* 0 is libzmq's "no limit": a subscriber that never reads could take all memory. */
	if (strcmp(name, "hwm") == 0)
		return kvpd_cfg_parse_u32(v, 1, 1u << 30, &w->hwm);
	if (strcmp(name, "queue-mib") == 0)
		return kvpd_cfg_parse_u32(v, 1, 1u << 16, &w->queue_mib);
	if (strcmp(name, "replay-peer-mib") == 0)
		return kvpd_cfg_parse_u32(v, 1, 1u << 16, &w->replay_peer_mib);
	if (strcmp(name, "replay-total-mib") == 0)
		return kvpd_cfg_parse_u32(v, 1, 1u << 16, &w->replay_total_mib);
	if (strcmp(name, "token-pools") == 0)
		return kvpd_cfg_parse_bool(v, &w->token_pools);
	return -2;
}

/*
 * The vLLM wire's per-pool rank, endpoints and topic, checked now so a bad
 * combination fails at start with the setting named, not at bind time.
 */
int
kvpd_cfg_resolve_vllm(struct kvpd_config *c, FILE *err)
{
	struct kvpd_vllm_config *w = &c->vllm;
	/* Per pool: its PUB, its replay ROUTER, its plain replay ROUTER. */
	static const char *const names[3] = {"vllm-events", "vllm-replay", "vllm-replay-plain"};
	const char *want[3] = {w->endpoint, w->replay, w->replay_plain};
	char eps[KVPD_MAX_POOLS][3][KVPD_PATH_MAX];

	if (w->endpoint[0] == '\0') {
		for (int k = 1; k < 3; k++)
			if (want[k][0] != '\0') {
				fprintf(err, "kvpoold: %s needs vllm-events\n", names[k]);
				return -1;
			}
		return 0;
	}
	if (w->replay_peer_mib > w->replay_total_mib) {
		fprintf(err, "kvpoold: vllm-replay-peer-mib %u is more than vllm-replay-total-mib "
		             "%u: one peer could never get what every peer together may not\n",
		        w->replay_peer_mib, w->replay_total_mib);
		return -1;
	}
	if (w->pod[0] == '\0' && gethostname(w->pod, sizeof(w->pod) - 1) != 0)
		snprintf(w->pod, sizeof(w->pod), "kvpoold");
	for (size_t i = 0; i < c->num_pools; i++) {
		struct kvpd_pool_config *p = &c->pools[i];
		char topic[KVPD_PATH_MAX];
		if (p->dp_rank < 0)
			p->dp_rank = (int32_t)i;
		if (p->model[0] == '\0')
			memcpy(p->model, p->name, sizeof(p->model));
		for (int k = 0; k < 3; k++) {
			const char *ep = want[k];
			if (ep[0] == '\0') {
				eps[i][k][0] = '\0';
				continue;
			}
			if (kvp_vllm_offset_endpoint(ep, (uint32_t)p->dp_rank, eps[i][k],
			                             KVPD_PATH_MAX) != 0) {
				fprintf(err, "kvpoold: pool %s: %s %s cannot be offset for dp_rank %d "
				             "(vLLM offsets tcp:// ports and inproc:// names only; give "
				             "each pool a dp_rank, or use tcp://)\n",
				        p->name, names[k], ep, p->dp_rank);
				return -1;
			}
			/* Any earlier pool's socket of any kind, and this pool's earlier ones. */
			for (size_t j = 0; j <= i; j++)
				for (int kj = 0; kj < 3; kj++) {
					if ((j == i && kj >= k) || strcmp(eps[j][kj], eps[i][k]) != 0 ||
					    (kj == 0 && k == 0 && !kvp_vllm_binds(eps[i][k])))
						continue;
					if (j == i) {
						fprintf(err, "kvpoold: pool %s: %s and %s would both bind "
						             "%s\n", p->name, names[kj], names[k], eps[i][k]);
						return -1;
					}
					fprintf(err, "kvpoold: pools %s and %s would both bind %s: give them "
					             "different dp_rank values, or vllm-events and vllm-replay "
					             "ports further apart\n",
					        c->pools[j].name, p->name, eps[i][k]);
					return -1;
				}
		}
		if (kvp_vllm_topic(w->topic, w->pod, p->model, p->name, (uint32_t)p->dp_rank, topic,
		                   sizeof(topic)) != 0) {
			fprintf(err, "kvpoold: vllm-topic '%s': only {pod}, {model}, {pool} and {rank} "
			             "can be filled in, and the topic must fit %d bytes\n",
			        w->topic, KVPD_PATH_MAX - 1);
			return -1;
		}
	}
	return 0;
}
