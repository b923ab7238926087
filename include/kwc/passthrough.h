/*
 * passthrough.h — forward one client request to the upstream and stream the
 * answer back: method, path, query, headers (minus hop-by-hop), body both ways
 * with flow control, status and headers, chunked or close-delimited bodies.
 *
 * Memory: each passthrough queues at most max_response_buffer bytes to its
 * client before reading from the upstream pauses; a pt_budget bounds them
 * all together (--max-passthrough-buffer): past it, the passthroughs that
 * hold more than an even share pause, so clients that never read cannot add
 * up to an unbounded total, while those that read keep going.
 */
#ifndef KWC_PASSTHROUGH_H
#define KWC_PASSTHROUGH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct up_client;
struct hreq;
struct pt_budget;

struct pt_options {
    size_t max_request_buffer;  /* request bytes held before reading from the client pauses */
    size_t max_response_buffer; /* response bytes queued to the client before the upstream pauses */
    bool strip_credentials;     /* drop the client's Authorization / Impersonate-* / X-Remote-* */
    bool long_running;          /* watch / follow: no upstream header timeout */
    struct pt_budget *budget;   /* shared by every passthrough of the loop; NULL: none */
};

/*
 * The process-wide budget of response bytes queued to passthrough clients
 * (max bytes, at least one). One per event loop; passthroughs run on the
 * front end's loop only. Free it after every request using it has closed.
 */
struct pt_budget *pt_budget_new(size_t max);
void pt_budget_free(struct pt_budget *b);
struct pt_budget_stats {
    size_t queued, max; /* bytes queued to clients now (as last seen), the cap */
    unsigned paused;    /* passthroughs paused by the cap now */
    uint64_t pauses;    /* times one was */
    /* passthroughs paused by their own max_response_buffer now */
    unsigned out_paused;
};
void pt_budget_stats(const struct pt_budget *b, struct pt_budget_stats *out);

/*
 * The budget's decision (pure): a passthrough that holds `held` bytes queued
 * to its client is given n more while all of them hold `total` (held
 * included) and `holders` of them (it included, if held > 0) hold any. Past
 * half the budget, it pauses when it holds more than an even share of that
 * half (max / 2 / holders): the largest holders stop first, and a client
 * that reads keeps its share, so one that never reads cannot starve it. Why
 * half: the passthroughs under their share keep going, so they may add up to
 * that half again; the total then stays within max plus one upstream read
 * per passthrough. One that holds nothing never pauses: only a queue that
 * drains can resume it (on_drain).
 */
bool pt_budget_should_pause(size_t total, size_t held, size_t n, size_t holders, size_t max);

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
