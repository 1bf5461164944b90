/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config_settings.c: kvpoold's settings table, the one source of --help,
 * the KVPOOL_* variables and the names a flag or a config file line may use.
 */
#include "service/config/config_impl.h"
#include "proto/wire.h"

#include <ctype.h>
#include <string.h>

/* The settings, in --help order. */
const struct kvpd_setting kvpd_settings[] = {
	{"rpc", "URL", "RPC endpoint to listen on; repeatable (ipc://, tcp://, tls+tcp://). "
	               "Default " KVP_DEFAULT_RPC_URL},
	{"pool", "SPEC", "a pool to host; repeatable. SPEC is NAME:BLOCKS[:BLOCK_SIZE] or "
	                 "key=value pairs: name, blocks, groups (KV cache groups joined by '+': "
	                 "full:BS, sliding_window:BS:WINDOW, chunked_local:BS:CHUNK, "
	                 "mamba:BS[:align|all|none]; default one full:BLOCK_SIZE), "
	                 "hash_block_size (one group: its block size; several: their GCD), "
	                 "caching (on; off: no prefix caching), "
	                 "block_size (16, or the largest group's), max_model_len (8192), "
	                 "vllm (the vLLM whose BlockPool rules the pool keeps: 0.33, or 9aaf83ef5 "
	                 "for free order, coarse-block keys and seed as at that 2025 commit), "
	                 "seed (NONE_HASH seed, PYTHONHASHSEED's role; absent: vLLM 0.33's "
	                 "vllm-none-hash, random for xxhash or vllm=9aaf83ef5), hash_algo (sha256, "
	                 "vLLM's default: pickle bytes; or sha256_cbor; xxhash, xxhash_cbor: "
	                 "16-byte hashes), token_file, medium (events' medium; default the "
	                 "executor's, GPU without one), dp_rank and model (vLLM wire; default the "
	                 "pool's position and name), shards (slices per shared-region row, one per "
	                 "tensor-parallel worker; default 1), session_refs and session_rows (a "
	                 "session's quota: references it may hold, blocks allocated or touched and "
	                 "rows reserved or locked, default half of max-refs; and shared-region rows "
	                 "it may hold reserved or locked, default half the pool's; past either: "
	                 "QUOTA_EXCEEDED, so no one session can take a pool), "
	                 "cluster_wait_ms (a region pool under a cluster tier, docs/cluster.md: "
	                 "how long a lookup answers a missed key pending while the tier's agent "
	                 "fills it; default 0: no cluster tier), cluster_miss_ms (how long a key "
	                 "the cluster lacks then misses unasked; 1000), cluster_wants (keys "
	                 "waiting at most; 4096), "
	                 "clear (alloc: zero each block's bytes "
	                 "as it is handed out, so no tenant reads the KV of the block's last user; "
	                 "default none: freed and evicted blocks keep their bytes, as in vLLM; "
	                 "needs an executor), restart (warm: the shared region and its "
	                 "committed rows outlive kvpoold, so a restart on the same settings "
	                 "serves them again, each checked against its CRC32C "
	                 "(docs/operations.md); default cold: a start is empty; warm needs "
	                 "a region, so executor cpu, caching on and a region-dir), "
	                 "disk and disk_rows (a disk tier below the region: an absolute file "
	                 "path and its size in rows; committed rows are written behind and a "
	                 "lookup that misses a row the disk holds answers pending while it is "
	                 "read back and checked, docs/operations.md; needs a region; beside "
	                 "cluster_wait_ms the cluster tier fills what the disk lacks; "
	                 "--check-config checks its directory and room), "
	                 "and the executor's executor, device, "
	                 "layers, "
	                 "heads, head_size, dtype, layout, memory (default: the global settings "
	                 "below). blocks may be left out when a memory budget sizes the pool. "
	                 "Default " KVPD_DEFAULT_POOL},
	{"admin", "URL", "HTTP admin endpoint for /healthz, /readyz and /metrics, or 'none'. "
	                 "Default " KVP_DEFAULT_ADMIN_URL},
	{"events", "URL", "PUB endpoint for the pools' event batches (ipc://, tcp://, tls+tcp://), "
	                  "or 'none' (with vllm-events none too, pools record no events and Replay "
	                  "answers NOT_SUPPORTED). Default ipc:///tmp/kvpool-events.ipc"},
	{"replay-batches", "N", "event batches each pool keeps for Replay. Default 10000"},
	{"replay-mib", "N", "MiB of event batches each pool keeps for Replay at most (the oldest "
	                    "go first; the newest batch is always kept). Default 64"},
	{"vllm-events", "URL", "also publish vLLM's ZMQ event wire (PUB) for llm-d, Dynamo and "
	                       "vLLM's subscribers, or 'none'. Binds if URL has * or :: or is "
	                       "ipc://, else connects (to a centralised subscriber). A pool with "
	                       "dp_rank r > 0 adds r to a tcp port. Default none"},
	{"vllm-replay", "URL", "ROUTER endpoint serving vLLM-wire replays (always binds; offset "
	                       "by dp_rank like vllm-events), or 'none'. Default none"},
	{"vllm-topic", "TEMPLATE", "vLLM-wire topic frame; {pod}, {model}, {pool} and {rank} are "
	                           "filled in. Default kv@{pod}@{model} (llm-d's form)"},
	{"vllm-pod", "NAME", "fills {pod} in vllm-topic. Default: the host name"},
	{"vllm-format", "FORM", "vLLM-wire events as map (vLLM 0.26 on) or array (earlier vLLM, "
	                        "spec F5). Default map"},
	{"vllm-hashes", "FORM", "vLLM-wire hashes as int (low 64 bits, vLLM's default) or bytes. "
	                        "Default int"},
	{"vllm-replay-topic", "BOOL", "1: replay replies carry the topic frame (vLLM 0.26, "
	                              "llm-d); 0: they do not (Dynamo's listener). Default 1"},
	{"vllm-replay-plain", "URL", "a second ROUTER replay endpoint, whose replies never carry "
	                             "the topic frame (Dynamo's listener), beside vllm-replay's "
	                             "(llm-d's): one daemon serves both. Offset by dp_rank like "
	                             "vllm-replay. Default none"},
	{"vllm-buffer-steps", "N", "vLLM-wire batches each pool keeps for replay. Default 10000"},
	{"vllm-buffer-mib", "N", "MiB of vLLM-wire batches each pool keeps for replay at most "
	                         "(as replay-mib). Default 64"},
	{"vllm-hwm", "N", "vLLM-wire send high-water mark, in messages, 1 or more (0, libzmq's "
	                  "unlimited, is refused). Default 10000"},
	{"vllm-queue-mib", "N", "MiB of published batches a pool's subscribers may hold unread "
	                        "(libzmq keeps what a subscriber has not taken, up to vllm-hwm "
	                        "messages each): past it the publisher is opened again, dropping "
	                        "every queue; subscribers reconnect and replay the gap. Default 64"},
	{"vllm-replay-peer-mib", "N", "MiB of replay batches one peer may have sent to it and "
	                              "not yet taken: a replay pauses there until the peer reads "
	                              "(one that does not for 30 s is cut off). Default 4"},
	{"vllm-replay-total-mib", "N", "MiB of replay batches all peers together may have unsent "
	                               "(at least vllm-replay-peer-mib; at most 64 replays run "
	                               "at once). Default 64"},
	{"vllm-token-pools", "BOOL", "1: also publish pools that have a token on the vLLM wire, "
	                             "which has no authentication (anyone who reaches its port "
	                             "reads their events). Default 0: such pools stay off it"},
	{"token-file", "PATH", "auth token for pools without their own (file content, trimmed)"},
	{"token", "TOKEN", "auth token for pools without their own (prefer token-file)"},
	{"lease-ms", "MS", "session lease: a session with no call for this long is ended and its "
	                   "blocks released; also the longest lease a client may ask for. Default 30000"},
	{"contexts", "N", "requests served concurrently. Default 8"},
	{"shm-channels", "N", "same-host call channels: beside the first ipc:// endpoint PATH, "
	                      "PATH.shm hands a client a shared-memory channel with a thread of "
	                      "its own, for calls at memory speed (docs/service.md); at most N at "
	                      "once, the rest keep nng ipc; 0: none. Default 64"},
	{"max-msg-bytes", "N", "largest request accepted, in bytes. Default 8388608"},
	{"max-ids", "N", "most block ids or tokens in one call. Default 65536"},
	{"max-sessions", "N", "most sessions per pool. Default 1024"},
	{"max-refs", "N", "most block references a pool's sessions hold in all (one per block an "
	                  "Allocate or Touch names; past it: BUSY); 4-16 bytes each. 0: 16 per "
	                  "block of the pool, at least 1048576. Default 0"},
	{"max-session-requests", "N", "most live requests (AllocateSlots) one session may hold, so "
	                              "one scheduler cannot take a pool's every request slot. "
	                              "Default 4096"},
	{"reply-cache-mib", "N", "MiB of stored replies (kept so a retried call is answered, not "
	                         "applied twice) per pool, over all its sessions; the oldest go "
	                         "first. Default 64"},
	{"ipc-mode", "MODE", "permissions of the ipc:// sockets kvpoold creates, in octal; a path "
	                     "another user owns is refused. Default 0600 (its own user only); 0660 "
	                     "lets its group connect"},
	{"drain-ms", "MS", "on SIGTERM, time allowed for in-flight calls. Default 5000"},
	{"send-timeout-ms", "MS", "a reply its peer has not taken within this long closes that "
	                          "connection, so a peer that does not read cannot hold the "
	                          "request contexts. Default 5000"},
	{"idle-timeout-ms", "MS", "a connection that sends no request for this long is closed (nng "
	                          "clients redial by themselves on their next call), so silent peers "
	                          "cannot hold connections open; 0: never. Default 300000"},
	{"deadline-skew-ms", "MS", "a call the daemon reads more than this long after the deadline "
	                           "its client set (a stall, a request that waited) is answered "
	                           "DEADLINE_EXCEEDED and never applied; this much is allowed for "
	                           "clocks that disagree (ipc:// peers share the daemon's). "
	                           "Default 1000"},
	{"executor", "KIND", "each pool's KV memory: cpu (host memory), cuda, auto (cuda if a device "
	                     "is usable, else cpu) or none (bookkeeping only). Default cpu"},
	{"device", "N", "CUDA device ordinal for cuda and auto. Default 0"},
	{"kv-layers", "N", "layers of KV per block. Default 2"},
	{"kv-heads", "N", "KV heads. Default 2"},
	{"kv-head-size", "N", "head size. Default 64"},
	{"kv-dtype", "TYPE", "fp16, bf16 or fp32. Default fp16"},
	{"kv-layout", "L", "nhd ([blocks, block_size, heads, head_size], vLLM's flash layout) or "
	                   "hnd. Default nhd"},
	{"region-dir", "DIR", "where a cpu pool's KV memory becomes a shared region: a file made "
	                      "there (mode ipc-mode) that same-host clients map to write and read "
	                      "rows in place (Reserve/Commit, LookupAndLock). A tmpfs such as "
	                      "/dev/shm, or a hugetlbfs mount for huge pages; every byte is "
	                      "allocated at start, and a directory without room fails the start. "
	                      "'auto': /dev/shm when it has room for the pool and kvpoold may write "
	                      "there, else private memory "
	                      "(the log says which); 'none': private memory, no region. Default "
	                      "auto"},
	{"kv-memory", "SIZE", "memory budget that sizes pools given without blocks: bytes (K, M, G, "
	                      "T suffixes) or a fraction of free device (cuda) or physical (cpu) "
	                      "memory such as 0.9"},
	{"tls-cert", "PATH", "PEM certificate for tls+tcp:// endpoints"},
	{"tls-key", "PATH", "PEM private key for tls+tcp:// endpoints"},
	{"tls-ca", "PATH", "PEM CA bundle: when set, clients must present a certificate it signs"},
	{"config", "PATH", "read settings from a file of `name = value` lines (# comments)"},
	{"log-level", "LEVEL", "least level logged: debug, info, warn or error. Default info"},
	{"log-format", "FORM", "log lines as text or json (one object a line, for log pipelines). "
	                       "Default text"},
	{"quiet", NULL, "do not log the effective configuration at start"},
	{"check-config", NULL, "check flags, environment and config file (pools, groups, memory "
	                       "budget, TLS files, endpoints) without binding or allocating; print "
	                       "every problem and exit 2, or the configuration and exit 0"},
	{"help", NULL, "print this help"},
	{"version", NULL, "print the version and the commit it was built from"},
};

const size_t kvpd_num_settings = sizeof(kvpd_settings) / sizeof(kvpd_settings[0]);

bool
kvpd_cfg_is_setting(const char *name)
{
	return strcmp(name, "help") != 0 && strcmp(name, "version") != 0 &&
	       strcmp(name, "check-config") != 0;
}

void
kvpd_cfg_env_name(const char *setting, char *var, size_t cap)
{
	size_t k = (size_t)snprintf(var, cap, "KVPOOL_");
	for (const char *q = setting; *q && k < cap - 1; q++)
		var[k++] = *q == '-' ? '_' : (char)toupper((unsigned char)*q);
	var[k] = '\0';
}

void
kvpd_config_usage(FILE *out)
{
	fprintf(out, "usage: kvpoold [--setting value]...\n\n"
	             "kvpoold serves vLLM-compatible KV-cache block pools over nng.\n"
	             "Each setting can also come from the environment variable KVPOOL_<NAME>\n"
	             "(upper case, '-' as '_'; several pools separated by ';') or a config file.\n"
	             "Precedence: flags, then environment, then config file, then defaults.\n\n");
	for (size_t i = 0; i < kvpd_num_settings; i++) {
		char lhs[64];
		snprintf(lhs, sizeof(lhs), "--%s%s%s", kvpd_settings[i].name, kvpd_settings[i].arg ? " " : "",
		         kvpd_settings[i].arg ? kvpd_settings[i].arg : "");
		fprintf(out, "  %-24s %s\n", lhs, kvpd_settings[i].help);
	}
	/* The variables, from the same table: one per setting, none for the actions. */
	fprintf(out, "\nEnvironment:");
	size_t col = 12;
	for (size_t i = 0; i < kvpd_num_settings; i++) {
		char var[64];
		if (!kvpd_cfg_is_setting(kvpd_settings[i].name))
			continue;
		kvpd_cfg_env_name(kvpd_settings[i].name, var, sizeof(var));
		if (col + strlen(var) + 2 > 100) {
			fprintf(out, "\n ");
			col = 1;
		}
		col += (size_t)fprintf(out, " %s", var);
	}
	fprintf(out, "\n");
}

bool
kvpd_cfg_known(const char *name)
{
	for (size_t i = 0; i < kvpd_num_settings; i++)
		if (strcmp(kvpd_settings[i].name, name) == 0)
			return true;
	return false;
}

bool
kvpd_cfg_takes_arg(const char *name)
{
	for (size_t i = 0; i < kvpd_num_settings; i++)
		if (strcmp(kvpd_settings[i].name, name) == 0)
			return kvpd_settings[i].arg != NULL;
	return true;
}
