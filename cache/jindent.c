/*
 * jindent.c — streaming re-indenter (see jindent.h). One byte of input at a
 * time through encoding/json's Indent rules, with runs of string bytes
 * copied whole (a number's or a literal's bytes go one at a time, as
 * punctuation does); the only output a byte can cause beyond itself is a
 * newline with its indentation (before: a container's first element or its
 * close; after: ',') or the space after ':', held as counters until there
 * is room for them.
 */
#include "kwc/jindent.h"

#include <string.h>

void
jindent_init(struct jindent *j)
{
    *j = (struct jindent){.ch = -1};
}

bool
jindent_pending(const struct jindent *j)
{
    return j->pre_nl || j->pre_sp || j->ch >= 0 || j->post_nl || j->post_sp;
}

static size_t
spaces(char *out, size_t room, size_t *count)
{
    size_t k = *count < room ? *count : room;
    memset(out, ' ', k);
    *count -= k;
    return k;
}

/* Write what is pending, in order, as far as room goes. */
static size_t
drain(struct jindent *j, char *out, size_t cap)
{
    size_t w = 0;
    if (j->pre_nl && w < cap) {
        out[w++] = '\n';
        j->pre_nl = false;
    }
    if (!j->pre_nl)
        w += spaces(out + w, cap - w, &j->pre_sp);
    if (!j->pre_nl && !j->pre_sp && j->ch >= 0 && w < cap) {
        out[w++] = (char)j->ch;
        j->ch = -1;
    }
    if (j->ch < 0 && !j->pre_nl && !j->pre_sp) {
        if (j->post_nl && w < cap) {
            out[w++] = '\n';
            j->post_nl = false;
        }
        if (!j->post_nl)
            w += spaces(out + w, cap - w, &j->post_sp);
    }
    return w;
}

size_t
jindent_run(struct jindent *j, const char *in, size_t n, size_t *used, char *out, size_t cap)
{
    size_t r = 0, w = 0;
    for (;;) {
        w += drain(j, out + w, cap - w);
        if (jindent_pending(j) || r == n || w == cap)
            break;
        char c = in[r];
        if (j->in_str) {
            if (j->esc) {
                j->esc = false;
                out[w++] = c;
                r++;
                continue;
            }
            size_t k = r, lim = n - r < cap - w ? n : r + (cap - w);
            while (k < lim && in[k] != '"' && in[k] != '\\')
                k++;
            if (k > r) {
                memcpy(out + w, in + r, k - r);
                w += k - r;
                r = k;
                continue;
            }
            if (c == '\\')
                j->esc = true;
            else
                j->in_str = false;
            out[w++] = c;
            r++;
            continue;
        }
        r++;
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r')
            continue;
        if (j->need_indent && c != '}' && c != ']') {
            j->need_indent = false;
            j->depth++;
            j->pre_nl = true;
            j->pre_sp = 2 * j->depth;
        }
        j->ch = (unsigned char)c;
        switch (c) {
        case '{':
        case '[':
            j->need_indent = true;
            break;
        case ',':
            j->post_nl = true;
            j->post_sp = 2 * j->depth;
            break;
        case ':':
            j->post_sp = 1;
            break;
        case '}':
        case ']':
            if (j->need_indent) {
                j->need_indent = false; /* {} and [] stay compact */
            } else {
                if (j->depth > 0)
                    j->depth--;
                j->pre_nl = true;
                j->pre_sp = 2 * j->depth;
            }
            break;
        case '"':
            j->in_str = true;
            break;
        default:
            break;
        }
    }
    *used = r;
    return w;
}
