/* SPDX-License-Identifier: Apache-2.0 */
/* The effective configuration, one `name = value` line per setting (tokens masked). */
#include <stdio.h>

#include "common/block_hash.h"
#include "common/group_spec.h"
#include "service/config/config.h"

void
kvpd_config_print(const struct kvpd_config *c, FILE *out)
{
	for (size_t i = 0; i < c->num_rpc; i++)
		fprintf(out, "rpc = %s\n", c->rpc[i]);
	for (size_t i = 0; i < c->num_pools; i++) {
		const struct kvpd_pool_config *p = &c->pools[i];
		const struct kvpd_exec_settings *x = &p->exec;
		char blocks[32], groups[256];
		snprintf(blocks, sizeof(blocks), "%u", p->num_blocks);
		if (kvp_group_specs_format(p->groups, p->num_groups, groups, sizeof(groups)) != 0)
			snprintf(groups, sizeof(groups), "(%u groups)", p->num_groups);
		fprintf(out, "pool = name=%s,blocks=%s,groups=%s,hash_block_size=%u,caching=%s,"
		             "block_size=%u,max_model_len=%u,medium=%s,vllm=%s,seed=%s,hash_algo=%s,"
		             "dp_rank=%d,model=%s,token=%s,executor=%s,device=%d,layers=%u,heads=%u,head_size=%u,dtype=%s,"
		             "layout=%s,memory=%s,shards=%u,session_refs=%u,session_rows=%u,clear=%s,restart=%s,disk=%s,disk_rows=%u,"
		             "cluster_wait_ms=%u,cluster_miss_ms=%u,cluster_wants=%u\n",
		        p->name, p->num_blocks ? blocks : "(from memory)", groups, p->hash_block_size,
		        p->caching ? "on" : "off", p->block_size,
		        p->max_model_len, p->medium[0] ? p->medium : "(the executor's, or GPU)",
		        kvp_vllm_semantics_name(p->vllm),
		        kvpd_pool_seed(p) ? kvpd_pool_seed(p) : "(random)",
		        kvp_hash_algo_name(p->hash_algo),
		        p->dp_rank < 0 ? (int)i : p->dp_rank, p->model[0] ? p->model : p->name,
		        p->token[0] ? "(set)" : "(none)", x->backend, x->device, x->layers, x->heads,
		        x->head_size, x->dtype, x->layout, x->memory[0] ? x->memory : "(none)",
		        p->shards ? p->shards : 1, p->session_refs, p->session_rows, p->clear_on_alloc ? "alloc" : "none",
		        p->restart_warm ? "warm" : "cold", p->disk[0] ? p->disk : "none",
		        p->disk_rows,
		        p->cluster_wait_ms, p->cluster_miss_ms, p->cluster_wants);
	}
	fprintf(out, "admin = %s\n", c->admin[0] ? c->admin : "none");
	fprintf(out, "events = %s\nreplay-batches = %u\nreplay-mib = %u\n",
	        c->events[0] ? c->events : "none", c->replay_batches, c->replay_mib);
	if (c->vllm.endpoint[0]) {
		const struct kvpd_vllm_config *w = &c->vllm;
		fprintf(out, "vllm-events = %s\nvllm-replay = %s\nvllm-topic = %s\nvllm-pod = %s\n"
		             "vllm-format = %s\nvllm-hashes = %s\nvllm-replay-topic = %d\n"
		             "vllm-buffer-steps = %u\nvllm-buffer-mib = %u\nvllm-hwm = %u\nvllm-token-pools = %d\n",
		        w->endpoint, w->replay[0] ? w->replay : "none", w->topic, w->pod,
		        w->array_form ? "array" : "map", w->hash_bytes ? "bytes" : "int",
		        w->replay_topic, w->buffer_steps, w->buffer_mib, w->hwm, w->token_pools);
		fprintf(out, "vllm-replay-plain = %s\n", w->replay_plain[0] ? w->replay_plain : "none");
		fprintf(out, "vllm-replay-peer-mib = %u\nvllm-replay-total-mib = %u\n"
		             "vllm-queue-mib = %u\n",
		        w->replay_peer_mib, w->replay_total_mib, w->queue_mib);
	} else {
		fprintf(out, "vllm-events = none\n");
	}
	fprintf(out, "lease-ms = %u\ncontexts = %u\nmax-msg-bytes = %u\nmax-ids = %u\n"
	             "max-sessions = %u\ndrain-ms = %u\nsend-timeout-ms = %u\nidle-timeout-ms = %u\n"
	             "deadline-skew-ms = %u\n",
	        c->lease_ms, c->contexts, c->max_msg_bytes, c->max_ids, c->max_sessions, c->drain_ms,
	        c->send_timeout_ms, c->idle_timeout_ms, c->deadline_skew_ms);
	fprintf(out, "max-refs = %u\nmax-session-requests = %u\nreply-cache-mib = %u\n",
	        c->max_refs, c->max_session_requests, c->reply_cache_mib);
	fprintf(out, "shm-channels = %u\n", c->shm_channels);
	fprintf(out, "ipc-mode = %04o\nregion-dir = %s\n", (unsigned)c->ipc_mode, c->region_dir);
	fprintf(out, "executor = %s\ndevice = %d\nkv-layers = %u\nkv-heads = %u\nkv-head-size = %u\n"
	             "kv-dtype = %s\nkv-layout = %s\nkv-memory = %s\n",
	        c->exec.backend, c->exec.device, c->exec.layers, c->exec.heads, c->exec.head_size,
	        c->exec.dtype, c->exec.layout, c->exec.memory[0] ? c->exec.memory : "none");
	if (c->tls_cert[0])
		fprintf(out, "tls-cert = %s\ntls-key = %s\ntls-ca = %s\n", c->tls_cert, c->tls_key,
		        c->tls_ca[0] ? c->tls_ca : "(none: clients are not verified)");
	fflush(out);
}
