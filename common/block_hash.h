/* SPDX-License-Identifier: Apache-2.0 */
/*
 * block_hash.h: vLLM's chained block hashing, byte for byte (reference
 * sections 5.1, 6.1-6.7; vectors in scenarios H and tests/test_block_hash.c).
 *
 * A block's hash is the digest of the encoding (canonical CBOR or pickle) of
 * the 3-tuple (parent hash or NONE_HASH, tokens, extra keys or None).
 * NONE_HASH is the digest of the encoded seed string (vLLM's PYTHONHASHSEED
 * rule) or 32 random bytes. Extra keys are, in vLLM's order: the LoRA; one
 * per multimodal feature overlapping the block (its identifier and its offset
 * relative to the block start); the cache salt on the block that starts at
 * token 0. They come in two forms (enum kvp_keys_form): vLLM 0.33 hashes
 * tagged tuples, ("lora", name, path), ("mm", identifier, offset) and
 * ("cache_salt", salt); vLLM at 9aaf83ef5 hashed the plain form, name,
 * (identifier, offset) and salt, which every version's events still carry.
 * Prompt-embeds keys are not supported (a request that uses them cannot be
 * described here).
 *
 * All four of vLLM's --prefix-caching-hash-algo choices are implemented,
 * byte for byte: sha256_cbor (kvpool's default: vLLM's language-neutral
 * choice), sha256 (vLLM's default: SHA-256 of pickle protocol 5 bytes,
 * common/pickle.h, with its one documented limit on strings that CPython
 * shares by identity), and xxhash and xxhash_cbor (XXH3-128 of the same
 * pickle or CBOR bytes, 16 bytes in python-xxhash's canonical big-endian
 * form). A hash is one digest: 32 bytes (KVP_HASH_LEN, also the largest)
 * for SHA-256, 16 for XXH3-128; kvp_hash_algo_len() says which. Arrays of
 * hashes are packed at that stride.
 *
 * A struct kvp_hasher owns one reused EVP_MD_CTX (2.8x faster than the
 * one-shot API) or XXH3 state, and its NONE_HASH: one per pool, not
 * thread-safe. The free functions are thread-safe. Never prints.
 */
#ifndef KVP_BLOCK_HASH_H
#define KVP_BLOCK_HASH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVP_HASH_LEN 32     /* the longest digest (SHA-256) */
#define KVP_HASH_MIN_LEN 16 /* the shortest (XXH3-128) */

/* A multimodal placeholder range [offset, offset + length) of a request. */
struct kvp_mm_feature {
	const char *identifier; /* NUL-terminated UTF-8; must not be NULL */
	int64_t offset;
	int64_t length;
};

/*
 * The parts of a request that enter its blocks' extra keys, and session_id,
 * which only annotates the BlockStored events the request causes (vLLM
 * 0.33's request.session_id) and never enters a hash.
 */
struct kvp_request_keys {
	const char *lora_name;             /* NULL: no LoRA */
	const struct kvp_mm_feature *mm;   /* sorted by offset; may be NULL if num_mm == 0 */
	size_t num_mm;
	const char *cache_salt;            /* NULL or "": no salt */
	const char *session_id;            /* NULL or "": None (events only) */
	const char *lora_path;             /* the LoRA's path (vLLM 0.33's tagged key);
	                                    * NULL without a LoRA */
};

/*
 * The form of a block's extra keys. Tagged is what vLLM 0.33 hashes
 * (generate_block_hash_extra_keys); plain is what vLLM at 9aaf83ef5 hashed
 * and what every version's events carry (to_event_extra_keys).
 */
enum kvp_keys_form {
	KVP_KEYS_TAGGED = 0, /* (("lora", name, path), ("mm", id, offset), ("cache_salt", s)) */
	KVP_KEYS_PLAIN = 1,  /* (name, (id, offset), s) */
};

struct kvp_hasher;

/* vLLM's hash algorithms that kvpool implements; values are kvpool's own. */
enum kvp_hash_algo {
	KVP_HASH_SHA256_CBOR = 0, /* "sha256_cbor": SHA-256 of canonical CBOR */
	KVP_HASH_SHA256 = 1,      /* "sha256": SHA-256 of pickle protocol 5 */
	KVP_HASH_XXHASH = 2,      /* "xxhash": XXH3-128 of pickle protocol 5 */
	KVP_HASH_XXHASH_CBOR = 3, /* "xxhash_cbor": XXH3-128 of canonical CBOR */
};

/* vLLM's name of an algorithm ("sha256_cbor"), or NULL if not one of ours. */
const char *kvp_hash_algo_name(enum kvp_hash_algo algo);
/* An algorithm's digest length in bytes (32 or 16), or 0 if not one of ours. */
size_t kvp_hash_algo_len(enum kvp_hash_algo algo);
/* Whether an algorithm hashes vLLM's pickle bytes (sha256, xxhash), not CBOR. */
bool kvp_hash_algo_pickle(enum kvp_hash_algo algo);
/* Parses vLLM's name; KVP_EINVAL for anything else; *out only on success. */
int kvp_hash_algo_parse(const char *name, enum kvp_hash_algo *out);

/*
 * Creates a hasher. seed != NULL: NONE_HASH = sha256(cbor(seed string)), as
 * vLLM does with PYTHONHASHSEED set; seed == NULL: 32 random bytes (hashes
 * then do not match any other process). Returns KVP_ENOMEM or KVP_EINTERNAL
 * (OpenSSL failure); *out is written only on success.
 */
int kvp_hasher_create(const char *seed, struct kvp_hasher **out);
/*
 * The same with a chosen algorithm: NONE_HASH is then hash_fn(seed) in that
 * algorithm's encoding, as vLLM's init_none_hash. KVP_EINVAL for an unknown
 * algorithm; otherwise as kvp_hasher_create.
 */
int kvp_hasher_create_algo(const char *seed, enum kvp_hash_algo algo, struct kvp_hasher **out);
/* The hasher's algorithm. */
enum kvp_hash_algo kvp_hasher_algo(const struct kvp_hasher *h);
/*
 * Sets the form in which the hasher's request hashing (kvp_hash_chain,
 * kvp_hash_request) builds extra keys, and whether its pickle memoizes their
 * tags: KVP_KEYS_TAGGED (vLLM 0.33, a new hasher's form) or KVP_KEYS_PLAIN
 * (a pool with vLLM 9aaf83ef5's rules). KVP_EINVAL for NULL or another value.
 */
int kvp_hasher_set_keys_form(struct kvp_hasher *h, enum kvp_keys_form form);
/* The hasher's extra-keys form. */
enum kvp_keys_form kvp_hasher_keys_form(const struct kvp_hasher *h);
/* Destroys a hasher; NULL is a no-op. */
void kvp_hasher_destroy(struct kvp_hasher *h);
/* The hasher's digest length: kvp_hash_algo_len(kvp_hasher_algo(h)). */
size_t kvp_hasher_len(const struct kvp_hasher *h);
/*
 * The hasher's NONE_HASH, kvp_hasher_none_len() bytes: one digest of the
 * seed, or (no seed) 32 random bytes whatever the algorithm, as vLLM's
 * os.urandom(32).
 */
const uint8_t *kvp_hasher_none_hash(const struct kvp_hasher *h);
size_t kvp_hasher_none_len(const struct kvp_hasher *h);

/*
 * hash_block_tokens: out = digest(encode((parent or NONE_HASH, tokens, extra)))
 * in the hasher's encoding (CBOR or pickle); out gets kvp_hasher_len(h)
 * bytes. parent: NULL for the first block, else one digest. extra: one
 * canonical CBOR item (from kvp_extra_keys_encode in the hasher's form,
 * whatever the algorithm), or NULL/0 for None. Returns KVP_EINVAL (tokens
 * NULL with n > 0, out NULL, extra not one CBOR item for the pickle
 * algorithms), KVP_ENOMEM, or
 * KVP_EINTERNAL (OpenSSL).
 */
int kvp_hash_block(struct kvp_hasher *h, const uint8_t *parent, const int64_t *tokens,
                   size_t n, const uint8_t *extra, size_t extra_len, uint8_t *out);

/*
 * Writes the exact bytes kvp_hash_block() digests (for the CBOR algorithms:
 * 0x83, parent, token array, extra or 0xf6; for the others: the pickle) to
 * buf and their count to *len; for tests, tools and the benchmark's raw-digest
 * baseline. KVP_EINVAL if cap is below the exact length (45 + 9·n +
 * extra_len always suffices for CBOR, kvp_pickle_block_bound for pickle);
 * *len is written only on success.
 */
int kvp_hash_block_input(const struct kvp_hasher *h, const uint8_t *parent,
                         const int64_t *tokens, size_t n, const uint8_t *extra,
                         size_t extra_len, uint8_t *buf, size_t cap, size_t *len);

/* The algorithm's plain digest of len bytes (benchmark baseline); kvp_hasher_len(h) bytes. */
int kvp_hash_raw(struct kvp_hasher *h, const void *data, size_t len, uint8_t *out);

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
 * lengths >= 1, offsets non-decreasing; the LoRA name and path, the cache
 * salt and every identifier at most KVP_MAX_KEY_LEN bytes; a LoRA path only
 * with a LoRA name. KVP_OK or KVP_EINVAL. (A LoRA name without its path is
 * valid here; the tagged form refuses it when it hashes.)
 */
int kvp_request_keys_validate(const struct kvp_request_keys *k);

/* Upper bound in bytes of one block's encoded extra keys for these keys, in either form. */
size_t kvp_extra_keys_max_len(const struct kvp_request_keys *k);

/*
 * generate_block_hash_extra_keys for tokens [start, end) in the given form:
 * writes the CBOR item (an array, or 0xf6 for None) to buf and its length to
 * *len. *mm_idx is vLLM's threaded multimodal index (0 for a walk from the
 * first feature, -1 for "the last feature") and is updated. k may be NULL
 * (no extra keys). KVP_EINVAL if cap is below kvp_extra_keys_max_len(k),
 * form is not one of ours, or form is tagged and the request has a LoRA name
 * without its path (vLLM 0.33 hashes both: a hash without the path matches
 * nobody's).
 */
int kvp_extra_keys_encode(const struct kvp_request_keys *k, enum kvp_keys_form form,
                          int64_t start, int64_t end, int64_t *mm_idx, uint8_t *buf,
                          size_t cap, size_t *len);

/*
 * vLLM's request block hasher: extends a request's hash chain. Given the
 * request's tokens and its num_prev existing fine hashes (prev, one digest
 * each), hashes every newly completed full block of block_size tokens into
 * out (cap hashes of room) and sets *num_out. Partial blocks are never
 * hashed. Extra keys are in the hasher's form; the multimodal walk starts as
 * that version of vLLM starts it: vLLM 0.33 at the first feature that ends
 * after the block's start (get_mm_features_in_window), 9aaf83ef5 at the
 * first feature for the first block and the last one after.
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
