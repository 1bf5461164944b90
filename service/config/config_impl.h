/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config_impl.h: what config.c shares with its parts (config_*.c).
 * Internal to the daemon's configuration; used once at start.
 */
#ifndef KVPD_CONFIG_IMPL_H
#define KVPD_CONFIG_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "service/config/config.h"

/* The pool a daemon hosts when no source names one. */
#define KVPD_DEFAULT_POOL "name=default,blocks=4096,block_size=16"

/* The settings, in --help order (config_settings.c): the one source of
 * --help, the KVPOOL_* variables and the names flags and files may use. */
struct kvpd_setting {
	const char *name;
	const char *arg;  /* NULL: a switch, taking no value */
	const char *help;
};
extern const struct kvpd_setting kvpd_settings[];
extern const size_t kvpd_num_settings;
/* --help, --version and --check-config are actions: no variable, no file line. */
bool kvpd_cfg_is_setting(const char *name);
/* KVPOOL_<NAME> into var: upper case, '-' as '_'. */
void kvpd_cfg_env_name(const char *setting, char *var, size_t cap);
/* Whether name is a setting or an action. */
bool kvpd_cfg_known(const char *name);
/* Whether name takes a value (true for an unknown name). */
bool kvpd_cfg_takes_arg(const char *name);

/* A decimal in [min, max] into *out: 0, or -1 (nothing written). */
int kvpd_cfg_parse_u32(const char *v, uint32_t min, uint32_t max, uint32_t *out);
/* 1, true, on / 0, false, off into *out: 0, or -1 (nothing written). */
int kvpd_cfg_parse_bool(const char *v, bool *out);
/* Copies v if it fits cap with its NUL: 0, or -1 (nothing written). */
int kvpd_cfg_copy_str(char *dst, size_t cap, const char *v);

/* Fills a pool's unset executor settings from the globals and checks them: 0, or -1 after printing. */
int kvpd_cfg_resolve_exec(const struct kvpd_config *c, struct kvpd_pool_config *p, FILE *err);

/*
 * Parses one pool spec (NAME:BLOCKS[:BLOCK_SIZE] or key=value items) into
 * *out, defaults filled: 0, or -1 after printing why (*out unchanged).
 */
int kvpd_cfg_parse_pool(const char *spec, struct kvpd_pool_config *out, FILE *err);
/*
 * One executor item (executor, device, layers, heads, head_size, dtype,
 * layout, memory) into e, for a pool spec and the global kv-* settings
 * alike: 0, -1 bad value, -2 not an executor item.
 */
int kvpd_cfg_exec_item(struct kvpd_exec_settings *e, const char *k, const char *v);
/* Reads a token file (trailing whitespace dropped) into dst: 0, or -1 after printing why. */
int kvpd_cfg_read_token(const char *path, char *dst, FILE *err);
int kvpd_cfg_take_token(const char *src, size_t n, const char *what, char *dst, FILE *err);

/* One groups= value of a pool spec: 0, or -1 after printing why. */
int kvpd_cfg_parse_groups(struct kvpd_pool_config *p, const char *v, FILE *err);
/*
 * A pool's groups, hash block size and block size after every source
 * (defaults as vLLM resolves them), checked as vLLM's coordinators assert
 * them: 0, or -1 after printing why.
 */
int kvpd_cfg_resolve_groups(struct kvpd_pool_config *p, FILE *err);

/* One vllm-* setting (name without the prefix): 0, -1 bad value, -2 unknown name. */
int kvpd_cfg_apply_vllm(struct kvpd_vllm_config *w, const char *name, const char *v);
/*
 * After every source: each pool's dp_rank and model, the offset endpoints
 * (no two sockets on one address) and the topic, checked. 0, or -1 after
 * printing why to err.
 */
int kvpd_cfg_resolve_vllm(struct kvpd_config *c, FILE *err);

/*
 * --check-config's checks past parsing (config_check.c): TLS files readable,
 * endpoints parse with a scheme kvpoold serves and an ipc directory that
 * exists, pools' KV memory within this machine's. Prints each problem;
 * returns how many. Binds nothing, allocates no pool memory.
 */
unsigned kvpd_cfg_check_more(const struct kvpd_config *c, FILE *err);

/*
 * The daemon's TLS server configuration from tls-cert, tls-key and tls-ca
 * (tls_config.c): 0 and *out (free with nng_tls_config_free), or -1 with
 * why in err. The transport and --check-config both build it, so a
 * certificate the daemon would refuse is refused by the check.
 */
struct nng_tls_config;
int kvpd_tls_server_config(const struct kvpd_config *cfg, struct nng_tls_config **out, char *err,
                           size_t len);

#endif /* KVPD_CONFIG_IMPL_H */
