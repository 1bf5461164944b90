/* SPDX-License-Identifier: Apache-2.0 */
/* Each pool's executor settings: memory budgets parsed, globals filled in, checked. */
#define _POSIX_C_SOURCE 200809L

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu/executor.h"
#include "service/config/config.h"
#include "service/config/config_impl.h"

int
kvpd_parse_memory(const char *s, uint64_t *bytes, double *fraction)
{
	char *end;
	*bytes = 0;
	*fraction = 0;
	if (s == NULL || s[0] == '\0')
		return 0;
	if (!isdigit((unsigned char)s[0]))
		return -1;
	errno = 0;
	if (strchr(s, '.') != NULL) {
		double f = strtod(s, &end);
		if (errno != 0 || *end != '\0' || !(f > 0 && f <= 1))
			return -1;
		*fraction = f;
		return 0;
	}
	unsigned long long v = strtoull(s, &end, 10);
	unsigned shift = 0;
	if (errno != 0)
		return -1;
	switch (*end) {
	case '\0':
		break;
	case 'K': case 'k':
		shift = 10;
		break;
	case 'M': case 'm':
		shift = 20;
		break;
	case 'G': case 'g':
		shift = 30;
		break;
	case 'T': case 't':
		shift = 40;
		break;
	default:
		return -1;
	}
	if (*end != '\0' && (end[1] != '\0' && strcmp(end + 1, "i") != 0 && strcmp(end + 1, "iB") != 0 &&
	                      strcmp(end + 1, "B") != 0))
		return -1;
	if (v == 0 || v > (UINT64_MAX >> shift))
		return -1;
	*bytes = (uint64_t)v << shift;
	return 0;
}

/* A pool's executor settings: its own, else the global ones; then checked. */
int
kvpd_cfg_resolve_exec(const struct kvpd_config *c, struct kvpd_pool_config *p, FILE *err)
{
	struct kvpd_exec_settings *x = &p->exec;
	const struct kvpd_exec_settings *g = &c->exec;
	uint32_t v;
	uint64_t bytes;
	double frac;
	enum kvp_exec_backend b;

	if (x->backend[0] == '\0')
		memcpy(x->backend, g->backend, sizeof(x->backend));
	if (x->device < 0)
		x->device = g->device;
	if (x->layers == 0)
		x->layers = g->layers;
	if (x->heads == 0)
		x->heads = g->heads;
	if (x->head_size == 0)
		x->head_size = g->head_size;
	if (x->dtype[0] == '\0')
		memcpy(x->dtype, g->dtype, sizeof(x->dtype));
	if (x->layout[0] == '\0')
		memcpy(x->layout, g->layout, sizeof(x->layout));
	if (x->memory[0] == '\0')
		memcpy(x->memory, g->memory, sizeof(x->memory));
	if (strcmp(x->backend, "none") != 0 && kvp_exec_backend_parse(x->backend, &b) != 0) {
		fprintf(err, "kvpoold: pool %s: executor '%s' is not none, cpu, cuda or auto\n",
		        p->name, x->backend);
		return -1;
	}
	if (kvp_dtype_parse(x->dtype, &v) != 0 || kvp_cache_layout_parse(x->layout, &v) != 0) {
		fprintf(err, "kvpoold: pool %s: dtype '%s' / layout '%s' unknown (fp16, bf16, fp32; "
		             "nhd, hnd)\n", p->name, x->dtype, x->layout);
		return -1;
	}
	if (kvpd_parse_memory(x->memory, &bytes, &frac) != 0) {
		fprintf(err, "kvpoold: pool %s: bad memory budget '%s'\n", p->name, x->memory);
		return -1;
	}
	if (p->num_blocks == 0 && (x->memory[0] == '\0' || strcmp(x->backend, "none") == 0)) {
		fprintf(err, "kvpoold: pool %s: give blocks, or an executor and a memory budget\n",
		        p->name);
		return -1;
	}
	return 0;
}

uint64_t
kvpd_host_memory(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
	return pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : 0;
}
