/*
 * kubeconfig_fuzz.c — libFuzzer target for kcfg_parse (YAML from a file a
 * person may have pasted anything into).
 *
 * Relative paths resolve under a directory that does not exist, and the
 * parser opens referenced files non-blocking and regular-only, so a file
 * path in the input cannot stall the run. Each result or error is checked
 * for the contract: a struct iff 0, a NUL-terminated message otherwise.
 */
#include "kwc/kubeconfig.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kcfg *k = NULL;
    char err[256];
    /* The first byte picks current-context or an explicit context. */
    const char *context = size && data[0] == 'C' ? "c" : NULL;
    int rc = kcfg_parse((const char *)data, size, "/nonexistent-kcfg-fuzz", context, &k, err,
                        sizeof err);
    if ((rc == 0) != (k != NULL) || (rc != 0 && !memchr(err, '\0', sizeof err)))
        abort();
    if (k && (!k->server || !k->context || !k->cluster))
        abort();
    kcfg_free(k);
    return 0;
}
