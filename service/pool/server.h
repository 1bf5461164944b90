/* SPDX-License-Identifier: Apache-2.0 */
/*
 * server.h: kvpoold's state and its one entry point for requests.
 *
 * A server hosts named pools. Each pool owns its engine (pool, hasher,
 * request manager), its sessions and one mutex: every call on a pool runs
 * under that pool's lock, so the engine is touched by one thread at a time
 * while different pools proceed in parallel.
 *
 * kvpd_server_handle() turns request bytes into reply bytes and never
 * fails to produce a reply: bad input of any kind becomes an error status.
 * It does no I/O, so tests and the fuzzer drive it directly; transport.c
 * connects it to nng. Time comes in as an argument (milliseconds, any
 * monotonic origin).
 *
 * Thread-safe: kvpd_server_handle and kvpd_server_expire may be called from
 * any number of threads.
 */
#ifndef KVPD_SERVER_H
#define KVPD_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "common/kvp_status.h"
#include "service/rpc/calls.h"
#include "service/rpc/pool_types.h"
#include "service/rpc/sink.h"
#include "service/config/config.h"
#include "service/streams/stream.h"

struct kvpd_server;

void kvpd_server_pool_gauges(struct kvpd_server *s, size_t i, struct kvpd_pool_gauges *out);


/* Renders every pool's metrics in Prometheus text format into a new string. */
char *kvpd_metrics_render(struct kvpd_server *s);

/*
 * Creates the server and its pools from a loaded configuration. Returns 0,
 * or a kvp status with a reason written to err_buf.
 */
int kvpd_server_create(const struct kvpd_config *cfg, struct kvpd_server **out, char *err_buf,
                       size_t err_len);
/* Destroys the server; every session's blocks are released first. NULL: no-op. */
void kvpd_server_destroy(struct kvpd_server *s);

/* kvpd_server_handle with the reply written through sink. KVP_OK or KVP_ENOMEM. */
int kvpd_server_handle_to(struct kvpd_server *s, const uint8_t *req, size_t len, uint64_t now_ms,
                          struct kvpd_sink *sink);

/*
 * Handles one request (len bytes) at time now_ms. On return *reply (malloc'd,
 * the caller frees it) holds the encoded Reply; returns KVP_OK, or KVP_ENOMEM
 * when not even an error reply could be built (*reply is then NULL).
 */
int kvpd_server_handle(struct kvpd_server *s, const uint8_t *req, size_t len, uint64_t now_ms,
                       uint8_t **reply, size_t *reply_len);

/* Ends sessions whose lease ran out by now_ms, releasing their blocks. Returns how many. */
size_t kvpd_server_expire(struct kvpd_server *s, uint64_t now_ms);

/*
 * Sets the function that sends each pool's event batches (nng PUB in
 * kvpoold; tests may capture them). Call before serving requests.
 */
void kvpd_server_set_publisher(struct kvpd_server *s, kvpd_publish_fn fn, void *ctx);

/*
 * Pool i's engine pods (read under the pool's lock: from the event sink's
 * callback, which runs under it), or NULL if i is out of range.
 */
const struct kvpd_pool_pods *kvpd_server_pool_pods(const struct kvpd_server *s, size_t i);

/*
 * Attaches a second consumer of pool i's batches (the vLLM-wire publisher)
 * and returns the counters it should keep, or NULL if i is out of range.
 * fn NULL detaches it. Call before serving requests, or to detach after.
 */
struct kvpd_vllm_counters *kvpd_server_set_event_sink(struct kvpd_server *s, size_t i,
                                                      kvpd_events_fn fn, void *ctx);

/*
 * Publishes a tick on every pool's stream (the reaper calls it about once a
 * second), after any events no call has published yet (a warm start's).
 */
void kvpd_server_tick(struct kvpd_server *s);

/*
 * restart=warm pools: takes the CRC32C of rows committed without one, up to
 * about max_bytes a pool (rpc/keep.h). Returns the bytes read.
 */
uint64_t kvpd_server_keep_sweep(struct kvpd_server *s, uint64_t max_bytes);

/* Checks every pool's invariants; KVP_OK or KVP_EINTERNAL with a reason. */
int kvpd_server_check(struct kvpd_server *s, char *detail, size_t len);

/*
 * Copies up to cap of pool i's sessions that ended after *cursor (a count
 * of ended sessions; start at 0) into out and advances *cursor. Ends older
 * than the last KVPD_GONE_KEEP are skipped. Returns how many were copied.
 */
size_t kvpd_server_gone(struct kvpd_server *s, size_t i, uint64_t *cursor,
                        struct kvpd_gone_session *out, size_t cap);

/* Number of hosted pools, and a pool's name and counters (copied under its lock). */
size_t kvpd_server_num_pools(const struct kvpd_server *s);
const char *kvpd_server_pool_name(const struct kvpd_server *s, size_t i);
/* How pool i's executor was chosen and sized (a line for the log). */
const char *kvpd_server_pool_note(const struct kvpd_server *s, size_t i);
void kvpd_server_pool_counters(struct kvpd_server *s, size_t i, struct kvpd_pool_counters *out);

/* Counts one close (any thread). An unknown reason is ignored. */
void kvpd_server_count_close(struct kvpd_server *s, enum kvpd_close_reason r);
/* Closes so far for reason r (0 for an unknown reason). */
uint64_t kvpd_server_closes(const struct kvpd_server *s, enum kvpd_close_reason r);
/* The same-host channels (net/chan.c): one opened (+1) or ended (-1); a call served over one. */
void kvpd_server_count_shm(struct kvpd_server *s, int channel_delta, uint64_t calls);
/* Channels open now; calls served over them so far. */
void kvpd_server_shm(const struct kvpd_server *s, uint64_t *channels, uint64_t *calls);
/* The reason's label value: "idle", "took_no_reply", "tls_handshake", "address_bound",
 * "unauthenticated_bound"; NULL for an unknown reason. */
const char *kvpd_close_reason_name(enum kvpd_close_reason r);

#endif /* KVPD_SERVER_H */
