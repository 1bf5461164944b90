/* SPDX-License-Identifier: Apache-2.0 */
/*
 * wire.h: what the daemon and the client both need around the generated
 * protobuf-c code (kvpool.pb-c.h): the protocol version, default limits,
 * status conversion, and conversion of request keys. Written once so client
 * and server cannot drift.
 *
 * Thread-safe (no state). Never prints.
 */
#ifndef KVP_WIRE_H
#define KVP_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/block_hash.h"
#include "common/kvp_status.h"
#include "kvpool.pb-c.h"

#define KVP_PROTOCOL_VERSION 1u

/* Default limits; the daemon's flags can change them and Hello reports them. */
#define KVP_WIRE_DEFAULT_MAX_MSG (8u << 20)  /* bytes per message */
#define KVP_WIRE_DEFAULT_MAX_IDS 65536u      /* ids (or tokens) per call */
#define KVP_WIRE_MAX_NAME 128u               /* pool and client names */

/* Where the daemon listens and the tools dial unless told otherwise. */
#define KVP_DEFAULT_RPC_URL "ipc:///tmp/kvpool.ipc"
#define KVP_DEFAULT_EVENTS_URL "ipc:///tmp/kvpool-events.ipc"
#define KVP_DEFAULT_ADMIN_URL "http://127.0.0.1:9471"
/* Where a vLLM-wire subscriber connects by default (vLLM's default port). */
#define KVP_DEFAULT_VLLM_URL "tcp://127.0.0.1:5557"

/* Converts a wire status to the engine's (the same numbers; unknown: internal). */
int kvp_wire_status(Kvpool__V1__Status s);

/*
 * Fills *out (and mm[0..cap)) from wire keys; strings point into k.
 * Empty strings mean absent. KVP_EINVAL if k has more than cap features or
 * a string with an embedded NUL, KVP_OK otherwise (k NULL: no keys).
 */
int kvp_wire_keys_from_proto(const Kvpool__V1__RequestKeys *k, struct kvp_request_keys *out,
                             struct kvp_mm_feature *mm, size_t cap, bool *has_lora_id,
                             int64_t *lora_id);

/*
 * Fills wire keys *out (and mm_msgs / mm_ptrs, num_mm each) from engine keys;
 * strings point into k. k NULL gives empty keys.
 */
void kvp_wire_keys_to_proto(const struct kvp_request_keys *k, bool has_lora_id,
                            int64_t lora_id, Kvpool__V1__RequestKeys *out,
                            Kvpool__V1__MmFeature *mm_msgs, Kvpool__V1__MmFeature **mm_ptrs);

/*
 * Reads a small file (TLS certificates and keys: at most 1 MiB) into a new
 * NUL-terminated string, or returns NULL. Both ends load their TLS material
 * with it.
 */
char *kvp_wire_read_file(const char *path);

#endif /* KVP_WIRE_H */
