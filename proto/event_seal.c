/* SPDX-License-Identifier: Apache-2.0 */
#include "proto/event_seal.h"

#include <limits.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/kvp_status.h"
#include "kvpool.pb-c.h"
#include "proto/event_wire.h"

#define MAX_PLAIN (1u << 30)

int
kvp_seal_key_new(struct kvp_seal_key *k)
{
	if (k == NULL)
		return KVP_EINVAL;
	do {
		uint8_t id[4];
		if (RAND_bytes(k->key, KVP_SEAL_KEY_LEN) != 1 || RAND_bytes(id, 4) != 1)
			return KVP_EINTERNAL;
		k->id = (uint32_t)id[0] << 24 | (uint32_t)id[1] << 16 | (uint32_t)id[2] << 8 | id[3];
	} while (k->id == 0);
	return KVP_OK;
}

static void
nonce(uint8_t iv[12], uint32_t key_id, uint64_t counter)
{
	for (int i = 0; i < 4; i++)
		iv[i] = (uint8_t)(key_id >> (24 - 8 * i));
	for (int i = 0; i < 8; i++)
		iv[4 + i] = (uint8_t)(counter >> (56 - 8 * i));
}

/*
 * AES-256-GCM over in[0..len) into out (len bytes, then the tag when
 * sealing; the tag is read from in + len when opening). false on failure,
 * including a tag that does not match.
 */
static bool
gcm(bool seal, const uint8_t *key, const uint8_t iv[12], const char *aad, const uint8_t *in,
    size_t len, uint8_t *out)
{
	EVP_CIPHER_CTX *x = EVP_CIPHER_CTX_new();
	int n = 0, m = 0;
	bool ok = x != NULL;

	ok = ok && (seal ? EVP_EncryptInit_ex(x, EVP_aes_256_gcm(), NULL, NULL, NULL)
	                 : EVP_DecryptInit_ex(x, EVP_aes_256_gcm(), NULL, NULL, NULL)) == 1;
	ok = ok && EVP_CIPHER_CTX_ctrl(x, EVP_CTRL_GCM_SET_IVLEN, 12, NULL) == 1;
	ok = ok && EVP_CipherInit_ex(x, NULL, NULL, key, iv, seal ? 1 : 0) == 1;
	ok = ok && EVP_CipherUpdate(x, NULL, &n, (const uint8_t *)aad, (int)strlen(aad)) == 1;
	ok = ok && (len == 0 || EVP_CipherUpdate(x, out, &n, in, (int)len) == 1);
	if (ok && !seal)
		ok = EVP_CIPHER_CTX_ctrl(x, EVP_CTRL_GCM_SET_TAG, KVP_SEAL_TAG_LEN,
		                         (void *)(uintptr_t)(in + len)) == 1;
	ok = ok && EVP_CipherFinal_ex(x, out + (len ? n : 0), &m) == 1;
	if (ok && seal)
		ok = EVP_CIPHER_CTX_ctrl(x, EVP_CTRL_GCM_GET_TAG, KVP_SEAL_TAG_LEN, out + len) == 1;
	EVP_CIPHER_CTX_free(x);
	return ok;
}

int
kvp_seal_batch(const struct kvp_seal_key *k, uint64_t counter, const char *pool,
               const uint8_t *plain, size_t len, uint8_t **out, size_t *out_len)
{
	Kvpool__V1__EventBatch b = KVPOOL__V1__EVENT_BATCH__INIT;
	uint8_t iv[12], *ct;

	if (k == NULL || pool == NULL || (plain == NULL && len > 0) || out == NULL ||
	    out_len == NULL || len > MAX_PLAIN || strlen(pool) > KVP_WIRE_EVENTS_MAX_POOL)
		return KVP_EINVAL;
	if ((ct = malloc(len + KVP_SEAL_TAG_LEN)) == NULL)
		return KVP_ENOMEM;
	nonce(iv, k->id, counter);
	if (!gcm(true, k->key, iv, pool, plain, len, ct)) {
		free(ct);
		return KVP_EINTERNAL;
	}
	b.pool = (char *)pool;
	b.key_id = k->id;
	b.counter = counter;
	b.sealed.data = ct;
	b.sealed.len = len + KVP_SEAL_TAG_LEN;
	*out_len = kvpool__v1__event_batch__get_packed_size(&b);
	if ((*out = malloc(*out_len)) != NULL)
		kvpool__v1__event_batch__pack(&b, *out);
	free(ct);
	return *out ? KVP_OK : KVP_ENOMEM;
}

int
kvp_seal_open(const struct kvp_seal_key *k, const uint8_t *bytes, size_t len, uint8_t **plain,
              size_t *plain_len, uint32_t *key_id)
{
	Kvpool__V1__EventBatch *b;
	uint8_t iv[12];
	int rv = KVP_OK;

	if (k == NULL || bytes == NULL || plain == NULL || plain_len == NULL)
		return KVP_EINVAL;
	if ((b = kvpool__v1__event_batch__unpack(NULL, len, bytes)) == NULL)
		return KVP_EINVAL;
	if (key_id != NULL)
		*key_id = b->key_id;
	size_t n = b->sealed.len;
	if (n < KVP_SEAL_TAG_LEN || n - KVP_SEAL_TAG_LEN > MAX_PLAIN || b->pool == NULL)
		rv = KVP_EINVAL;
	else if (b->key_id != k->id)
		rv = KVP_ENOTFOUND;
	else if ((*plain = malloc(n - KVP_SEAL_TAG_LEN + 1)) == NULL)
		rv = KVP_ENOMEM;
	if (rv == KVP_OK) {
		nonce(iv, b->key_id, b->counter);
		if (!gcm(false, k->key, iv, b->pool, b->sealed.data, n - KVP_SEAL_TAG_LEN, *plain)) {
			free(*plain);
			*plain = NULL;
			rv = KVP_EINVAL;
		} else {
			*plain_len = n - KVP_SEAL_TAG_LEN;
		}
	}
	kvpool__v1__event_batch__free_unpacked(b, NULL);
	return rv;
}
