/* SPDX-License-Identifier: Apache-2.0 */
/*
 * block_hash.h: vLLM's chained block hashing with sha256_cbor, byte for byte
 * (reference sections 5.1, 6.2-6.4, 6.6, 6.7; vectors in scenarios H).
 *
 * A block's hash is SHA-256 of the canonical CBOR encoding of the 3-tuple
 * (parent hash or NONE_HASH, tokens, extra keys or None). NONE_HASH is
 * SHA-256 of the CBOR text string of a seed (vLLM's PYTHONHASHSEED rule) or
 * 32 random bytes. Extra keys are, in vLLM's order: the LoRA name; one
 * (identifier, offset relative to the block start) per multimodal feature
 * overlapping the block; the cache salt on the block that starts at token 0.
 * Prompt-embeds keys are not supported (a request that uses them cannot be
 * described here). Only sha256_cbor is implemented: it is vLLM's
 * language-neutral choice; sha256 (pickle) is Python-specific.
 *
 * A struct kvp_hasher owns one reused EVP_MD_CTX (2.8x faster than the
 * one-shot API) and its NONE_HASH: one per pool, not thread-safe. The free
 * functions are thread-safe. Never prints.
 */
#ifndef KVP_BLOCK_HASH_H
#define KVP_BLOCK_HASH_H

#include <stddef.h>
#include <stdint.h>

#define KVP_HASH_LEN 32

/* A multimodal placeholder range [offset, offset + length) of a request. */
struct kvp_mm_feature {
	const char *identifier; /* NUL-terminated UTF-8; must not be NULL */
	int64_t offset;
	int64_t length;
};

/* The parts of a request that enter its blocks' extra keys. */
struct kvp_request_keys {
	const char *lora_name;             /* NULL: no LoRA */
	const struct kvp_mm_feature *mm;   /* sorted by offset; may be NULL if num_mm == 0 */
	size_t num_mm;
	const char *cache_salt;            /* NULL or "": no salt */
};

struct kvp_hasher;

/*
 * Creates a hasher. seed != NULL: NONE_HASH = sha256(cbor(seed string)), as
 * vLLM does with PYTHONHASHSEED set; seed == NULL: 32 random bytes (hashes
 * then do not match any other process). Returns KVP_ENOMEM or KVP_EINTERNAL
 * (OpenSSL failure); *out is written only on success.
 */
int kvp_hasher_create(const char *seed, struct kvp_hasher **out);
/* Destroys a hasher; NULL is a no-op. */
void kvp_hasher_destroy(struct kvp_hasher *h);
/* The hasher's NONE_HASH (32 bytes). */
const uint8_t *kvp_hasher_none_hash(const struct kvp_hasher *h);

/*
 * hash_block_tokens: out = sha256(cbor((parent or NONE_HASH, tokens, extra))).
 * parent: NULL for the first block, else 32 bytes. extra: one canonical CBOR
 * item (from kvp_extra_keys_encode), or NULL/0 for None. Returns KVP_EINVAL
 * (tokens NULL with n > 0, out NULL) or KVP_EINTERNAL (OpenSSL).
 */
int kvp_hash_block(struct kvp_hasher *h, const uint8_t *parent, const int64_t *tokens,
                   size_t n, const uint8_t *extra, size_t extra_len, uint8_t out[KVP_HASH_LEN]);

/*
 * Writes the exact bytes kvp_hash_block() digests (0x83, parent, token
 * array, extra or 0xf6) to buf and their count to *len; for tests, tools
 * and the benchmark's raw-SHA-256 baseline. KVP_EINVAL if cap is below the
 * exact length (45 + 9·n + extra_len always suffices); nothing is written then.
 */
int kvp_hash_block_input(const struct kvp_hasher *h, const uint8_t *parent,
                         const int64_t *tokens, size_t n, const uint8_t *extra,
                         size_t extra_len, uint8_t *buf, size_t cap, size_t *len);

/* Plain SHA-256 of len bytes with the hasher's context (benchmark baseline). */
int kvp_hash_raw(struct kvp_hasher *h, const void *data, size_t len, uint8_t out[KVP_HASH_LEN]);

/*
 * The longest LoRA name, cache salt or multimodal identifier, in bytes. Each
 * enters the hash of every block it covers, so an unbounded one would make
 * one call hash without bound under its pool's lock. vLLM sets no limit;
 * its identifiers are content hashes (64 hex characters) and its LoRA names
 * short, so this one is generous.
 */
#define KVP_MAX_KEY_LEN 1024

/*
 * Checks a request's keys: every mm identifier non-NULL, offsets >= 0,
 * lengths >= 1, offsets non-decreasing; the LoRA name, the cache salt and
 * every identifier at most KVP_MAX_KEY_LEN bytes. KVP_OK or KVP_EINVAL.
 */
int kvp_request_keys_validate(const struct kvp_request_keys *k);

/* Upper bound in bytes of one block's encoded extra keys for these keys. */
size_t kvp_extra_keys_max_len(const struct kvp_request_keys *k);

/*
 * generate_block_hash_extra_keys for tokens [start, end): writes the CBOR
 * item (an array, or 0xf6 for None) to buf and its length to *len. *mm_idx is
 * vLLM's threaded multimodal index (0 for a request's first block, -1 for
 * "the last feature") and is updated. k may be NULL (no extra keys).
 * KVP_EINVAL if cap is below kvp_extra_keys_max_len(k).
 */
int kvp_extra_keys_encode(const struct kvp_request_keys *k, int64_t start, int64_t end,
                          int64_t *mm_idx, uint8_t *buf, size_t cap, size_t *len);

/*
 * vLLM's request block hasher: extends a request's hash chain. Given the
 * request's tokens and its num_prev existing fine hashes (prev, 32 bytes
 * each), hashes every newly completed full block of block_size tokens into
 * out (cap hashes of room) and sets *num_out. Partial blocks are never
 * hashed. The multimodal index starts at 0 when num_prev == 0 and at -1
 * (the last feature) otherwise, exactly as vLLM threads it.
 * KVP_EINVAL on bad arguments or cap too small (nothing written).
 */
int kvp_hash_request(struct kvp_hasher *h, const struct kvp_request_keys *k,
                     const int64_t *tokens, size_t num_tokens, uint32_t block_size,
                     const uint8_t *prev, size_t num_prev, uint8_t *out, size_t cap,
                     size_t *num_out);

/*
 * The chain from a given point: tokens[0] is the first token of block
 * first_block (position first_block x block_size, which the extra keys'
 * multimodal offsets are relative to), parent is the hash of block
 * first_block - 1 (NULL only when first_block is 0). Hashes the full blocks
 * of tokens into out (cap hashes of room), *num_out gets how many. This is
 * kvp_hash_request for a caller that keeps only the last hash.
 */
int kvp_hash_chain(struct kvp_hasher *h, const struct kvp_request_keys *k, const int64_t *tokens,
                   size_t num_tokens, uint32_t block_size, size_t first_block,
                   const uint8_t *parent, uint8_t *out, size_t cap, size_t *num_out);

/*
 * vLLM's default event form of a hash (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1):
 * int.from_bytes(hash, "big") & (2**64-1), i.e. the last 8 bytes big-endian.
 */
uint64_t kvp_hash_event_id(const uint8_t *hash, size_t len);

#endif /* KVP_BLOCK_HASH_H */
