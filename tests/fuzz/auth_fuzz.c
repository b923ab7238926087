/*
 * auth_fuzz.c — libFuzzer target for the parsers of untrusted bytes in
 * proxy/identity/authwire.c (the pure half of auth): the Authorization
 * header (from clients) and the TokenReview and SubjectAccessReview response
 * bodies (from the upstream).
 *
 * Input: the first byte picks the parser, the rest is the input, passed with
 * its exact length (a NUL-terminated copy for the header, which arrives as a
 * C string). Each result is checked against authwire.h's contract: a token
 * lies inside the header, is non-empty and holds no space; a parse returns 0
 * or KWC_EPARSE; an authenticated user always ends in a group the group adder
 * leaves it in; a decision is ALLOW or DENY with a reason. The forbidden
 * Status is rendered from the bytes too and must be valid JSON.
 */
#include "kwc/authwire.h"

#include "kwc/base.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
check_user(const struct auth_user *u)
{
    if (!u->name || !u->uid || u->refs != 1 || !u->from_token)
        abort();
    bool grouped = strcmp(u->name, "system:anonymous") == 0;
    for (size_t i = 0; i < u->ngroups; i++)
        if (strcmp(u->groups[i], "system:authenticated") == 0 ||
            strcmp(u->groups[i], "system:unauthenticated") == 0)
            grouped = true;
    if (!grouped)
        abort();
    for (size_t i = 0; i < u->nextra; i++)
        if (!u->extra[i].key)
            abort();
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const char *p = (const char *)data + 1;
    size_t len = size - 1;
    char err[256];
    switch (data[0] % 4) {
    case 0: {
        char *h = malloc(len + 1);
        if (!h)
            return 0;
        memcpy(h, p, len);
        h[len] = '\0';
        size_t tl;
        const char *t = auth_bearer_token(h, &tl);
        if (t) {
            if (t < h || t + tl > h + strlen(h) || tl == 0 || memchr(t, ' ', tl))
                abort();
            size_t bl;
            char *body = auth_token_review_json(t, tl, &bl);
            json_error_t je;
            json_t *j = json_loadb(body, bl, 0, &je);
            if (!j || !json_is_string(json_object_get(json_object_get(j, "spec"), "token")))
                abort();
            json_decref(j);
            free(body);
        } else if (tl != 0) {
            abort();
        }
        free(h);
        break;
    }
    case 1: {
        struct auth_user *u = NULL;
        int rc = auth_token_review_parse(p, len, &u, err, sizeof(err));
        if (rc != 0 && rc != KWC_EPARSE)
            abort();
        if (rc != 0 && u)
            abort();
        if (u) {
            check_user(u);
            /* the user as a SubjectAccessReview must be valid JSON */
            struct auth_attrs at = {.resource_request = true, .verb = "get", .resource = "pods"};
            char *s = auth_sar_json(u, &at);
            json_error_t je;
            json_t *j = json_loads(s, 0, &je);
            if (!j)
                abort();
            json_decref(j);
            free(s);
        }
        auth_user_unref(u);
        break;
    }
    case 2: {
        enum auth_decision d;
        char *reason = NULL;
        int rc = auth_sar_parse(p, len, &d, &reason, err, sizeof(err));
        if (rc != 0 && rc != KWC_EPARSE)
            abort();
        if (rc == 0 && (!reason || (d != AUTH_ALLOW && d != AUTH_DENY)))
            abort();
        if (rc != 0 && reason)
            abort();
        free(reason);
        break;
    }
    default: {
        /* NUL-separated fields: user, verb, group, resource, subresource,
         * namespace, name, reason; the path is the user field again. */
        char *buf = malloc(len + 1);
        if (!buf)
            return 0;
        memcpy(buf, p, len);
        buf[len] = '\0';
        const char *f[8] = {"", "", "", "", "", "", "", ""};
        size_t nf = 0;
        for (char *q = buf; nf < 8 && q <= buf + len; q += strlen(q) + 1)
            f[nf++] = q;
        struct auth_attrs at = {.resource_request = (len & 1) == 0,
                                .verb = f[1],
                                .group = f[2],
                                .resource = f[3],
                                .subresource = f[4],
                                .namespace_ = f[5],
                                .name = f[6],
                                .path = f[0]};
        char *s = auth_forbidden_status(f[0], &at, f[7]);
        json_error_t je;
        json_t *j = json_loads(s, 0, &je);
        if (!j || json_integer_value(json_object_get(j, "code")) != 403)
            abort();
        json_decref(j);
        free(s);
        free(buf);
        break;
    }
    }
    return 0;
}
