/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vllm_wire.h: vLLM's own KV event wire, the one llm-d, NVIDIA Dynamo and
 * vLLM's example subscriber decode (reference section 7.3 and
 * vllm-events-wire-now.md): the msgpack payload of a KVEventBatch, the
 * 8-byte big-endian seq frame, and vLLM's endpoint rules (bind or connect,
 * the data-parallel port offset). No I/O: service/streams/vllm_pub.c sends what
 * this encodes; clients/c decodes it for `kvpoolctl vllm-events`.
 *
 * Payload: the batch is always an array [ts (float64), [events], dp_rank].
 * Events are maps with a "type" key (vLLM v0.26 on, fields whose default is
 * None left out when None) or arrays [class name, every field] (earlier
 * vLLM and spec scenario F5, 12 elements for BlockStored). Hashes are the
 * low 64 bits of each full hash, big-endian, as msgpack ints (vLLM's
 * default) or the full hash as bin. Extra keys (CBOR in kvpool's events)
 * become msgpack arrays, as vLLM's tuples are. kvpool does not know a
 * block's locality, so `locality` is never sent (None).
 *
 * Not thread-safe per buffer; never prints.
 */
#ifndef KVP_VLLM_WIRE_H
#define KVP_VLLM_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/events.h"

enum kvp_vllm_form {
	KVP_VLLM_MAP = 0,   /* events as maps with "type" (vLLM >= 0.26) */
	KVP_VLLM_ARRAY = 1, /* events as arrays led by the class name */
};

struct kvp_vllm_opts {
	enum kvp_vllm_form form;
	bool hash_bytes;    /* full hashes as bin (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0) */
};

/* A growable output buffer; zero-initialise, reuse, then kvp_vllm_buf_fini. */
struct kvp_vllm_buf {
	uint8_t *data;
	size_t len, cap;
};
void kvp_vllm_buf_fini(struct kvp_vllm_buf *b);

/*
 * Encodes the events of b as one KVEventBatch payload into out (replacing
 * its contents). ts is in seconds. Returns KVP_OK, KVP_EINVAL (bad
 * arguments, or an extra key that is not the CBOR subset vLLM's keys use)
 * or KVP_ENOMEM; out is unspecified after an error.
 */
int kvp_vllm_encode(const struct kvp_event_batch *b, double ts, int64_t dp_rank,
                    const struct kvp_vllm_opts *o, struct kvp_vllm_buf *out);

/* The seq frame: 8 bytes, big-endian. */
void kvp_vllm_seq_put(uint8_t out[8], uint64_t seq);
uint64_t kvp_vllm_seq_get(const uint8_t in[8]);
/* The replay end marker's seq (ff ff ff ff ff ff ff ff). */
#define KVP_VLLM_END_SEQ UINT64_MAX

/* vLLM's rule: a PUB endpoint binds if it has '*' or "::", or is ipc:// or inproc://. */
bool kvp_vllm_binds(const char *endpoint);

/*
 * vLLM's data-parallel offset: rank 0 leaves the endpoint as is; rank r > 0
 * adds r to a tcp:// endpoint's port and appends "_dp<r>" to an inproc://
 * one. KVP_OK, or KVP_EINVAL (another scheme with r > 0, no port, a port
 * past 65535, or out too small).
 */
int kvp_vllm_offset_endpoint(const char *endpoint, uint32_t rank, char *out, size_t cap);

/*
 * Fills a topic template: {pod}, {model}, {pool} and {rank} are replaced,
 * anything else is copied. KVP_OK, or KVP_EINVAL (an unknown {name}, or the
 * result does not fit cap).
 */
int kvp_vllm_topic(const char *tmpl, const char *pod, const char *model, const char *pool,
                   uint32_t rank, char *out, size_t cap);

/*
 * Decodes one msgpack payload (any msgpack, though meant for a KVEventBatch)
 * into JSON text in out (NUL-terminated; out->len excludes the NUL): maps
 * become objects (non-string keys as their JSON text), bin a hex string,
 * integers exact (64-bit hashes keep every digit), NaN and infinities null.
 * KVP_OK, KVP_EINVAL (not one whole msgpack value, or nested past 32) or
 * KVP_ENOMEM.
 */
int kvp_vllm_payload_json(const uint8_t *payload, size_t len, struct kvp_vllm_buf *out);

#endif /* KVP_VLLM_WIRE_H */
