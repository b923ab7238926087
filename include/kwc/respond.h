/*
 * respond.h — small helpers shared by every handler in proxy/ that answers a
 * client through the response writer (http.h): Status errors, plain-text
 * answers, Audit-Id.
 */
#ifndef KWC_RESPOND_H
#define KWC_RESPOND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct hreq;

/* Answer with a Kubernetes Status (JSON, status "Failure"). reason NULL: the
 * usual reason for code. Sets Retry-After when retry_after > 0. */
void respond_status(struct hreq *r, int code, const char *reason, const char *message,
                    int retry_after);
/* Answer with a Status body already rendered (status_failure_json). */
void respond_status_body(struct hreq *r, int code, const char *body, int retry_after);
/* Answer with a short text/plain body ("ok"). */
void respond_text(struct hreq *r, int code, const char *text);
/* The same for len bytes (which may hold NUL). */
void respond_text_n(struct hreq *r, int code, const char *text, size_t len);

/* kube-apiserver's WithAuditInit: the client's Audit-ID when it sent a short
 * one, else a new random UUID (rng: the caller's xorshift128+ state, seeded
 * with respond_rng_seed; IDs need uniqueness, not secrecy). */
#define RESPOND_AUDIT_ID_LEN 40
void respond_rng_seed(uint64_t rng[2]);
void respond_audit_id(const struct hreq *r, uint64_t rng[2], char out[RESPOND_AUDIT_ID_LEN]);

#endif
