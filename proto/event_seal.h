/* SPDX-License-Identifier: Apache-2.0 */
/*
 * event_seal.h: the native event stream of a pool with a token is sealed,
 * so its events (prompt token ids, LoRA names, cache salts) reach only
 * subscribers that presented the token.
 *
 * The daemon draws a random AES-256 key and a random key id per pool at
 * start and gives them, in PoolInfo, only to sessions that presented the
 * pool's token (Hello or a resumed session). Each published EventBatch
 * (and tick) of that pool goes out as a sealed EventBatch: pool (in clear,
 * as in the topic), key_id, counter, and sealed = AES-256-GCM of the whole
 * encoded batch, its 16-byte tag appended, with nonce = key_id (4 bytes,
 * big-endian) || counter (8 bytes, big-endian) and the pool name as
 * associated data. The counter rises by one per published message, so no
 * nonce repeats under one key; a restart draws a new key.
 *
 * What a peer without the token can still see: the pool's name, the size
 * and timing of its messages. Replay and Snapshot replies are never sealed:
 * they go to a session, which presented the token.
 *
 * Thread-safe (no state). Never prints.
 */
#ifndef KVP_EVENT_SEAL_H
#define KVP_EVENT_SEAL_H

#include <stddef.h>
#include <stdint.h>

#define KVP_SEAL_KEY_LEN 32u
#define KVP_SEAL_TAG_LEN 16u

struct kvp_seal_key {
	uint8_t key[KVP_SEAL_KEY_LEN];
	uint32_t id; /* non-zero */
};

/* A fresh random key with a random non-zero id. KVP_OK or KVP_EINTERNAL (no randomness). */
int kvp_seal_key_new(struct kvp_seal_key *k);

/*
 * Seals plain[0..len) (an encoded EventBatch of pool) under key k with
 * counter. On KVP_OK *out is a malloc'd sealed EventBatch of *out_len
 * bytes. KVP_EINVAL (NULL, pool name over the wire's limit, len over
 * 1 GiB), KVP_ENOMEM, KVP_EINTERNAL (the cipher failed).
 */
int kvp_seal_batch(const struct kvp_seal_key *k, uint64_t counter, const char *pool,
                   const uint8_t *plain, size_t len, uint8_t **out, size_t *out_len);

/*
 * Opens a sealed EventBatch with key k. On KVP_OK *plain is a malloc'd
 * encoded EventBatch of *plain_len bytes. KVP_ENOTFOUND if it was sealed
 * under another key id (the daemon restarted: fetch its new key), KVP_EINVAL
 * if bytes are not a sealed batch or fail authentication, KVP_ENOMEM.
 * *key_id (if not NULL) is the id the batch names, whatever the result.
 */
int kvp_seal_open(const struct kvp_seal_key *k, const uint8_t *bytes, size_t len,
                  uint8_t **plain, size_t *plain_len, uint32_t *key_id);

#endif /* KVP_EVENT_SEAL_H */
