/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vllm_pub.h: kvpoold's second event wire, vLLM's own (reference section
 * 7.3): per pool a libzmq PUB socket sending [topic, seq (8 B BE), msgpack
 * KVEventBatch] with seq from 0 per publisher, and optionally a ROUTER
 * socket that replays the last vllm-buffer-steps batches from a requested
 * seq, then the end marker (seq ff..ff, empty payload).
 *
 * Differences from vLLM, on purpose: the batch is encoded and sent on the
 * RPC thread under the pool's lock (no queue, so publishing never blocks
 * and never reorders; a full subscriber drops at the high-water mark as
 * vLLM's does); replays are served by one thread for all pools, without
 * holding any pool's lock; the ROUTER's send high-water mark is vllm-hwm
 * (vLLM leaves libzmq's 1,000, which cuts long replays short); a replay
 * request may come from REQ ([id, "", seq]) or DEALER ([id, seq]) and is
 * answered in the same envelope.
 *
 * I/O; part of the kvpoold program, not of kvpd_core.
 */
#ifndef KVPD_VLLM_PUB_H
#define KVPD_VLLM_PUB_H

#include <stddef.h>

#include "service/config/config.h"

struct kvpd_server;
struct kvpd_vllm;

/*
 * Opens every pool's publisher (nothing if cfg->vllm.endpoint is empty:
 * *out is then NULL) and attaches it to the server. KVP_OK, or an error
 * with a message in err.
 */
int kvpd_vllm_open(struct kvpd_server *srv, const struct kvpd_config *cfg,
                   struct kvpd_vllm **out, char *err, size_t len);

/* Detaches and closes every publisher (linger 0). NULL is a no-op. */
void kvpd_vllm_close(struct kvpd_vllm *v);

#endif /* KVPD_VLLM_PUB_H */
