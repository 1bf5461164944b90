/* SPDX-License-Identifier: Apache-2.0 */
#define _POSIX_C_SOURCE 200809L

#include "service/config/config.h"
#include "service/config/config_impl.h"
#include "service/log.h"
#include "common/kvp_status.h"
#include "common/kvp_version.h"
#include "gpu/executor.h"
#include "proto/wire.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct state {
	bool pools_replaced; /* the first pool from a higher source drops earlier ones */
	bool rpc_replaced;
	char global_token[KVPD_TOKEN_MAX];
	bool has_global_token;
	bool check;        /* --check-config: go on past problems, counting them */
	unsigned problems;
	FILE *err;
};

/* Adds one pool spec; the first from a source replaces the pools of lower ones. */
static int
add_pool(struct kvpd_config *c, const char *spec, struct state *st)
{
	struct kvpd_pool_config p;

	if (kvpd_cfg_parse_pool(spec, &p, st->err) != 0)
		return -1;
	if (!st->pools_replaced) {
		c->num_pools = 0;
		st->pools_replaced = true;
	}
	for (size_t i = 0; i < c->num_pools; i++)
		if (strcmp(c->pools[i].name, p.name) == 0) {
			fprintf(st->err, "kvpoold: pool %s is defined twice\n", p.name);
			return -1;
		}
	if (c->num_pools == KVPD_MAX_POOLS) {
		fprintf(st->err, "kvpoold: at most %d pools\n", KVPD_MAX_POOLS);
		return -1;
	}
	c->pools[c->num_pools++] = p;
	return 0;
}

/* The executor's global settings (the pool spec's executor items, named for the command line). */
static int
apply_exec(struct kvpd_exec_settings *e, const char *name, const char *v)
{
	static const char *const names[][2] = {
		{"executor", "executor"}, {"device", "device"},         {"kv-layers", "layers"},
		{"kv-heads", "heads"},     {"kv-head-size", "head_size"}, {"kv-dtype", "dtype"},
		{"kv-layout", "layout"},   {"kv-memory", "memory"},
	};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (strcmp(name, names[i][0]) == 0) {
			if (strcmp(name, "kv-memory") == 0 && v && strcmp(v, "none") == 0)
				v = "";
			return kvpd_cfg_exec_item(e, names[i][1], v);
		}
	return -2;
}

/* Applies one setting. Returns 0, or -1 after printing why. */
static int
apply(struct kvpd_config *c, const char *name, const char *v, struct state *st, FILE *err)
{
	int rv = -1;

	if (strcmp(name, "rpc") == 0) {
		if (!st->rpc_replaced) {
			c->num_rpc = 0;
			st->rpc_replaced = true;
		}
		if (c->num_rpc < KVPD_MAX_URLS)
			rv = kvpd_cfg_copy_str(c->rpc[c->num_rpc++], KVPD_PATH_MAX, v);
	} else if (strcmp(name, "pool") == 0) {
		return add_pool(c, v, st);
	} else if (strcmp(name, "admin") == 0) {
		rv = kvpd_cfg_copy_str(c->admin, KVPD_PATH_MAX, v && strcmp(v, "none") == 0 ? "" : v);
	} else if (strcmp(name, "events") == 0) {
		rv = kvpd_cfg_copy_str(c->events, KVPD_PATH_MAX, v && strcmp(v, "none") == 0 ? "" : v);
	} else if (strcmp(name, "replay-batches") == 0) {
		rv = kvpd_cfg_parse_u32(v, 1, 1u << 24, &c->replay_batches);
	} else if (strcmp(name, "replay-mib") == 0) {
		rv = kvpd_cfg_parse_u32(v, 1, 1u << 20, &c->replay_mib);
	} else if (strncmp(name, "vllm-", 5) == 0) {
		rv = kvpd_cfg_apply_vllm(&c->vllm, name + 5, v);
		if (rv == -2) {
			fprintf(err, "kvpoold: unknown setting '%s' (see --help)\n", name);
			return -1;
		}
	} else if (strcmp(name, "token-file") == 0) {
		rv = kvpd_cfg_read_token(v, st->global_token, err);
		st->has_global_token = rv == 0;
		if (rv != 0)
			return -1;
	} else if (strcmp(name, "token") == 0) {
		/* Its own message, which never echoes the value. */
		rv = kvpd_cfg_take_token(v ? v : "", v ? strlen(v) : 0, "token", st->global_token, err);
		st->has_global_token = rv == 0;
		if (rv != 0)
			return -1;
	} else if (strcmp(name, "lease-ms") == 0) {
		rv = kvpd_cfg_parse_u32(v, 100, 86400000u, &c->lease_ms);
	} else if (strcmp(name, "contexts") == 0) {
		rv = kvpd_cfg_parse_u32(v, 1, 256, &c->contexts);
	} else if (strcmp(name, "shm-channels") == 0) {
		rv = kvpd_cfg_parse_u32(v, 0, 4096, &c->shm_channels);
	} else if (strcmp(name, "max-msg-bytes") == 0) {
		rv = kvpd_cfg_parse_u32(v, 4096, 1u << 30, &c->max_msg_bytes);
	} else if (strcmp(name, "max-ids") == 0) {
		rv = kvpd_cfg_parse_u32(v, 1, 1u << 24, &c->max_ids);
	} else if (strcmp(name, "max-sessions") == 0) {
		rv = kvpd_cfg_parse_u32(v, 1, 1u << 20, &c->max_sessions);
	} else if (strcmp(name, "max-refs") == 0) {
		rv = kvpd_cfg_parse_u32(v, 0, 1u << 30, &c->max_refs);
	} else if (strcmp(name, "max-session-requests") == 0) {
		rv = kvpd_cfg_parse_u32(v, 1, 1u << 20, &c->max_session_requests);
	} else if (strcmp(name, "reply-cache-mib") == 0) {
		rv = kvpd_cfg_parse_u32(v, 1, 1u << 16, &c->reply_cache_mib);
	} else if (strcmp(name, "ipc-mode") == 0) {
		char *end = NULL;
		unsigned long m = v ? strtoul(v, &end, 8) : 0;
		rv = v == NULL || *v == '\0' || *end != '\0' || m > 0777 || (m & 0600) != 0600 ? -1 : 0;
		if (rv == 0)
			c->ipc_mode = (uint32_t)m;
	} else if (strcmp(name, "region-dir") == 0) {
		rv = v == NULL || v[0] == '\0' ? -1 : kvpd_cfg_copy_str(c->region_dir, sizeof(c->region_dir), v);
	} else if (strcmp(name, "drain-ms") == 0) {
		rv = kvpd_cfg_parse_u32(v, 0, 600000, &c->drain_ms);
	} else if (strcmp(name, "send-timeout-ms") == 0) {
		rv = kvpd_cfg_parse_u32(v, 10, 600000, &c->send_timeout_ms);
	} else if (strcmp(name, "idle-timeout-ms") == 0) {
		rv = kvpd_cfg_parse_u32(v, 0, 86400000, &c->idle_timeout_ms);
	} else if (strcmp(name, "deadline-skew-ms") == 0) {
		rv = kvpd_cfg_parse_u32(v, 0, 600000, &c->deadline_skew_ms);
	} else if (strcmp(name, "tls-cert") == 0) {
		rv = kvpd_cfg_copy_str(c->tls_cert, KVPD_PATH_MAX, v);
	} else if (strcmp(name, "tls-key") == 0) {
		rv = kvpd_cfg_copy_str(c->tls_key, KVPD_PATH_MAX, v);
	} else if (strcmp(name, "tls-ca") == 0) {
		rv = kvpd_cfg_copy_str(c->tls_ca, KVPD_PATH_MAX, v);
	} else if (strcmp(name, "log-level") == 0) {
		int l = kvpd_log_level_parse(v);
		if ((rv = l < 0 ? -1 : 0) == 0)
			c->log_level = l;
	} else if (strcmp(name, "log-format") == 0) {
		int f = kvpd_log_format_parse(v);
		if ((rv = f < 0 ? -1 : 0) == 0)
			c->log_format = f;
	} else if (strcmp(name, "quiet") == 0) {
		c->quiet = v == NULL || strcmp(v, "0") != 0;
		rv = 0;
	} else if ((rv = apply_exec(&c->exec, name, v)) == -2) {
		fprintf(err, "kvpoold: unknown setting '%s' (see --help)\n", name);
		return -1;
	}
	if (rv != 0)
		fprintf(err, "kvpoold: bad value for %s: '%s'\n", name, v ? v : "");
	return rv;
}

#define CONFIG_MAX_BYTES (1u << 20)

/*
 * A config file is a regular file or a pipe of at most CONFIG_MAX_BYTES; a
 * line that does not fit the buffer, or holds a NUL byte, is refused whole,
 * never split (its tail would otherwise be read as a setting of its own).
 */
static int
load_file(struct kvpd_config *c, const char *path, struct state *st, FILE *err)
{
	FILE *f = fopen(path, "r");
	char line[4096];
	int lineno = 0;
	size_t total = 0;
	struct stat sb;

	if (f == NULL) {
		fprintf(err, "kvpoold: config %s: %s\n", path, strerror(errno));
		return -1;
	}
	if (fstat(fileno(f), &sb) != 0 || !(S_ISREG(sb.st_mode) || S_ISFIFO(sb.st_mode))) {
		fprintf(err, "kvpoold: config %s: not a regular file\n", path);
		fclose(f);
		return -1;
	}
	while (fgets(line, sizeof(line), f)) {
		char *p = line, *eq, *end;
		size_t len = strlen(line);
		lineno++;
		/* fgets stops after a newline, at EOF, or when the buffer is full. */
		bool whole = (len > 0 && line[len - 1] == '\n') || feof(f);
		total += len;
		if (!whole || total > CONFIG_MAX_BYTES) {
			if (total > CONFIG_MAX_BYTES)
				fprintf(err, "kvpoold: config %s: larger than %u bytes\n", path,
				        CONFIG_MAX_BYTES);
			else
				fprintf(err, "kvpoold: %s:%d: line longer than %zu bytes, or a NUL byte in it\n",
				        path, lineno, sizeof(line) - 2);
			fclose(f);
			return -1;
		}
		while (isspace((unsigned char)*p))
			p++;
		if (*p == '#' || *p == '\0')
			continue;
		end = p + strlen(p);
		while (end > p && isspace((unsigned char)end[-1]))
			*--end = '\0';
		if ((eq = strchr(p, '=')) == NULL) {
			if (strcmp(p, "quiet") == 0) {
				c->quiet = true;
				continue;
			}
			fprintf(err, "kvpoold: %s:%d: expected name = value\n", path, lineno);
			if (st->check) {
				st->problems++;
				continue;
			}
			fclose(f);
			return -1;
		}
		char *k = p, *v = eq + 1;
		for (end = eq; end > k && isspace((unsigned char)end[-1]);)
			end--;
		*end = '\0';
		while (isspace((unsigned char)*v))
			v++;
		if (apply(c, k, v, st, err) != 0) {
			fprintf(err, "kvpoold: (at %s:%d)\n", path, lineno);
			if (st->check) {
				st->problems++;
				continue;
			}
			fclose(f);
			return -1;
		}
	}
	fclose(f);
	return 0;
}

static const char *
env_get(char **envp, const char *name)
{
	size_t n = strlen(name);
	for (char **e = envp; e && *e; e++)
		if (strncmp(*e, name, n) == 0 && (*e)[n] == '=')
			return *e + n + 1;
	return NULL;
}

/* A problem: stop at the first, or with --check-config count it and go on. */
/*
 * A problem found while loading: stop at the first, or (--check-config)
 * count it and go on, so one run lists them all.
 */
#define PROBLEM()                      \
	do {                           \
		if (!st->check)        \
			return -1;     \
		st->problems++;        \
	} while (0)

static void
defaults(struct kvpd_config *c, struct state *st)
{
	snprintf(c->rpc[0], KVPD_PATH_MAX, "%s", KVP_DEFAULT_RPC_URL);
	c->num_rpc = 1;
	snprintf(c->admin, KVPD_PATH_MAX, "%s", KVP_DEFAULT_ADMIN_URL);
	snprintf(c->events, KVPD_PATH_MAX, "%s", KVP_DEFAULT_EVENTS_URL);
	c->replay_batches = 10000;
	c->replay_mib = 64;
	snprintf(c->vllm.topic, KVPD_PATH_MAX, "kv@{pod}@{model}");
	c->vllm.replay_topic = true;
	c->vllm.buffer_steps = 10000;
	c->vllm.buffer_mib = 64;
	c->vllm.hwm = 10000;
	c->vllm.replay_peer_mib = 4;
	c->vllm.replay_total_mib = 64;
	c->vllm.queue_mib = 64;
	c->lease_ms = 30000;
	c->contexts = 8;
	c->shm_channels = 64;
	c->max_msg_bytes = KVP_WIRE_DEFAULT_MAX_MSG;
	c->max_ids = KVP_WIRE_DEFAULT_MAX_IDS;
	c->max_sessions = 1024;
	c->max_session_requests = 4096;
	c->reply_cache_mib = 64;
	c->drain_ms = 5000;
	c->send_timeout_ms = 5000;
	c->idle_timeout_ms = 300000;
	c->deadline_skew_ms = 1000;
	c->ipc_mode = 0600;
	snprintf(c->region_dir, sizeof(c->region_dir), "auto");
	snprintf(c->exec.backend, sizeof(c->exec.backend), "cpu");
	c->log_level = KVPD_INFO;
	c->log_format = KVPD_LOG_TEXT;
	c->exec.layers = 2;
	c->exec.heads = 2;
	c->exec.head_size = 64;
	snprintf(c->exec.dtype, sizeof(c->exec.dtype), "fp16");
	snprintf(c->exec.layout, sizeof(c->exec.layout), "nhd");
	(void)add_pool(c, KVPD_DEFAULT_POOL, st);
	st->pools_replaced = false;
}

/*
 * Pass 1 over the flags: --help and --version (1: printed, stop), the
 * config file's path and --check-config.
 */
static int
first_pass(struct kvpd_config *c, int argc, char **argv, const char **cfgfile, struct state *st,
           FILE *out)
{
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			kvpd_config_usage(out);
			return 1;
		}
		if (strcmp(argv[i], "--version") == 0) {
			fprintf(out, "kvpoold %s (commit %s)\n", KVP_VERSION, KVP_GIT_COMMIT);
			return 1;
		}
		if (strcmp(argv[i], "--config") == 0 && i + 1 < argc)
			*cfgfile = argv[i + 1];
		if (strcmp(argv[i], "--check-config") == 0)
			st->check = c->check_config = true;
	}
	return 0;
}

/* Environment: each setting's KVPOOL_ variable, over the file. */
static int
from_env(struct kvpd_config *c, char **envp, struct state *st, FILE *err)
{
	st->pools_replaced = st->rpc_replaced = false;
	for (size_t i = 0; i < kvpd_num_settings; i++) {
		char var[64];
		kvpd_cfg_env_name(kvpd_settings[i].name, var, sizeof(var));
		const char *v = env_get(envp, var);
		if (v == NULL || strcmp(kvpd_settings[i].name, "config") == 0 || !kvpd_cfg_is_setting(kvpd_settings[i].name))
			continue;
		if (strcmp(kvpd_settings[i].name, "pool") == 0 || strcmp(kvpd_settings[i].name, "rpc") == 0) {
			char list[8192], *save = NULL;
			if (kvpd_cfg_copy_str(list, sizeof(list), v) != 0) {
				fprintf(err, "kvpoold: %s is longer than %zu bytes\n", var, sizeof(list) - 1);
				PROBLEM();
				continue;
			}
			for (char *t = strtok_r(list, ";", &save); t; t = strtok_r(NULL, ";", &save))
				if (apply(c, kvpd_settings[i].name, t, st, err) != 0) {
					fprintf(err, "kvpoold: (from %s)\n", var);
					PROBLEM();
				}
		} else if (apply(c, kvpd_settings[i].name, v, st, err) != 0) {
			fprintf(err, "kvpoold: (from %s)\n", var);
			PROBLEM();
		}
	}
	return 0;
}

/* Flags, over everything. */
static int
from_flags(struct kvpd_config *c, int argc, char **argv, struct state *st, FILE *err)
{
	st->pools_replaced = st->rpc_replaced = false;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = NULL;
		char name[64];
		if (strncmp(a, "--", 2) != 0) {
			fprintf(err, "kvpoold: unexpected argument '%s' (see --help)\n", a);
			PROBLEM();
			continue;
		}
		const char *eq = strchr(a + 2, '=');
		size_t nl = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
		if (nl >= sizeof(name)) {
			fprintf(err, "kvpoold: unknown setting '%s'\n", a);
			PROBLEM();
			continue;
		}
		memcpy(name, a + 2, nl);
		name[nl] = '\0';
		if (!kvpd_cfg_known(name)) {
			fprintf(err, "kvpoold: unknown setting '%s' (see --help)\n", name);
			PROBLEM();
			if (!eq && i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0)
				i++; /* its value, if it has one, is not an argument of its own */
			continue;
		}
		if (eq)
			v = eq + 1;
		else if (kvpd_cfg_takes_arg(name)) {
			if (i + 1 >= argc) {
				fprintf(err, "kvpoold: --%s needs a value\n", name);
				PROBLEM();
				continue;
			}
			v = argv[++i];
		}
		if (strcmp(name, "config") == 0 || strcmp(name, "check-config") == 0)
			continue;
		if (strcmp(name, "token") == 0)
			c->token_in_argv = true; /* main warns: every local user can read it */
		if (apply(c, name, v, st, err) != 0)
			PROBLEM();
	}
	return 0;
}

/* After every source: the global token, each pool's derived settings, TLS. */
static int
resolve(struct kvpd_config *c, struct state *st, FILE *err)
{
	if (st->has_global_token)
		for (size_t i = 0; i < c->num_pools; i++)
			if (c->pools[i].token[0] == '\0')
				memcpy(c->pools[i].token, st->global_token, sizeof(st->global_token));
	for (size_t i = 0; i < c->num_pools; i++)
		if (kvpd_cfg_resolve_groups(&c->pools[i], err) != 0 ||
		    kvpd_cfg_resolve_exec(c, &c->pools[i], err) != 0)
			PROBLEM();
	if (kvpd_cfg_resolve_vllm(c, err) != 0)
		PROBLEM();
	if ((c->tls_cert[0] != '\0') != (c->tls_key[0] != '\0')) {
		fprintf(err, "kvpoold: tls-cert and tls-key go together\n");
		PROBLEM();
	}
	if (strncmp(c->events, "tls+", 4) == 0 && c->tls_cert[0] == '\0') {
		fprintf(err, "kvpoold: %s needs tls-cert and tls-key\n", c->events);
		PROBLEM();
	}
	for (size_t i = 0; i < c->num_rpc; i++)
		if (strncmp(c->rpc[i], "tls+", 4) == 0 && c->tls_cert[0] == '\0') {
			fprintf(err, "kvpoold: %s needs tls-cert and tls-key\n", c->rpc[i]);
			PROBLEM();
		}
	return 0;
}

/* lenient: go on past every problem (as --check-config) but run no extra checks. */
static int
load(struct kvpd_config *c, int argc, char **argv, char **envp, FILE *out, FILE *err,
     bool lenient)
{
	struct state state, *st = &state;
	const char *cfgfile = NULL;
	int rv;

	memset(c, 0, sizeof(*c));
	memset(st, 0, sizeof(*st));
	st->err = err;
	defaults(c, st);
	if ((rv = first_pass(c, argc, argv, &cfgfile, st, out)) != 0)
		return rv;
	if (lenient)
		st->check = true;
	if (cfgfile == NULL)
		cfgfile = env_get(envp, "KVPOOL_CONFIG");
	if (cfgfile && load_file(c, cfgfile, st, err) != 0)
		PROBLEM();
	if (from_env(c, envp, st, err) != 0 || from_flags(c, argc, argv, st, err) != 0 ||
	    resolve(c, st, err) != 0)
		return -1;
	if (st->check && !lenient) {
		st->problems += kvpd_cfg_check_more(c, err);
		if (st->problems > 0) {
			fprintf(err, "kvpoold: %u problem(s) in the configuration\n", st->problems);
			return -1;
		}
	}
	return 0;
}

int
kvpd_config_load(struct kvpd_config *c, int argc, char **argv, char **envp, FILE *out, FILE *err)
{
	return load(c, argc, argv, envp, out, err, false);
}

int
kvpd_config_log_format(int argc, char **argv, char **envp)
{
	struct kvpd_config *c = malloc(sizeof(*c));
	FILE *sink = fopen("/dev/null", "w");
	int f = KVPD_LOG_TEXT;

	if (c != NULL && sink != NULL) {
		(void)load(c, argc, argv, envp, sink, sink, true);
		f = c->log_format;
	}
	if (sink != NULL)
		fclose(sink);
	free(c);
	return f;
}

#undef PROBLEM
