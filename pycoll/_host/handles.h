/* A registry of the live handles the library gave out (communicators, streams, events, memory,
 * windows, graphs), so that every call can validate its handles: a destroyed or made-up handle is an
 * ncclInvalidArgument, never a crash. Freed objects are kept in a quarantine for a while, so a
 * stale handle does not alias a new object. */
#ifndef PYCOLL_HANDLES_H
#define PYCOLL_HANDLES_H

#include "core.h"

enum handle_kind { H_COMM = 1, H_STREAM = 2, H_EVENT = 3, H_MEM = 4, H_WINDOW = 5, H_GRAPH = 6 };

void handle_lock(void);
void handle_unlock(void);
/* The *_locked variants require handle_lock(). */
bool handle_valid_locked(const void* p, int kind);
void handle_add(const void* p, int kind, size_t extra);
/* Removes p if registered with `kind`; returns whether it was. */
bool handle_remove(const void* p, int kind, size_t* extra);
bool handle_valid(const void* p, int kind);

/* free() after a delay of a few hundred other frees. */
void quarantine_free(void* p);

#endif
