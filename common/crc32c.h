/* SPDX-License-Identifier: Apache-2.0 */
/*
 * crc32c.h: CRC32C (Castagnoli), the checksum carried by every block read
 * and optionally by writes. Shared by the daemon and the client library.
 *
 * Thread-safe (tables built once, under pthread_once). No I/O.
 */
#ifndef KVP_CRC32C_H
#define KVP_CRC32C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* CRC32C of n bytes, continuing from crc (0 to start). */
uint32_t kvp_crc32c(uint32_t crc, const void *data, size_t n);

/* The same without the CRC instruction (tests compare the two). */
uint32_t kvp_crc32c_portable(uint32_t crc, const void *data, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* KVP_CRC32C_H */
