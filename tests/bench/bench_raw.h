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

/*
 * The same round trips against kvp-bench-echo (bench_echo_start's) at url, a
 * process of its own, instead of an echo thread in this one; req_len at least
 * BENCH_ECHO_HDR.
 */
int bench_raw_run_remote(const char *url, size_t req_len, size_t rep_len, uint64_t n,
                         double *wall, double server_us, double client_us);

/* kvp-bench-echo's request header: reply length, then spin in ns of its CPU time (u64s, LE). */
#define BENCH_ECHO_HDR 16u
#define BENCH_ECHO_MAX ((size_t)64 << 20)

/*
 * Starts kvp-bench-echo (at path) on url, on CPU cpu if cpu >= 0 (through
 * taskset); its pid, or -1. Before the caller's first nng call.
 */
int bench_echo_start(const char *path, const char *url, int cpu);

/* Runs this process on CPU cpu alone. 0, or -1 with errno. */
int bench_pin_self(int cpu);

#endif /* KVP_BENCH_RAW_H */
