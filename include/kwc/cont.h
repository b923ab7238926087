/*
 * cont.h — list continue tokens in kube-apiserver's format, so a page chain
 * can move between kwc and the upstream in either direction.
 *
 * A token is URL-safe base64 without padding (Go's base64.RawURLEncoding) of
 * the JSON {"v":"meta.k8s.io/v1","rv":N,"start":"<key>"} where <key> is the
 * next key to read (inclusive), relative to the request's key prefix: for a
 * namespaced resource listed cluster-wide "<ns>/<name>\u0000", within one
 * namespace or for a cluster-scoped resource "<name>\u0000" (the last key
 * returned plus a NUL, the smallest key after it). rv < 0 means "the latest
 * state" (kube-apiserver issues such tokens with its 410 for a compacted
 * continue); rv 0 is invalid.
 *
 * Reference: k8s.io/apiserver/pkg/storage/continue.go (EncodeContinue,
 * DecodeContinue). Pure: no I/O.
 */
#ifndef KWC_CONT_H
#define KWC_CONT_H

#include <stddef.h>
#include <stdint.h>

/* Longest token decoded. Keys are at most ~320 bytes (a 63-byte namespace and
 * a 253-byte name), so real tokens stay far below. */
#define CONT_MAX_TOKEN 4096

/* A decoded token. */
struct cont_token {
    int64_t rv;  /* > 0: list at exactly rv; < 0: at the latest rv */
    char *start; /* next key to read, inclusive, relative to the prefix
                  * (NUL-terminated, but may also hold NULs: use start_len) */
    size_t start_len;
};

/*
 * Encode the token for the page that ended with last_key (relative to the
 * request's prefix; any bytes): start = last_key + "\0", byte for byte what
 * kube-apiserver's EncodeContinue writes (Go's json.Marshal escaping).
 * *out: new NUL-terminated token. Returns 0 or KWC_ETOOBIG when the token would
 * exceed CONT_MAX_TOKEN (then cont_decode could not read it back).
 */
int cont_encode(int64_t rv, const char *last_key, size_t last_key_len, char **out);

/*
 * Decode len bytes of token (need not be NUL-terminated). Every token this
 * accepts, DecodeContinue accepts too, with the same rv and start key; the
 * converse does not hold. Besides every token DecodeContinue rejects, this
 * also refuses the odd ones Go's lenient decoders let through (base64 with
 * CR/LF, JSON with unknown, duplicate or case-folded keys, nulls, invalid
 * UTF-8 or lone surrogates): the caller passes any refused token to the
 * upstream, which answers exactly as kube-apiserver does, its 400 "invalid
 * continue token: ..." or a page. Returns:
 *   0            *out filled (cont_token_fini releases it);
 *   KWC_ETOOBIG  len > CONT_MAX_TOKEN, nothing read;
 *   KWC_EPARSE   not a token this decodes.
 */
int cont_decode(const char *token, size_t len, struct cont_token *out);

/* Free what cont_decode filled; accepts NULL and a zeroed struct. */
void cont_token_fini(struct cont_token *t);

#endif
