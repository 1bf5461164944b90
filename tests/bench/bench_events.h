/* SPDX-License-Identifier: Apache-2.0 */
/* bench_events.h: what kvp-bench-events' two files share (the load, the vLLM rows). */
#ifndef KVP_BENCH_EVENTS_H
#define KVP_BENCH_EVENTS_H

#include <stdint.h>
#include <sys/types.h>

#include "clients/c/kvpool.h"

/* The load: Batches that evict 64 cached blocks and cache 64 new ones (65 events). */
struct load {
	struct kvp_client *c;
	struct kvp_batch *b;
	uint64_t counter;
	int32_t held[64];
	int have;
};
/* One Batch of the load. 0, or -1 on a failed call. */
int load_step(struct load *l);

/* The vLLM wire's rows: two daemons, the wire off and on, started by fork+exec. */
struct vllm_bench {
	pid_t off, on;
	char rpc_off[128], rpc_on[128], pub[128], raw[128];
};
void vllm_bench_start(struct vllm_bench *vb, const char *daemon, int pid);
/* Prints the rows and stops the daemons. 0, or 1 if something failed. */
int vllm_bench_run(struct vllm_bench *vb, double seconds);

#endif /* KVP_BENCH_EVENTS_H */
