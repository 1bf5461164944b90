/* SPDX-License-Identifier: Apache-2.0 */
/* vLLM's prefix-caching hash algorithms: names, digest lengths, encodings (block_hash.h). */
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "common/block_hash.h"
#include "common/kvp_status.h"

/* One table: the algorithm, vLLM's name for it, its encoding, its digest. */
static const struct {
	const char *name;
	bool pickle;
	size_t len;
} algos[] = {
	[KVP_HASH_SHA256_CBOR] = {"sha256_cbor", false, 32},
	[KVP_HASH_SHA256] = {"sha256", true, 32},
	[KVP_HASH_XXHASH] = {"xxhash", true, 16},
	[KVP_HASH_XXHASH_CBOR] = {"xxhash_cbor", false, 16},
};
#define NUM_ALGOS (sizeof(algos) / sizeof(algos[0]))

const char *
kvp_hash_algo_name(enum kvp_hash_algo algo)
{
	if ((unsigned)algo >= NUM_ALGOS)
		return NULL;
	return algos[algo].name;
}

size_t
kvp_hash_algo_len(enum kvp_hash_algo algo)
{
	return (unsigned)algo < NUM_ALGOS ? algos[algo].len : 0;
}

bool
kvp_hash_algo_pickle(enum kvp_hash_algo algo)
{
	return (unsigned)algo < NUM_ALGOS && algos[algo].pickle;
}

int
kvp_hash_algo_parse(const char *name, enum kvp_hash_algo *out)
{
	if (name == NULL || out == NULL)
		return KVP_EINVAL;
	for (size_t i = 0; i < NUM_ALGOS; i++) {
		if (strcmp(name, algos[i].name) == 0) {
			*out = (enum kvp_hash_algo)i;
			return KVP_OK;
		}
	}
	return KVP_EINVAL;
}
