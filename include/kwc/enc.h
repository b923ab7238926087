/*
 * enc.h — the wire encodings a cache holds (DESIGN.md "Encodings"): one cache
 * per resource and encoding, each with its own store databases and history in
 * the same rv space. Shared by the reflector (what it asks the upstream for),
 * the hub (how it encodes events) and admission (admit.h: which cache answers).
 */
#ifndef KWC_ENC_H
#define KWC_ENC_H

enum kwc_enc { KWC_ENC_JSON, KWC_ENC_PB };

#endif
