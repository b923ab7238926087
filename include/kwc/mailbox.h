/*
 * mailbox.h — calls posted to one event loop from any thread.
 *
 * kwc runs several loops (the main loop with the reflectors and the
 * acceptor, the serving loops: app.c); what one loop owns, another never
 * touches. When a loop needs another's work done (start a cache, render
 * /metrics, wake the requests waiting for an rv), it posts a call to that
 * loop's mailbox: the call runs on the owner's loop, from its next turn, in
 * the order posted (per posting thread). An eventfd wakes the loop; a burst
 * of posts costs one wake.
 *
 * libevent is built here without its thread support (evthread): a loop's
 * events are never touched from another thread; the mailbox is the one
 * way in.
 */
#ifndef KWC_MAILBOX_H
#define KWC_MAILBOX_H

#include <stdbool.h>

struct event_base;
struct mailbox;

typedef void (*mailbox_fn)(void *arg);

/* On base's thread. */
struct mailbox *mailbox_new(struct event_base *base);
/* Owner's thread, with no other thread posting any more: calls not run yet
 * are run now (so what they own is freed), then the mailbox is freed. */
void mailbox_free(struct mailbox *m);
/* Any thread: fn(arg) runs on the owner's loop. Never fails (the call
 * is queued in memory; a post to a freed mailbox is a bug). */
void mailbox_post(struct mailbox *m, mailbox_fn fn, void *arg);
/* Owner's thread: run the calls queued now (a loop that is about to stop
 * and must not leave one behind). */
void mailbox_run(struct mailbox *m);
/* Calls posted and not run yet (any thread; for stats and tests). */
unsigned mailbox_pending(struct mailbox *m);

#endif
