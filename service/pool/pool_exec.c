/* SPDX-License-Identifier: Apache-2.0 */
/* A pool's executor from its settings: pool_exec.h. */
#include "service/pool/pool_exec.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "common/kvp_status.h"
#include "gpu/executor.h"

int
kvpd_pool_exec_init(struct kvpd_pool *p, const struct kvpd_config *cfg, char *err, size_t err_len)
{
	struct kvpd_pool_config *pc = &p->cfg;
	const struct kvpd_exec_settings *x = &pc->exec;
	struct kvp_exec_config ec = {.device = x->device};
	char why[256];
	uint64_t budget, free_b = 0, total_b = 0;
	double frac;
	int rv;

	if (strcmp(x->backend, "none") == 0) {
		snprintf(p->exec_note, sizeof(p->exec_note), "no executor (bookkeeping only)");
		return KVP_OK;
	}
	if (kvp_exec_backend_parse(x->backend, &ec.backend) != 0 ||
	    kvp_dtype_parse(x->dtype, &ec.shape.dtype) != 0 ||
	    kvp_cache_layout_parse(x->layout, &ec.shape.layout) != 0 ||
	    kvpd_parse_memory(x->memory, &budget, &frac) != 0) {
		snprintf(err, err_len, "pool %s: bad executor settings", pc->name);
		return KVP_EINVAL;
	}
	/* A cpu pool with prefix caching becomes a shared region (keys need the cache map). */
	if (ec.backend != KVP_EXEC_CUDA && pc->caching && strcmp(cfg->region_dir, "none") != 0) {
		ec.region_dir = cfg->region_dir;
		ec.region_name = pc->name;
		ec.region_mode = cfg->ipc_mode;
		ec.region_keep = pc->restart_warm;
		ec.shape.rows = ec.backend == KVP_EXEC_CPU;
	}
	ec.shape.block_size = pc->block_size;
	ec.shape.num_layers = x->layers;
	ec.shape.num_heads = x->heads;
	ec.shape.head_size = x->head_size;
	if (pc->num_blocks == 0) {
		if (frac > 0) {
			bool device = ec.backend != KVP_EXEC_CPU &&
			              kvp_exec_device_memory(x->device, &free_b, &total_b) == KVP_OK;
			uint64_t base = device ? free_b : kvpd_host_memory();
			budget = (uint64_t)(frac * (double)base);
		}
		if ((rv = kvp_kv_fit_blocks(&ec.shape, budget, &pc->num_blocks)) != KVP_OK) {
			snprintf(err, err_len, "pool %s: a budget of %llu bytes holds no usable block of "
			         "%llu bytes", pc->name, (unsigned long long)budget,
			         (unsigned long long)kvp_kv_block_bytes(&ec.shape));
			return KVP_EINVAL;
		}
	}
	ec.shape.num_blocks = pc->num_blocks;
	/*
	 * --region-dir auto: /dev/shm when it has room for the region and this user may write
	 * there, else private memory (a container's /dev/shm is often 64 MiB), said in the log.
	 */
	char region_why[192] = "";
	if (ec.region_dir != NULL && strcmp(cfg->region_dir, "auto") == 0) {
		struct kvp_kv_shape rs = ec.shape;
		struct statvfs sv;
		rs.rows = 1;
		uint64_t need = kvp_kv_block_stride(&rs) * pc->num_blocks;
		uint64_t room = statvfs("/dev/shm", &sv) == 0 ? (uint64_t)sv.f_bavail * sv.f_frsize : 0;
		ec.region_dir = "/dev/shm";
		if (access("/dev/shm", W_OK | X_OK) != 0)
			snprintf(region_why, sizeof(region_why),
			         ", no shared region: /dev/shm: %s (--region-dir names a place)",
			         strerror(errno));
		else if (room < need)
			snprintf(region_why, sizeof(region_why),
			         ", no shared region: /dev/shm has %llu MiB free, the pool needs %llu MiB "
			         "(--region-dir names a place)",
			         (unsigned long long)(room >> 20), (unsigned long long)(need >> 20));
		if (region_why[0] != '\0') {
			ec.region_dir = NULL;
			ec.shape.rows = 0;
		}
	}
	if (pc->restart_warm && ec.region_dir == NULL) {
		snprintf(err, err_len, "pool %s: restart=warm keeps a shared region, and there is "
		         "none%s", pc->name, region_why[0] ? region_why + 1 : "");
		return KVP_EINVAL;
	}
	if ((rv = kvp_exec_open(&ec, &p->exec, why, sizeof(why))) != KVP_OK) {
		/* The status by its documented name (NO_DEVICE, ...), then the backend's reason. */
		snprintf(err, err_len, "pool %s: %s: %s", pc->name, kvp_status_wire_name(rv), why);
		return rv;
	}
	if (pc->medium[0] == '\0')
		snprintf(pc->medium, sizeof(pc->medium), "%s", kvp_exec_medium(p->exec));
	struct kvp_exec_region reg;
	if (kvp_exec_region(p->exec, &reg) == KVP_OK) {
		uint32_t sh = pc->shards ? pc->shards : 1;
		if (reg.row_bytes % sh != 0) {
			snprintf(err, err_len, "pool %s: rows of %llu bytes do not split into %u shards",
			         pc->name, (unsigned long long)reg.row_bytes, sh);
			return KVP_EINVAL;
		}
		if ((p->row_crc = calloc(reg.num_rows, sizeof(*p->row_crc))) == NULL ||
		    (p->row_hits = calloc(reg.num_rows, sizeof(*p->row_hits))) == NULL) {
			snprintf(err, err_len, "pool %s: out of memory", pc->name);
			return KVP_ENOMEM;
		}
	}
	snprintf(p->exec_note, sizeof(p->exec_note),
	         "executor %s%s%s, %u blocks x %llu B = %llu MiB (layers %u, heads %u, head size %u, "
	         "%s, %s)",
	         kvp_exec_backend_name(p->exec), why[0] ? ": " : "", why, pc->num_blocks,
	         (unsigned long long)kvp_exec_block_bytes(p->exec),
	         (unsigned long long)(kvp_exec_memory_bytes(p->exec) >> 20), x->layers, x->heads,
	         x->head_size, x->dtype, x->layout);
	size_t used = strlen(p->exec_note);
	if (p->row_crc != NULL)
		(void)snprintf(p->exec_note + used, sizeof(p->exec_note) - used, ", shared region %s",
		               reg.path);
	else
		(void)snprintf(p->exec_note + used, sizeof(p->exec_note) - used, "%s", region_why);
	return KVP_OK;
}

