/* SPDX-License-Identifier: Apache-2.0 */
/*
 * --check-config's checks beyond parsing: what kvpoold would otherwise find
 * only when it binds, reads its TLS files or sizes its pools. Nothing is
 * bound and no pool memory is allocated.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <nng/nng.h>
#include <nng/supplemental/tls/tls.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "common/kvp_status.h"
#include "gpu/executor.h"
#include "service/config/config.h"
#include "service/config/config_impl.h"

static unsigned
check_readable(const char *what, const char *path, FILE *err)
{
	FILE *f;
	if (path[0] == '\0')
		return 0;
	if ((f = fopen(path, "r")) == NULL) {
		fprintf(err, "kvpoold: %s %s: %s\n", what, path, strerror(errno));
		return 1;
	}
	fclose(f);
	return 0;
}

/* A port: all digits, 0..65535, as its number; -1 otherwise. */
static long
port_of(const char *p)
{
	long v = 0;
	if (p == NULL || p[0] == '\0' || strlen(p) > 5)
		return -1;
	for (const char *q = p; *q; q++) {
		if (*q < '0' || *q > '9')
			return -1;
		v = v * 10 + (*q - '0');
	}
	return v <= 65535 ? v : -1;
}

/* An nng endpoint kvpoold listens on: parses, a known scheme, an ipc path's directory exists. */
static unsigned
check_endpoint(const char *what, const char *url, bool http, FILE *err)
{
	nng_url *u = NULL;
	unsigned bad = 0;

	if (url[0] == '\0')
		return 0;
	if (nng_url_parse(&u, url) != 0) {
		fprintf(err, "kvpoold: %s %s: not a URL\n", what, url);
		return 1;
	}
	const char *s = u->u_scheme;
	if (http ? strcmp(s, "http") != 0
	         : strcmp(s, "ipc") != 0 && strcmp(s, "tcp") != 0 && strcmp(s, "tcp4") != 0 &&
	                   strcmp(s, "tcp6") != 0 && strcmp(s, "tls+tcp") != 0 &&
	                   strcmp(s, "inproc") != 0) {
		fprintf(err, "kvpoold: %s %s: scheme %s is not %s\n", what, url, s,
		        http ? "http" : "ipc, tcp or tls+tcp");
		bad = 1;
	} else if (strcmp(s, "ipc") == 0) {
		char dir[KVPD_PATH_MAX];
		struct stat sb;
		snprintf(dir, sizeof(dir), "%s", u->u_path);
		char *slash = strrchr(dir, '/');
		if (slash != NULL && slash != dir)
			*slash = '\0';
		else if (slash == dir)
			dir[1] = '\0';
		else
			snprintf(dir, sizeof(dir), ".");
		if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode) || access(dir, W_OK | X_OK) != 0) {
			fprintf(err, "kvpoold: %s %s: cannot create a socket in %s\n", what, url, dir);
			bad = 1;
		}
	} else if (strcmp(s, "inproc") != 0 && (u->u_port == NULL || u->u_port[0] == '\0')) {
		fprintf(err, "kvpoold: %s %s: no port\n", what, url);
		bad = 1;
	} else if (strcmp(s, "inproc") != 0 && port_of(u->u_port) < 0) {
		fprintf(err, "kvpoold: %s %s: port %s is not a number in 0..65535\n", what, url,
		        u->u_port);
		bad = 1;
	}
	nng_url_free(u);
	return bad;
}

/* A TCP endpoint's port (the daemon listens on it): its number, or -1 (none or not TCP). */
static long
endpoint_port(const char *url)
{
	nng_url *u = NULL;
	long port = -1;
	if (url[0] == '\0' || nng_url_parse(&u, url) != 0)
		return -1;
	if (strcmp(u->u_scheme, "ipc") != 0 && strcmp(u->u_scheme, "inproc") != 0 &&
	    u->u_port != NULL)
		port = port_of(u->u_port);
	nng_url_free(u);
	return port == 0 ? -1 : port; /* 0: the system picks one, never the same twice */
}

/* One URL given twice (two --rpc, or --rpc and --events): the second bind would fail. */
static unsigned
check_same_url(const struct kvpd_config *c, FILE *err)
{
	const char *u[KVPD_MAX_URLS + 1];
	size_t n = 0;
	unsigned bad = 0;

	for (size_t i = 0; i < c->num_rpc; i++)
		u[n++] = c->rpc[i];
	if (c->events[0] != '\0')
		u[n++] = c->events;
	for (size_t i = 0; i < n; i++)
		for (size_t j = i + 1; j < n; j++)
			if (strcmp(u[i], u[j]) == 0) {
				fprintf(err, "kvpoold: %s is given twice (%s): one endpoint, one bind\n",
				        u[i], j < c->num_rpc ? "rpc and rpc" : "rpc and events");
				bad++;
			}
	return bad;
}

/* The TLS configuration the daemon would build from tls-cert, tls-key and tls-ca. */
static unsigned
check_tls(const struct kvpd_config *c, FILE *err)
{
	struct nng_tls_config *t = NULL;
	char why[512];

	if (c->tls_cert[0] == '\0' || c->tls_key[0] == '\0')
		return 0;
	if (kvpd_tls_server_config(c, &t, why, sizeof(why)) != 0) {
		fprintf(err, "kvpoold: %s\n", why);
		return 1;
	}
	nng_tls_config_free(t);
	return 0;
}

/* The endpoints kvpoold binds on TCP must use distinct ports (one would fail to bind). */
static unsigned
check_ports(const struct kvpd_config *c, FILE *err)
{
	struct ep {
		const char *what, *url;
	} eps[KVPD_MAX_URLS + 2];
	size_t n = 0;
	unsigned bad = 0;

	for (size_t i = 0; i < c->num_rpc; i++)
		eps[n++] = (struct ep){"rpc", c->rpc[i]};
	eps[n++] = (struct ep){"events", c->events};
	eps[n++] = (struct ep){"admin", c->admin};
	for (size_t i = 0; i < n; i++)
		for (size_t j = i + 1; j < n; j++) {
			long a = endpoint_port(eps[i].url), b = endpoint_port(eps[j].url);
			if (a > 0 && a == b) {
				fprintf(err, "kvpoold: %s %s and %s %s: one port for two endpoints\n",
				        eps[i].what, eps[i].url, eps[j].what, eps[j].url);
				bad++;
			}
		}
	return bad;
}

/* A named --region-dir must be a directory kvpoold can create files in. */
static unsigned
check_region_dir(const struct kvpd_config *c, FILE *err)
{
	struct stat sb;
	if (strcmp(c->region_dir, "auto") == 0 || strcmp(c->region_dir, "none") == 0)
		return 0;
	if (stat(c->region_dir, &sb) != 0 || !S_ISDIR(sb.st_mode) ||
	    access(c->region_dir, W_OK | X_OK) != 0) {
		fprintf(err, "kvpoold: region-dir %s: not a directory kvpoold can create files in\n",
		        c->region_dir);
		return 1;
	}
	return 0;
}

/*
 * A disk tier's file: its directory one kvpoold can create files in, with
 * room for disk_rows rows (a file already there counts as room).
 */
static unsigned
check_disk(const struct kvpd_config *c, FILE *err)
{
	unsigned bad = 0;
	for (size_t i = 0; i < c->num_pools; i++) {
		const struct kvpd_pool_config *p = &c->pools[i];
		const struct kvpd_exec_settings *x = &p->exec;
		char dir[sizeof(p->disk)];
		struct stat sb;
		struct statvfs sv;
		if (p->disk[0] == '\0' || p->disk_rows == 0)
			continue;
		snprintf(dir, sizeof(dir), "%s", p->disk);
		char *slash = strrchr(dir, '/');
		if (slash == dir)
			slash[1] = '\0';
		else if (slash != NULL)
			*slash = '\0';
		if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode) || access(dir, W_OK | X_OK) != 0 ||
		    statvfs(dir, &sv) != 0) {
			fprintf(err, "kvpoold: pool %s: disk=%s: %s is not a directory kvpoold can "
			             "create files in\n", p->name, p->disk, dir);
			bad++;
			continue;
		}
		struct kvp_kv_shape sh = {.block_size = p->block_size, .num_layers = x->layers,
		                          .num_heads = x->heads, .head_size = x->head_size,
		                          .num_blocks = 1, .rows = 1};
		if (kvp_dtype_parse(x->dtype, &sh.dtype) != 0 ||
		    kvp_cache_layout_parse(x->layout, &sh.layout) != 0)
			continue; /* reported with the pool's shape */
		uint64_t need = (uint64_t)p->disk_rows * kvp_kv_block_stride(&sh);
		uint64_t room = (uint64_t)sv.f_bavail * sv.f_frsize;
		if (stat(p->disk, &sb) == 0 && S_ISREG(sb.st_mode))
			room += (uint64_t)sb.st_size;
		if (room < need) {
			fprintf(err, "kvpoold: pool %s: disk=%s needs %llu MiB for %u rows; its file "
			             "system has %llu MiB free\n", p->name, p->disk,
			        (unsigned long long)(need >> 20), p->disk_rows,
			        (unsigned long long)(room >> 20));
			bad++;
		}
	}
	return bad;
}

/* Each pool's KV memory, and host memory in all against this machine's. */
static unsigned
check_memory(const struct kvpd_config *c, FILE *err)
{
	unsigned bad = 0;
	long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
	uint64_t phys = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
	uint64_t host = 0;

	for (size_t i = 0; i < c->num_pools; i++) {
		const struct kvpd_pool_config *p = &c->pools[i];
		const struct kvpd_exec_settings *x = &p->exec;
		struct kvp_kv_shape sh = {.block_size = p->block_size, .num_layers = x->layers,
		                          .num_heads = x->heads, .head_size = x->head_size};
		char why[256];
		uint64_t budget = 0;
		double frac = 0;
		uint32_t blocks = p->num_blocks;

		if (strcmp(x->backend, "none") == 0)
			continue;
		if (kvp_dtype_parse(x->dtype, &sh.dtype) != 0 ||
		    kvp_cache_layout_parse(x->layout, &sh.layout) != 0 ||
		    kvpd_parse_memory(x->memory, &budget, &frac) != 0)
			continue; /* already reported */
		sh.num_blocks = blocks ? blocks : 1;
		if (kvp_kv_shape_check(&sh, why, sizeof(why)) != KVP_OK) {
			fprintf(err, "kvpoold: pool %s: KV shape: %s\n", p->name, why);
			bad++;
			continue;
		}
		bool host_mem = strcmp(x->backend, "cpu") == 0;
		if (frac > 0 && host_mem)
			budget = (uint64_t)(frac * (double)phys);
		if (blocks == 0 && budget > 0 && kvp_kv_fit_blocks(&sh, budget, &blocks) != KVP_OK) {
			fprintf(err, "kvpoold: pool %s: memory budget %s holds no block of %llu bytes\n",
			        p->name, x->memory, (unsigned long long)kvp_kv_block_bytes(&sh));
			bad++;
			continue;
		}
		if (host_mem)
			host += (uint64_t)blocks * kvp_kv_block_bytes(&sh);
	}
	if (phys > 0 && host > phys) {
		fprintf(err, "kvpoold: the cpu executors need %llu MiB of host memory; this machine "
		             "has %llu MiB\n", (unsigned long long)(host >> 20),
		        (unsigned long long)(phys >> 20));
		bad++;
	}
	return bad;
}

unsigned
kvpd_cfg_check_more(const struct kvpd_config *c, FILE *err)
{
	unsigned bad = 0;
	bad += check_readable("tls-cert", c->tls_cert, err);
	bad += check_readable("tls-key", c->tls_key, err);
	bad += check_readable("tls-ca", c->tls_ca, err);
	for (size_t i = 0; i < c->num_rpc; i++)
		bad += check_endpoint("rpc", c->rpc[i], false, err);
	bad += check_endpoint("events", c->events, false, err);
	bad += check_endpoint("admin", c->admin, true, err);
	bad += check_ports(c, err);
	bad += check_same_url(c, err);
	if (bad == 0) /* unreadable files are said above */
		bad += check_tls(c, err);
	bad += check_region_dir(c, err);
	bad += check_memory(c, err);
	bad += check_disk(c, err);
	for (size_t i = 0; i < c->num_pools; i++)
		if (c->pools[i].clear_on_alloc && strcmp(c->pools[i].exec.backend, "none") == 0) {
			fprintf(err, "kvpoold: pool %s: clear=alloc needs an executor (this pool "
			             "holds no KV bytes to clear)\n", c->pools[i].name);
			bad++;
		}
	for (size_t i = 0; i < c->num_pools; i++) {
		const struct kvpd_pool_config *p = &c->pools[i];
		if (p->disk[0] != '\0' && p->disk_rows == 0) {
			fprintf(err, "kvpoold: pool %s: disk=%s needs disk_rows\n", p->name, p->disk);
			bad++;
		}
		if (!p->restart_warm && p->disk[0] == '\0')
			continue;
		const char *why = strcmp(p->exec.backend, "cpu") != 0 ? "executor=cpu"
		                  : !p->caching                    ? "caching on"
		                  : strcmp(c->region_dir, "none") == 0 ? "a region-dir"
		                                                       : NULL;
		if (why != NULL) {
			fprintf(err, "kvpoold: pool %s: %s needs a shared region, which needs %s\n",
			        p->name, p->restart_warm ? "restart=warm" : "a disk tier", why);
			bad++;
		}
	}
	return bad;
}
