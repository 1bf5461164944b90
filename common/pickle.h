/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pickle.h: the exact bytes of CPython's pickle.dumps(obj, protocol=5) for
 * the objects vLLM's `sha256` hash algorithm digests (reference spec 6.5):
 * a block's (parent bytes, tuple of token ints, extra keys or None) and the
 * seed string of NONE_HASH. Checked byte for byte against CPython 3.11,
 * including the 64 KiB frame split of very large blocks.
 *
 * Extra keys come in as the canonical CBOR item that block_hash.h's
 * kvp_extra_keys_encode() writes (arrays, text, ints, bytes, None) and are
 * transcoded, so the key rules are written once.
 *
 * CPython memoizes by object identity, so a str object that occurs twice in
 * one block's extra keys is written the second time as a memo reference
 * (BINGET). vLLM 0.33's tagged keys do that on purpose: each tag ("lora",
 * "mm", "cache_salt") is one constant object, so a block holding two images
 * writes "mm" once and refers back to it the second time. With
 * KVP_PICKLE_TAGS the first item of each key tuple is such a tag and is
 * written once per block. Deliberate limit, as the spec warns: values cannot
 * tell whether two other equal strings were one object; these functions
 * write them in full, as CPython does for distinct objects (what vLLM has for
 * a LoRA name, a path, a salt and content-hash identifiers unless one
 * request repeats an identifier object). Use sha256_cbor where that matters.
 *
 * Pure functions: thread-safe, no allocation, never print.
 */
#ifndef KVP_PICKLE_H
#define KVP_PICKLE_H

#include <stddef.h>
#include <stdint.h>

/* Bytes that always suffice for kvp_pickle_block() with these sizes. */
size_t kvp_pickle_block_bound(size_t parent_len, size_t num_tokens, size_t extra_len);

/* kvp_pickle_block's flags. */
#define KVP_PICKLE_TAGS 1u /* extra keys are vLLM 0.33's tagged tuples: memoize the tags */

/*
 * Writes pickle.dumps((parent, tuple(tokens), extra), 5) to buf and its
 * length to *len. parent: parent_len (< 256) bytes. extra: one CBOR item
 * (NULL/0 for None). flags: 0 or KVP_PICKLE_TAGS. KVP_EINVAL: a bad
 * argument, extra not one item of the subset (or nested deeper than 4), or
 * cap below what is needed; *len is written only on success.
 */
int kvp_pickle_block(const uint8_t *parent, size_t parent_len, const int64_t *tokens, size_t n,
                     const uint8_t *extra, size_t extra_len, unsigned flags, uint8_t *buf,
                     size_t cap, size_t *len);

/* pickle.dumps(s, 5) for a NUL-terminated UTF-8 string; errors as above. */
int kvp_pickle_str(const char *s, uint8_t *buf, size_t cap, size_t *len);

#endif /* KVP_PICKLE_H */
