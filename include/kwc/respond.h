/*
 * respond.h — small helpers shared by every handler in proxy/ that answers a
 * client: Status errors, plain-text answers, and ending a streamed response
 * (cleanly, or by closing so the client sees it was cut short).
 */
#ifndef KWC_RESPOND_H
#define KWC_RESPOND_H

#include <evhtp/evhtp.h>
#include <stdbool.h>
#include <stdint.h>

/* Answer with a Kubernetes Status (JSON, status "Failure"). reason NULL: the
 * usual reason for code. Sets Retry-After when retry_after > 0. */
void respond_status(evhtp_request_t *req, int code, const char *reason, const char *message,
                    int retry_after);
/* Answer with a Status body already rendered (status_failure_json). */
void respond_status_body(evhtp_request_t *req, int code, const char *body, int retry_after);
/* Answer with a short text/plain body ("ok"). */
void respond_text(evhtp_request_t *req, int code, const char *text);
/* Finish a response begun with evhtp_send_reply_start/_chunk_start.
 * clean=false closes the connection without a terminal chunk so the client
 * knows the body is incomplete. */
void respond_end_stream(evhtp_request_t *req, bool chunked, bool clean);
/* Close the connection once this response is written. */
void respond_no_keepalive(evhtp_request_t *req);
/* Read and drop the body of a request kwc answers itself; past max bytes
 * libevhtp closes the connection (its count is per request). */
void respond_discard_body(evhtp_request_t *req, size_t max);
/* Add a response header (both strings copied). */
void respond_header(evhtp_request_t *req, const char *name, const char *value);

/* kube-apiserver's WithAuditInit: the client's Audit-ID when it sent a short
 * one, else a new random UUID (rng: the caller's xorshift128+ state, seeded
 * with respond_rng_seed; IDs need uniqueness, not secrecy). */
#define RESPOND_AUDIT_ID_LEN 40
void respond_rng_seed(uint64_t rng[2]);
void respond_audit_id(evhtp_request_t *req, uint64_t rng[2], char out[RESPOND_AUDIT_ID_LEN]);

#endif
