/*
 * version.h — kwc's version (the Makefile reads it for the image's tag).
 * The git commit a binary was built from comes from the generated
 * kwc_build.h (KWC_GIT_COMMIT; "unknown" outside a git checkout).
 */
#ifndef KWC_VERSION_H
#define KWC_VERSION_H

#define KWC_VERSION "0.1.0"

#endif
