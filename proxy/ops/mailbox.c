/*
 * mailbox.c — calls posted to one event loop from any thread (mailbox.h).
 *
 * A mutex-guarded singly linked queue and an eventfd. A post appends and
 * writes the eventfd only when the queue was empty (the loop has not been
 * told yet); the loop's read event swaps the whole queue out under the
 * mutex, resets the eventfd, and runs the calls without the lock held, so
 * a call may post again (to this mailbox too: it runs next turn).
 */
#include "kwc/mailbox.h"

#include <assert.h>
#include <errno.h>
#include <event2/event.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "kwc/base.h"
#include "kwc/log.h"

struct mcall {
    struct mcall *next;
    mailbox_fn fn;
    void *arg;
};

struct mailbox {
    pthread_mutex_t mu;
    struct mcall *head, **tail;
    atomic_uint pending;
    int efd;
    struct event *ev;
};

static void
fail(const char *what, int err)
{
    log_warnx("mailbox: %s: %s", what, strerror(err));
    abort();
}

static void
run_all(struct mailbox *m)
{
    pthread_mutex_lock(&m->mu);
    struct mcall *c = m->head;
    m->head = NULL;
    m->tail = &m->head;
    pthread_mutex_unlock(&m->mu);
    while (c) {
        struct mcall *next = c->next;
        atomic_fetch_sub_explicit(&m->pending, 1, memory_order_relaxed);
        c->fn(c->arg);
        free(c);
        c = next;
    }
}

static void
on_wake(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    uint64_t v;
    /* reset before the swap: a post after the swap writes again */
    if (read(fd, &v, sizeof(v)) < 0) {
        /* EAGAIN: nothing was written (a spurious wake) */
    }
    run_all(arg);
}

struct mailbox *
mailbox_new(struct event_base *base)
{
    struct mailbox *m = xcalloc(1, sizeof(*m));
    pthread_mutex_init(&m->mu, NULL);
    m->tail = &m->head;
    m->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (m->efd < 0)
        fail("cannot create its eventfd", errno);
    m->ev = event_new(base, m->efd, EV_READ | EV_PERSIST, on_wake, m);
    if (!m->ev || event_add(m->ev, NULL) != 0)
        fail("cannot add its event", ENOMEM);
    return m;
}

void
mailbox_free(struct mailbox *m)
{
    if (!m)
        return;
    run_all(m);
    event_free(m->ev);
    close(m->efd);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void
mailbox_post(struct mailbox *m, mailbox_fn fn, void *arg)
{
    struct mcall *c = xmalloc(sizeof(*c));
    c->next = NULL;
    c->fn = fn;
    c->arg = arg;
    atomic_fetch_add_explicit(&m->pending, 1, memory_order_relaxed);
    pthread_mutex_lock(&m->mu);
    bool was_empty = m->head == NULL;
    *m->tail = c;
    m->tail = &c->next;
    pthread_mutex_unlock(&m->mu);
    if (was_empty) {
        uint64_t one = 1;
        /* EAGAIN only at 2^64-1 unread: the loop is already told */
        if (write(m->efd, &one, sizeof(one)) < 0) {
        }
    }
}

void
mailbox_run(struct mailbox *m)
{
    run_all(m);
}

unsigned
mailbox_pending(struct mailbox *m)
{
    return atomic_load_explicit(&m->pending, memory_order_relaxed);
}
