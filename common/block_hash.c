/* SPDX-License-Identifier: Apache-2.0 */
/*
 * SHA-256 through OpenSSL's one-algorithm interface (SHA256_Init, _Update,
 * _Final), deprecated in 3.0 but kept by it: EVP_DigestInit_ex2 on 3.0
 * allocates, cleanses and frees the provider's context on every digest,
 * and a block hash is one short digest (about a fifth of its instructions
 * went to that). The compression is the same code (SHA-NI, AVX2) either
 * way. A build that must route digests through a FIPS provider would put
 * the EVP calls back here; nothing else would change.
 */
#define OPENSSL_API_COMPAT 10101

#include "common/block_hash.h"

#include <openssl/rand.h>
#include <openssl/sha.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/*
 * XXH3-128 compiled in from Debian's libxxhash-dev header (XXH_INLINE_ALL):
 * no runtime library to link or ship, and the small-input path inlines.
 */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common/kvp_status.h"
#include "common/pickle.h"

struct kvp_hasher {
	SHA256_CTX sha;        /* the SHA-256 algorithms' state */
	XXH3_state_t *xx;      /* the xxhash algorithms' streaming state */
	enum kvp_hash_algo algo;
	enum kvp_keys_form form; /* the extra keys' form: tagged (vLLM 0.33) or plain */
	size_t len;            /* digest bytes: 32 or 16 */
	bool pickle;           /* the algorithm hashes pickle bytes, not CBOR */
	uint8_t *scratch;      /* a pickled block input; grows, kept */
	size_t scratch_cap;
	size_t none_len;       /* NONE_HASH bytes: 32 random, or one digest of the seed */
	uint8_t none_hash[KVP_HASH_LEN];
};

/* Grows the hasher's scratch buffer to at least n bytes. */
static int
scratch_reserve(struct kvp_hasher *h, size_t n)
{
	uint8_t *nb;

	if (n <= h->scratch_cap)
		return KVP_OK;
	if (n == SIZE_MAX || (nb = realloc(h->scratch, n)) == NULL)
		return KVP_ENOMEM;
	h->scratch = nb;
	h->scratch_cap = n;
	return KVP_OK;
}

/* ---- canonical CBOR (the subset vLLM's hash inputs use; spec 6.4) ---- */

#define CBOR_HEAD_MAX 9

static inline size_t
cbor_head(uint8_t *p, unsigned major, uint64_t n)
{
	uint8_t m = (uint8_t)(major << 5);

	if (n < 24) {
		p[0] = m | (uint8_t)n;
		return 1;
	}
	if (n <= 0xff) {
		p[0] = m | 24;
		p[1] = (uint8_t)n;
		return 2;
	}
	if (n <= 0xffff) {
		p[0] = m | 25;
		p[1] = (uint8_t)(n >> 8);
		p[2] = (uint8_t)n;
		return 3;
	}
	if (n <= 0xffffffffu) {
		p[0] = m | 26;
		p[1] = (uint8_t)(n >> 24);
		p[2] = (uint8_t)(n >> 16);
		p[3] = (uint8_t)(n >> 8);
		p[4] = (uint8_t)n;
		return 5;
	}
	p[0] = m | 27;
	for (int i = 0; i < 8; i++)
		p[1 + i] = (uint8_t)(n >> (56 - 8 * i));
	return 9;
}

static inline size_t
cbor_int(uint8_t *p, int64_t v)
{
	/* -1-v for negatives, computed without overflow at INT64_MIN. */
	return v >= 0 ? cbor_head(p, 0, (uint64_t)v) : cbor_head(p, 1, ~(uint64_t)v);
}

/*
 * cbor_int for the common case, a token id in [0, 2^32), without branches
 * on its size: token sizes are random, and a mispredicted branch per token
 * costs more than the rest of the encoding. Writes 8 bytes (the caller
 * leaves room) and returns how many count.
 */
static inline size_t
cbor_token(uint8_t *p, int64_t v)
{
	static const uint8_t lens[4] = {1, 2, 3, 5};

	if ((uint64_t)v >= (1ull << 32))
		return cbor_int(p, v); /* negative or wide: rare, predictable */
	uint32_t u = (uint32_t)v;
	unsigned cls = (u >= 24) + (u >= 256) + (u >= 65536);
	unsigned l = lens[cls];
	uint64_t head = cls ? 0x17u + cls : 0;
	uint64_t word = (head << (8 * (l - 1))) | u;
	uint64_t x = word << (64 - 8 * l), be;
#if defined(__GNUC__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	be = __builtin_bswap64(x);
#else
	uint8_t bytes[8];
	for (int i = 0; i < 8; i++)
		bytes[i] = (uint8_t)(x >> (56 - 8 * i));
	memcpy(&be, bytes, 8);
#endif
	memcpy(p, &be, 8);
	return l;
}

static size_t
cbor_str(uint8_t *p, const char *s)
{
	size_t n = strlen(s);
	size_t h = cbor_head(p, 3, n);
	memcpy(p + h, s, n);
	return h + n;
}

/* ---- hasher ---- */

int
kvp_hasher_create(const char *seed, struct kvp_hasher **out)
{
	return kvp_hasher_create_algo(seed, KVP_HASH_SHA256_CBOR, out);
}

int
kvp_hasher_create_algo(const char *seed, enum kvp_hash_algo algo, struct kvp_hasher **out)
{
	struct kvp_hasher *h;
	int rv = KVP_OK;

	if (out == NULL || kvp_hash_algo_name(algo) == NULL)
		return KVP_EINVAL;
	if ((h = calloc(1, sizeof(*h))) == NULL)
		return KVP_ENOMEM;
	h->algo = algo;
	h->len = kvp_hash_algo_len(algo);
	h->pickle = kvp_hash_algo_pickle(algo);
	if (h->len == 16) {
		if ((h->xx = XXH3_createState()) == NULL) {
			kvp_hasher_destroy(h);
			return KVP_ENOMEM;
		}
	}
	if (seed != NULL) {
		/* NONE_HASH = hash_fn(seed string): the string in the algorithm's encoding. */
		size_t n = strlen(seed), len = 0;
		uint8_t *buf = malloc(n + 32);
		if (buf == NULL) {
			kvp_hasher_destroy(h);
			return KVP_ENOMEM;
		}
		if (h->pickle)
			rv = kvp_pickle_str(seed, buf, n + 32, &len);
		else
			len = cbor_str(buf, seed);
		if (rv == KVP_OK)
			rv = kvp_hash_raw(h, buf, len, h->none_hash);
		h->none_len = h->len;
		free(buf);
	} else {
		/* vLLM: os.urandom(32) whatever the algorithm's digest length. */
		h->none_len = KVP_HASH_LEN;
		if (RAND_bytes(h->none_hash, KVP_HASH_LEN) != 1)
			rv = KVP_EINTERNAL;
	}
	if (rv != KVP_OK) {
		kvp_hasher_destroy(h);
		return rv;
	}
	*out = h;
	return KVP_OK;
}

void
kvp_hasher_destroy(struct kvp_hasher *h)
{
	if (h == NULL)
		return;
	XXH3_freeState(h->xx);
	free(h->scratch);
	free(h);
}

const uint8_t *
kvp_hasher_none_hash(const struct kvp_hasher *h)
{
	return h->none_hash;
}

size_t
kvp_hasher_none_len(const struct kvp_hasher *h)
{
	return h->none_len;
}

enum kvp_hash_algo
kvp_hasher_algo(const struct kvp_hasher *h)
{
	return h->algo;
}

size_t
kvp_hasher_len(const struct kvp_hasher *h)
{
	return h->len;
}

int
kvp_hasher_set_keys_form(struct kvp_hasher *h, enum kvp_keys_form form)
{
	if (h == NULL || (form != KVP_KEYS_TAGGED && form != KVP_KEYS_PLAIN))
		return KVP_EINVAL;
	h->form = form;
	return KVP_OK;
}

enum kvp_keys_form
kvp_hasher_keys_form(const struct kvp_hasher *h)
{
	return h->form;
}

/* ---- the digest: SHA-256 (OpenSSL) or XXH3-128 in canonical (big-endian) form ---- */

static bool
digest_init(struct kvp_hasher *h)
{
	if (h->xx != NULL)
		return XXH3_128bits_reset(h->xx) == XXH_OK;
	return SHA256_Init(&h->sha) == 1;
}

static bool
digest_update(struct kvp_hasher *h, const void *data, size_t len)
{
	if (h->xx != NULL)
		return XXH3_128bits_update(h->xx, data, len) == XXH_OK;
	return SHA256_Update(&h->sha, data, len) == 1;
}

/* python-xxhash's xxh3_128_digest is the canonical (big-endian) form. */
static void
xxh128_out(XXH128_hash_t v, uint8_t *out)
{
	XXH128_canonical_t c;
	XXH128_canonicalFromHash(&c, v);
	memcpy(out, c.digest, sizeof(c.digest));
}

/* Writes h->len bytes. */
static bool
digest_final(struct kvp_hasher *h, uint8_t *out)
{
	if (h->xx != NULL) {
		xxh128_out(XXH3_128bits_digest(h->xx), out);
		return true;
	}
	return SHA256_Final(out, &h->sha) == 1;
}

/* The digest of one buffer; XXH3's one-shot call skips its streaming state. */
static bool
digest_once(struct kvp_hasher *h, const void *data, size_t len, uint8_t *out)
{
	if (h->xx != NULL) {
		xxh128_out(XXH3_128bits(data, len), out);
		return true;
	}
	return digest_init(h) && digest_update(h, data, len) && digest_final(h, out);
}

/* The pickle's flags for the hasher's extra keys: tagged keys memoize their tags. */
static unsigned
pickle_flags(const struct kvp_hasher *h)
{
	return h->form == KVP_KEYS_TAGGED ? KVP_PICKLE_TAGS : 0;
}

/* sha256, xxhash: the digest of the block's pickle, built in the hasher's scratch buffer. */
static int
hash_block_pickle(struct kvp_hasher *h, const uint8_t *parent, const int64_t *tokens, size_t n,
                  const uint8_t *extra, size_t extra_len, uint8_t *out)
{
	size_t len = 0;
	int rv = scratch_reserve(h, kvp_pickle_block_bound(KVP_HASH_LEN, n, extra_len));

	if (rv == KVP_OK)
		rv = kvp_pickle_block(parent ? parent : h->none_hash, parent ? h->len : h->none_len,
		                      tokens, n, extra, extra_len, pickle_flags(h), h->scratch,
		                      h->scratch_cap, &len);
	return rv == KVP_OK ? kvp_hash_raw(h, h->scratch, len, out) : rv;
}

int
kvp_hash_raw(struct kvp_hasher *h, const void *data, size_t len, uint8_t *out)
{
	if (h == NULL || (data == NULL && len > 0) || out == NULL)
		return KVP_EINVAL;
	return digest_once(h, data, len, out) ? KVP_OK : KVP_EINTERNAL;
}

int
kvp_hash_block(struct kvp_hasher *h, const uint8_t *parent, const int64_t *tokens,
               size_t n, const uint8_t *extra, size_t extra_len, uint8_t *out)
{
	/*
	 * Encoded in chunks so any block size hashes without allocating; a
	 * usual block (16 tokens) is one chunk and one digest update, which
	 * matters: an update costs as much as encoding a dozen tokens.
	 */
	uint8_t buf[1024];
	size_t len = 0, plen;
	bool ok = true, started = false;

	if (h == NULL || (tokens == NULL && n > 0) || out == NULL ||
	    (extra == NULL && extra_len > 0))
		return KVP_EINVAL;
	if (h->pickle)
		return hash_block_pickle(h, parent, tokens, n, extra, extra_len, out);
	plen = parent ? h->len : h->none_len;
	buf[len++] = 0x83;
	len += cbor_head(buf + len, 2, plen);
	memcpy(buf + len, parent ? parent : h->none_hash, plen);
	len += plen;
	len += cbor_head(buf + len, 4, n);
	for (size_t i = 0; i < n; i++) {
		if (len > sizeof(buf) - CBOR_HEAD_MAX) {
			if (!started) {
				ok &= digest_init(h);
				started = true;
			}
			ok &= digest_update(h, buf, len);
			len = 0;
		}
		len += cbor_token(buf + len, tokens[i]);
	}
	if (extra_len == 0) {
		extra = (const uint8_t *)"\xf6";
		extra_len = 1;
	}
	if (!started && extra_len <= sizeof(buf) - len) {
		/* The usual block: one buffer, one one-shot digest (no streaming state). */
		memcpy(buf + len, extra, extra_len);
		return digest_once(h, buf, len + extra_len, out) ? KVP_OK : KVP_EINTERNAL;
	}
	if (!started)
		ok &= digest_init(h);
	if (extra_len <= sizeof(buf) - len) {
		memcpy(buf + len, extra, extra_len);
		ok &= digest_update(h, buf, len + extra_len);
	} else {
		ok &= digest_update(h, buf, len);
		ok &= digest_update(h, extra, extra_len);
	}
	ok &= digest_final(h, out);
	return ok ? KVP_OK : KVP_EINTERNAL;
}

int
kvp_hash_block_input(const struct kvp_hasher *h, const uint8_t *parent,
                     const int64_t *tokens, size_t n, const uint8_t *extra,
                     size_t extra_len, uint8_t *buf, size_t cap, size_t *len)
{
	size_t k = 0, plen;
	uint8_t scratch[CBOR_HEAD_MAX];
	size_t need;

	if (h == NULL || (tokens == NULL && n > 0) || buf == NULL || len == NULL ||
	    (extra == NULL && extra_len > 0) || n > (SIZE_MAX - 64 - extra_len) / 9)
		return KVP_EINVAL;
	plen = parent ? h->len : h->none_len;
	if (h->pickle)
		return kvp_pickle_block(parent ? parent : h->none_hash, plen, tokens, n, extra,
		                        extra_len, pickle_flags(h), buf, cap, len);
	need = 3 + plen + cbor_head(scratch, 4, n) + (extra_len ? extra_len : 1);
	for (size_t i = 0; i < n; i++)
		need += cbor_int(scratch, tokens[i]);
	if (cap < need)
		return KVP_EINVAL;
	buf[k++] = 0x83;
	k += cbor_head(buf + k, 2, plen);
	memcpy(buf + k, parent ? parent : h->none_hash, plen);
	k += plen;
	k += cbor_head(buf + k, 4, n);
	for (size_t i = 0; i < n; i++)
		k += cbor_int(buf + k, tokens[i]);
	if (extra_len == 0) {
		buf[k++] = 0xf6;
	} else {
		memcpy(buf + k, extra, extra_len);
		k += extra_len;
	}
	*len = k;
	return KVP_OK;
}

/* ---- extra keys (spec 6.6) ---- */

/* True if s (NULL: none) is longer than KVP_MAX_KEY_LEN; reads at most that far. */
static bool
key_too_long(const char *s)
{
	if (s == NULL)
		return false;
	for (size_t i = 0; i <= KVP_MAX_KEY_LEN; i++)
		if (s[i] == '\0')
			return false;
	return true;
}

int
kvp_request_keys_validate(const struct kvp_request_keys *k)
{
	if (k == NULL)
		return KVP_OK;
	if (k->num_mm > 0 && k->mm == NULL)
		return KVP_EINVAL;
	if (key_too_long(k->lora_name) || key_too_long(k->lora_path) ||
	    key_too_long(k->cache_salt) || key_too_long(k->session_id))
		return KVP_EINVAL;
	if (k->lora_path != NULL && k->lora_name == NULL)
		return KVP_EINVAL; /* a path names nothing without its adapter's name */
	for (size_t i = 0; i < k->num_mm; i++) {
		const struct kvp_mm_feature *f = &k->mm[i];
		if (f->identifier == NULL || f->offset < 0 || f->length < 1 ||
		    f->length > INT64_MAX - f->offset || key_too_long(f->identifier))
			return KVP_EINVAL;
		if (i > 0 && f->offset < k->mm[i - 1].offset)
			return KVP_EINVAL;
	}
	return KVP_OK;
}

/* vLLM 0.33's tags, as CBOR text items. */
#define TAG_LORA "\x64lora"
#define TAG_MM "\x62mm"
#define TAG_SALT "\x6a" "cache_salt"
#define TAG_LEN(t) (sizeof(t) - 1)

size_t
kvp_extra_keys_max_len(const struct kvp_request_keys *k)
{
	size_t n = CBOR_HEAD_MAX;

	if (k == NULL)
		return n;
	/* The tagged form's, which bounds the plain form's too: each key is a
	 * one-byte array head, its tag, then the plain form's items. */
	if (k->lora_name)
		n += 1 + TAG_LEN(TAG_LORA) + 2 * CBOR_HEAD_MAX + strlen(k->lora_name) +
		     (k->lora_path ? strlen(k->lora_path) : 0);
	if (k->cache_salt)
		n += 1 + TAG_LEN(TAG_SALT) + CBOR_HEAD_MAX + strlen(k->cache_salt);
	for (size_t i = 0; i < k->num_mm; i++)
		n += 1 + TAG_LEN(TAG_MM) + CBOR_HEAD_MAX + strlen(k->mm[i].identifier) + CBOR_HEAD_MAX;
	return n;
}

/* Appends a tag's CBOR text item. */
static size_t
put_tag(uint8_t *p, const char *tag, size_t n)
{
	memcpy(p, tag, n);
	return n;
}

/* _gen_mm_extra_hash_keys, iteration for iteration. Returns the item count. */
static size_t
mm_keys(const struct kvp_request_keys *k, enum kvp_keys_form form, int64_t start, int64_t end,
        int64_t *mm_idx, uint8_t *p, size_t *len)
{
	size_t items = 0;
	int64_t n = (int64_t)k->num_mm, cur;
	const struct kvp_mm_feature *last;

	if (n == 0)
		return 0;
	last = &k->mm[n - 1];
	if (last->offset + last->length <= start)
		return 0; /* every feature ended at or before the block */
	cur = *mm_idx < 0 ? n + *mm_idx : *mm_idx;
	if (cur < 0)
		cur = 0; /* vLLM asserts -idx <= len; we only produce -1 */
	while (cur < n) {
		const struct kvp_mm_feature *f = &k->mm[cur];
		if (!(end > f->offset))
			break; /* the block has not reached this feature */
		if (start >= f->offset + f->length) {
			cur++; /* the block has passed it */
			continue;
		}
		if (form == KVP_KEYS_TAGGED) {
			p[(*len)++] = 0x83;
			*len += put_tag(p + *len, TAG_MM, TAG_LEN(TAG_MM));
		} else {
			p[(*len)++] = 0x82;
		}
		*len += cbor_str(p + *len, f->identifier);
		*len += cbor_int(p + *len, f->offset - start);
		items++;
		if (end >= f->offset + f->length)
			cur++; /* the block may also hold the next feature */
		else
			break;
	}
	*mm_idx = cur;
	return items;
}

int
kvp_extra_keys_encode(const struct kvp_request_keys *k, enum kvp_keys_form form,
                      int64_t start, int64_t end, int64_t *mm_idx, uint8_t *buf, size_t cap,
                      size_t *len)
{
	uint8_t mm[1024], *mmbuf = mm;
	size_t mmlen = 0, items = 0, n = 0, need;
	int64_t idx_dummy = 0;
	const bool tagged = form == KVP_KEYS_TAGGED;

	if (buf == NULL || len == NULL || (need = kvp_extra_keys_max_len(k)) > cap ||
	    (form != KVP_KEYS_TAGGED && form != KVP_KEYS_PLAIN) ||
	    (tagged && k != NULL && k->lora_name != NULL && k->lora_path == NULL))
		return KVP_EINVAL;
	if (mm_idx == NULL)
		mm_idx = &idx_dummy;
	if (k == NULL) {
		buf[0] = 0xf6;
		*len = 1;
		return KVP_OK;
	}
	/* The mm items come second but their count is known only after the walk. */
	if (need > sizeof(mm) && (mmbuf = malloc(need)) == NULL)
		return KVP_ENOMEM;
	size_t nmm = mm_keys(k, form, start, end, mm_idx, mmbuf, &mmlen);
	items = (k->lora_name ? 1 : 0) + nmm +
	        (start == 0 && k->cache_salt && k->cache_salt[0] ? 1 : 0);
	if (items == 0) {
		buf[n++] = 0xf6;
	} else {
		n += cbor_head(buf, 4, items);
		if (k->lora_name && tagged) {
			buf[n++] = 0x83;
			n += put_tag(buf + n, TAG_LORA, TAG_LEN(TAG_LORA));
			n += cbor_str(buf + n, k->lora_name);
			n += cbor_str(buf + n, k->lora_path);
		} else if (k->lora_name) {
			n += cbor_str(buf + n, k->lora_name);
		}
		memcpy(buf + n, mmbuf, mmlen);
		n += mmlen;
		if (start == 0 && k->cache_salt && k->cache_salt[0]) {
			if (tagged) {
				buf[n++] = 0x82;
				n += put_tag(buf + n, TAG_SALT, TAG_LEN(TAG_SALT));
			}
			n += cbor_str(buf + n, k->cache_salt);
		}
	}
	if (mmbuf != mm)
		free(mmbuf);
	*len = n;
	return KVP_OK;
}

int
kvp_hash_chain(struct kvp_hasher *h, const struct kvp_request_keys *k, const int64_t *tokens,
               size_t num_tokens, uint32_t block_size, size_t first_block,
               const uint8_t *parent, uint8_t *out, size_t cap, size_t *num_out)
{
	uint8_t ebuf_small[512], *ebuf = ebuf_small;
	size_t ecap = sizeof(ebuf_small), full, count = 0;
	int64_t mm_idx;
	int rv = KVP_OK;

	if (h == NULL || block_size == 0 || (tokens == NULL && num_tokens > 0) ||
	    num_out == NULL || (first_block > 0 && parent == NULL) ||
	    first_block > (size_t)INT64_MAX / block_size || kvp_request_keys_validate(k) != KVP_OK)
		return KVP_EINVAL;
	full = num_tokens / block_size;
	if (full > 0 && (out == NULL || cap < full))
		return KVP_EINVAL;
	if (kvp_extra_keys_max_len(k) > ecap) {
		ecap = kvp_extra_keys_max_len(k);
		if ((ebuf = malloc(ecap)) == NULL)
			return KVP_ENOMEM;
	}
	/*
	 * vLLM 9aaf83ef5 starts the multimodal walk at the last feature for a
	 * later block. vLLM 0.33 starts it at the first feature that ends after
	 * the block's start; the walk from 0 skips the ones before it, the same.
	 */
	mm_idx = first_block > 0 && h->form == KVP_KEYS_PLAIN ? -1 : 0;
	for (size_t b = 0; b < full && rv == KVP_OK; b++, count++) {
		int64_t start = (int64_t)(first_block + b) * block_size;
		size_t elen = 0;
		uint8_t *dst = out + count * h->len;
		/* A request with no extra-key sources hashes None: skip the encoder. */
		if (k != NULL)
			rv = kvp_extra_keys_encode(k, h->form, start, start + block_size, &mm_idx,
			                           ebuf, ecap, &elen);
		if (rv == KVP_OK)
			rv = kvp_hash_block(h, parent, tokens + b * block_size, block_size,
			                    k ? ebuf : NULL, k ? elen : 0, dst);
		parent = dst;
	}
	if (ebuf != ebuf_small)
		free(ebuf);
	if (rv != KVP_OK)
		return rv;
	*num_out = count;
	return KVP_OK;
}

int
kvp_hash_request(struct kvp_hasher *h, const struct kvp_request_keys *k,
                 const int64_t *tokens, size_t num_tokens, uint32_t block_size,
                 const uint8_t *prev, size_t num_prev, uint8_t *out, size_t cap,
                 size_t *num_out)
{
	if (h == NULL || block_size == 0 || (tokens == NULL && num_tokens > 0) ||
	    (prev == NULL && num_prev > 0) || num_out == NULL)
		return KVP_EINVAL;
	if (num_tokens / block_size <= num_prev) {
		if (kvp_request_keys_validate(k) != KVP_OK)
			return KVP_EINVAL;
		*num_out = 0;
		return KVP_OK;
	}
	size_t start = num_prev * block_size;
	return kvp_hash_chain(h, k, tokens + start, num_tokens - start, block_size, num_prev,
	                      num_prev > 0 ? prev + (num_prev - 1) * h->len : NULL, out, cap,
	                      num_out);
}

uint64_t
kvp_hash_event_id(const uint8_t *hash, size_t len)
{
	uint64_t v = 0;

	if (len >= 8) { /* the last 8 bytes, big-endian: one load (every event's hashes) */
		memcpy(&v, hash + len - 8, 8);
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
		v = __builtin_bswap64(v);
#endif
		return v;
	}
	for (size_t i = 0; i < len; i++)
		v = (v << 8) | hash[i];
	return v;
}
