/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config.h: kvpoold's configuration from defaults, an optional config file,
 * KVPOOL_* environment variables and flags, in that order of precedence.
 *
 * Every setting has one name used three ways: the flag `--name`, the
 * variable `KVPOOL_NAME` (upper case, '-' -> '_') and the file line
 * `name = value`. `pool` may be given several times (flags, lines) or as a
 * ';'-separated list (variable). Not thread-safe; used once at start.
 */
#ifndef KVPD_CONFIG_H
#define KVPD_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/block_hash.h"
#include "common/group_spec.h"
#include "engine/pool.h"

#define KVPD_MAX_POOLS 16
#define KVPD_MAX_URLS 8
#define KVPD_NAME_MAX 128
#define KVPD_PATH_MAX 1024
#define KVPD_TOKEN_MAX 256

/*
 * A pool's executor (its KV memory). In a pool spec, unset fields ("" or 0,
 * device -1) take the global --executor / --device / --kv-* settings.
 */
struct kvpd_exec_settings {
	char backend[8];     /* none, cpu, cuda, auto */
	int32_t device;      /* CUDA device ordinal */
	uint32_t layers, heads, head_size;
	char dtype[8];       /* fp16, bf16, fp32 */
	char layout[8];      /* nhd, hnd */
	char memory[32];     /* budget: bytes (K/M/G/T suffixes) or a fraction like 0.9; "" none */
};

/*
 * Parses a memory budget: "" (none: *bytes = 0, *fraction = 0), a byte
 * count with an optional K, M, G or T suffix (powers of 1024), or a
 * fraction in (0, 1] of free device memory (cuda) or physical memory (cpu),
 * written with a '.'. 0 or -1.
 */
int kvpd_parse_memory(const char *s, uint64_t *bytes, double *fraction);
/* Physical memory in bytes, for a cpu executor's fractional budget; 0 if unknown. */
uint64_t kvpd_host_memory(void);

struct kvpd_pool_config {
	char name[KVPD_NAME_MAX];
	uint32_t num_blocks;
	uint32_t block_size;       /* tokens per executor block; default: the largest group's */
	uint32_t hash_block_size;  /* tokens per block hash; 0: block size (1 group), else GCD */
	bool caching;              /* prefix caching (vLLM's enable_prefix_caching) */
	uint32_t num_groups;       /* 0 until resolved: one full-attention group of block_size */
	struct kvp_group_spec groups[KVP_MAX_GROUPS];
	uint32_t max_model_len;
	enum kvp_vllm_semantics vllm; /* the vLLM whose BlockPool rules it keeps; default 0.33 */
	bool has_seed;
	char seed[KVPD_NAME_MAX];  /* NONE_HASH seed; absent: kvpd_pool_seed() */
	enum kvp_hash_algo hash_algo; /* vLLM's --prefix-caching-hash-algo; default sha256 */
	char token[KVPD_TOKEN_MAX]; /* empty: no auth token needed */
	char medium[16];           /* events' medium; empty: the executor's, or GPU without one */
	int32_t dp_rank;           /* vLLM wire: data-parallel rank; -1: the pool's position */
	char model[KVPD_NAME_MAX]; /* vLLM wire: {model} in the topic; empty: the pool's name */
	uint32_t shards;           /* slices per region row (tensor-parallel workers); 0: 1 */
	uint32_t session_refs;     /* references one session may hold; 0: half of max-refs */
	uint32_t session_rows;     /* region rows one session may reserve or lock; 0: half */
	bool clear_on_alloc;       /* clear=alloc: zero every block as it is handed out */
	bool restart_warm;         /* restart=warm: keep the region and its committed rows */
	char disk[256];            /* disk=PATH: the disk tier's file; empty: none */
	uint32_t disk_rows;        /* disk_rows=N: its slots, one row each */
	uint32_t cluster_wait_ms;  /* a missed key waits this long on the cluster tier; 0: none */
	uint32_t cluster_miss_ms;  /* a key the cluster lacks misses this long unasked */
	uint32_t cluster_wants;    /* keys waiting on the cluster tier at most */
	struct kvpd_exec_settings exec;
};

/*
 * The NONE_HASH seed of a pool's hasher: its seed setting; absent, vLLM
 * 0.33's default (resolve_none_hash_seed without PYTHONHASHSEED): the fixed
 * "vllm-none-hash" for the SHA-256 algorithms, NULL (random) for xxhash and
 * xxhash_cbor; absent with vllm=9aaf83ef5, NULL (random), as vLLM then.
 */
const char *kvpd_pool_seed(const struct kvpd_pool_config *p);
/* vLLM 0.33's fixed default seed (vLLM's DEFAULT_NONE_HASH_SEED). */
#define KVPD_DEFAULT_NONE_HASH_SEED "vllm-none-hash"

/* vLLM's ZMQ event wire (service/streams/vllm_pub.c), next to the native stream. */
struct kvpd_vllm_config {
	char endpoint[KVPD_PATH_MAX];  /* PUB; empty: off */
	char replay[KVPD_PATH_MAX];    /* ROUTER; empty: no replay */
	char replay_plain[KVPD_PATH_MAX]; /* a second ROUTER, replies without the topic frame */
	char topic[KVPD_PATH_MAX];     /* template: {pod} {model} {pool} {rank} */
	char pod[KVPD_NAME_MAX];       /* {pod}; empty: the host name */
	bool array_form;               /* events as arrays (vLLM < 0.26), not maps */
	bool hash_bytes;               /* hashes as bytes, not 64-bit ints */
	bool replay_topic;             /* replay replies carry the topic frame */
	uint32_t buffer_steps;         /* batches kept for replay */
	uint32_t buffer_mib;           /* and at most this many MiB of them */
	uint32_t hwm;                  /* send high-water mark */
	uint32_t replay_peer_mib;      /* replay bytes one peer may have unsent, in MiB */
	uint32_t replay_total_mib;     /* and every peer together */
	uint32_t queue_mib;            /* published batches subscribers may hold unread, per pool */
	bool token_pools;              /* also publish pools that have a token (no auth there) */
};

struct kvpd_config {
	char rpc[KVPD_MAX_URLS][KVPD_PATH_MAX];
	size_t num_rpc;
	char admin[KVPD_PATH_MAX];  /* http://host:port, or empty: no admin endpoint */
	char events[KVPD_PATH_MAX]; /* PUB endpoint for event batches, or empty: none */
	uint32_t replay_batches;    /* batches each pool keeps for Replay */
	uint32_t replay_mib;        /* and at most this many MiB of them */
	struct kvpd_vllm_config vllm;
	struct kvpd_pool_config pools[KVPD_MAX_POOLS];
	size_t num_pools;
	uint32_t lease_ms;         /* session lease without a call */
	uint32_t contexts;         /* concurrent REP contexts */
	uint32_t shm_channels;     /* same-host call channels beside an ipc endpoint; 0: none */
	uint32_t max_msg_bytes;
	uint32_t max_ids;          /* ids or tokens per call */
	uint32_t max_sessions;     /* per pool */
	uint32_t max_refs;         /* block references a pool's sessions hold in all; 0: auto */
	uint32_t max_session_requests; /* live requests one session may hold */
	uint32_t reply_cache_mib;  /* stored replies per pool, over its sessions */
	uint32_t drain_ms;         /* graceful shutdown budget */
	uint32_t send_timeout_ms;  /* a reply not taken within this closes its connection */
	uint32_t idle_timeout_ms;  /* a connection with no request this long is closed; 0: never */
	uint32_t deadline_skew_ms; /* a call read this long past its deadline is refused */
	uint32_t ipc_mode;         /* permission bits of the ipc:// sockets (and regions) it creates */
	char region_dir[KVPD_PATH_MAX]; /* cpu pools' regions go here; "auto", "none": see --help */
	char tls_cert[KVPD_PATH_MAX], tls_key[KVPD_PATH_MAX], tls_ca[KVPD_PATH_MAX];
	struct kvpd_exec_settings exec; /* every pool's defaults */
	bool quiet;
	int log_level;             /* enum kvpd_log_level */
	int log_format;            /* enum kvpd_log_format */
	bool token_in_argv;        /* --token on the command line: ps shows it */
	bool check_config;         /* --check-config: check, print, exit */
};

/*
 * Builds the configuration from argv and the environment. Returns 0 on
 * success, 1 if --help or --version was printed (to out), -1 on an error (a message
 * naming the setting was written to err). With --check-config (c->check_config)
 * it goes on past a problem and runs kvpd_cfg_check_more's checks, so err gets
 * every problem, then a count, and -1; 0 means the configuration is good.
 */
int kvpd_config_load(struct kvpd_config *c, int argc, char **argv, char **envp, FILE *out,
                     FILE *err);

/*
 * The log format (enum kvpd_log_format) the configuration asks for, read as
 * far as it parses (past its problems, as --check-config does), so that a
 * failed kvpd_config_load's messages can be logged in that format. Prints
 * nothing; KVPD_LOG_TEXT when nothing says otherwise or memory is short.
 */
int kvpd_config_log_format(int argc, char **argv, char **envp);

/* Prints the effective configuration, one `name = value` per line (tokens masked). */
void kvpd_config_print(const struct kvpd_config *c, FILE *out);

/* The --help text (also the reference deploy/ checks its manifests against). */
void kvpd_config_usage(FILE *out);

#endif /* KVPD_CONFIG_H */
