/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_raw.h: the transport's floor for kvp-bench-step: raw nng REQ/REP
 * round trips of given request and reply sizes, against an echo server in
 * this process, optionally with each side busy between messages as a real
 * client and daemon are (so the round trips pay what idle CPUs cost to wake
 * on this machine, and nothing of our code).
 */
#ifndef KVP_BENCH_RAW_H
#define KVP_BENCH_RAW_H

#include <stddef.h>
#include <stdint.h>

/*
 * n timed round trips (after 16 untimed) of a req_len-byte request and a
 * rep_len-byte reply on url; wall[i] the seconds of each. server_us: the echo
 * server spins that long before each reply (the daemon's work); client_us:
 * the client spins that long before each request, untimed (its own work).
 * 0 on success, -1 if nng failed.
 */
int bench_raw_run(const char *url, size_t req_len, size_t rep_len, uint64_t n, double *wall,
                  double server_us, double client_us);

#endif /* KVP_BENCH_RAW_H */
