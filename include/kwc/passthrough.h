/*
 * passthrough.h — forward one client request to the upstream and stream the
 * answer back: method, path, query, headers (minus hop-by-hop), body both ways
 * with flow control, status and headers, chunked or close-delimited bodies.
 */
#ifndef KWC_PASSTHROUGH_H
#define KWC_PASSTHROUGH_H

#include <stdbool.h>
#include <stddef.h>

struct up_client;
struct hreq;

struct pt_options {
    size_t max_request_buffer;  /* request bytes held before reading from the client pauses */
    size_t max_response_buffer; /* response bytes queued to the client before the upstream pauses */
    bool strip_credentials;     /* drop the client's Authorization / Impersonate-* / X-Remote-* */
    bool long_running;          /* watch / follow: no upstream header timeout */
};

/*
 * Take over req (call when its head has been read, before the body): the
 * passthrough installs its own hooks, answers req on every path (Status
 * 502/503/504 when the upstream fails before answering) and frees its state
 * in the request's on_close. up and o are borrowed and must outlive req.
 */
void pt_forward(struct hreq *req, struct up_client *up, const struct pt_options *o);

/* The same for a request already read in full, whose body (if any) was
 * discarded: a read kwc meant to answer from its cache and then handed to the
 * upstream (a NotOlderThan rv the cache did not reach in time). No body is
 * sent upstream. */
void pt_forward_read(struct hreq *req, struct up_client *up, const struct pt_options *o);

#endif
