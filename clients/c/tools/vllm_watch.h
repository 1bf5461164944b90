/* SPDX-License-Identifier: Apache-2.0 */
/* vllm_watch.h: kvpoolctl's follower of vLLM's ZMQ event wire (vllm-events). */
#ifndef KVP_VLLM_WATCH_H
#define KVP_VLLM_WATCH_H

#include <stdbool.h>
#include <stdint.h>

struct kvp_vllm_watch_options {
	const char *url;          /* the PUB endpoint (or, with bind, ours) */
	const char *replay_url;   /* ROUTER endpoint; NULL: no gap repair */
	const char *topic;        /* prefix to subscribe to; "" for all */
	bool bind;                /* bind the SUB socket (centralised mode) */
	bool follow;              /* keep going until Ctrl-C (else stop after 2 s idle) */
	bool has_from;            /* replay from `from` before following */
	uint64_t from;
	unsigned long max;        /* stop after this many batches; 0: no limit */
	int timeout_ms;           /* replay answer timeout */
};

/* Prints batches as JSON lines on stdout. 0, or 1 after a message on stderr. */
int kvp_vllm_watch(const struct kvp_vllm_watch_options *o);

#endif /* KVP_VLLM_WATCH_H */
