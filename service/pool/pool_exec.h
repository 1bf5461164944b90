/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A pool's executor, opened and sized from its settings (server.c's
 * pool_init calls it first): backend, shape, memory budget, the shared
 * region and where it goes.
 */
#ifndef KVPD_POOL_EXEC_H
#define KVPD_POOL_EXEC_H

#include <stddef.h>

#include "service/config/config.h"
#include "service/rpc/dispatch.h"

/*
 * Opens pool p's executor (none: nothing), sizing the pool from the memory
 * budget when the spec gave no block count. Sets p->cfg.num_blocks,
 * p->cfg.medium, p->exec, p->row_crc (with a region) and p->exec_note.
 * KVP_OK, or a status with err.
 */
int kvpd_pool_exec_init(struct kvpd_pool *p, const struct kvpd_config *cfg, char *err,
                        size_t err_len);

#endif
