/*
 * status.h — Kubernetes metav1.Status bodies, as kube-apiserver writes them.
 * Pure: returns bytes, sends nothing. Every error a client sees from kwc is
 * one of these, with the HTTP code matching "code".
 */
#ifndef KWC_STATUS_H
#define KWC_STATUS_H

#include <stddef.h>

/* One entry of details.causes. */
struct status_cause {
    const char *reason;  /* e.g. "ResourceVersionTooLarge" */
    const char *message; /* may be NULL */
    const char *field;   /* may be NULL */
};

struct status_details {
    const char *name, *group, *kind; /* each may be NULL */
    const struct status_cause *causes;
    size_t ncauses;
    int retry_after_seconds; /* 0 = absent */
};

/*
 * Render a failure Status as compact JSON (new string, caller frees).
 * reason: a metav1.StatusReason ("NotFound", "ServiceUnavailable", ...) or
 * NULL/"" for none. details may be NULL.
 */
char *status_failure_json(int code, const char *reason, const char *message,
                          const struct status_details *details);

/* The reason kube-apiserver pairs with a bare HTTP code (e.g. 503 -> "ServiceUnavailable"). */
const char *status_reason_for_code(int code);

#endif
