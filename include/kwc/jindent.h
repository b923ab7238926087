/*
 * jindent.h — compact JSON re-indented as Go's json.MarshalIndent(v, "", "  ")
 * writes it (kube-apiserver's pretty output: ?pretty=true, curl-like
 * User-Agents, an Accept clause with pretty=1), streamed.
 *
 * The rules are encoding/json's Indent over Marshal's compact output: after
 * '{' or '[' and after ',' a newline and two spaces per open container;
 * ": " after a key; an empty {} or [] stays as it is; string contents are
 * copied untouched (escapes included); whitespace outside strings is
 * dropped, so the compact answer's final "\n" disappears (MarshalIndent
 * writes none).
 *
 * Streaming: the input comes in pieces split anywhere (inside a string, an
 * escape, a number), the output leaves in pieces of at most the room the
 * caller gives. The state is a few counters, whatever the depth: a newline's
 * indentation is a count of spaces still to write, never a buffer, so the
 * caller bounds the memory of an answer however much the indentation grows
 * it (deep nesting grows it by 2 bytes per level per line).
 *
 * The input is not validated (it is kwc's own compact encoding of objects
 * kube accepted): any bytes give some output, never more than the input
 * with its indentation, and a stray '}' or ']' never takes the depth below
 * zero. Pure: no I/O, no allocation.
 */
#ifndef KWC_JINDENT_H
#define KWC_JINDENT_H

#include <stdbool.h>
#include <stddef.h>

struct jindent {
    size_t depth;     /* containers open (and indented) */
    bool need_indent; /* after '{' or '[': indent unless it closes at once */
    bool in_str, esc; /* inside a string; after its backslash */
    /* output decided and not yet written: [newline + pre_sp spaces] [ch]
     * [newline + post_sp spaces | post_sp spaces] */
    bool pre_nl, post_nl;
    int ch; /* -1: none */
    size_t pre_sp, post_sp;
};

void jindent_init(struct jindent *j);
/*
 * Re-indent what it can of in[0..n) into out[0..cap): returns the bytes
 * written, *used the input bytes consumed. It stops when the input is
 * consumed and nothing is left to write, or when out is full: call again
 * with in + *used (or the next piece) while it returned cap, or use
 * jindent_pending. cap 0 writes nothing.
 */
size_t jindent_run(struct jindent *j, const char *in, size_t n, size_t *used, char *out,
                   size_t cap);
/* Output decided but not written yet (call jindent_run with n = 0). */
bool jindent_pending(const struct jindent *j);

#endif
