/* SPDX-License-Identifier: Apache-2.0 */
/*
 * par_copy.h: memcpy split across a few helper threads (internal to gpu/).
 *
 * The cuda backend moves every payload between the caller's memory (from
 * malloc, or an nng message) and pinned staging. One core copies that at
 * 8-15 GB/s on the machines measured (BENCHMARKS.md), a fifth of what the
 * PCIe link carries from pinned memory; a few cores together come close
 * to it. A copier owns `threads - 1` helpers, parked on a condition
 * variable between copies; the calling thread copies one share itself.
 * One copy at a time per copier: the caller serialises (the executor's
 * calls already are, under their pool's lock).
 */
#ifndef KVP_PAR_COPY_H
#define KVP_PAR_COPY_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVP_PAR_COPY_MAX_THREADS 32u

struct kvp_par_copy;

/*
 * A copier of `threads` threads in all (1..KVP_PAR_COPY_MAX_THREADS; 1
 * starts no helper). KVP_EINVAL for another count, KVP_ENOMEM or
 * KVP_EINTERNAL if a thread cannot be had.
 */
int kvp_par_copy_open(unsigned threads, struct kvp_par_copy **out);
/* Stops and joins the helpers. NULL is a no-op. */
void kvp_par_copy_close(struct kvp_par_copy *pc);
unsigned kvp_par_copy_threads(const struct kvp_par_copy *pc);

/*
 * memcpy(dst, src, len), shared among the threads in slices of at least
 * KVP_PAR_COPY_MIN_SLICE bytes; returns when all of it is copied. The
 * ranges must not overlap. pc NULL copies on the calling thread alone.
 */
#define KVP_PAR_COPY_MIN_SLICE (512u * 1024u)
void kvp_par_copy(struct kvp_par_copy *pc, void *dst, const void *src, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* KVP_PAR_COPY_H */
