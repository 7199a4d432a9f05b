/* Errors and logging: NCCL's error strings, the last-error texts (per thread, per communicator and
 * process-wide) and NCCL_DEBUG-controlled logging to stderr. */
#ifndef PYCOLL_DEBUG_H
#define PYCOLL_DEBUG_H

#include "core.h"

struct ncclComm;

/* Records `fmt` as the last error of the calling thread, of the process and (if comm is not NULL)
 * of comm; prints it when NCCL_DEBUG is WARN or INFO. */
void ph_warn(struct ncclComm* comm, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void ph_info(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

#define WARN(...) ph_warn(NULL, __VA_ARGS__)
#define CWARN(comm, ...) ph_warn((comm), __VA_ARGS__)
#define INFO(...) ph_info(__VA_ARGS__)

/* Copies the calling thread's last error text into `comm`'s last error. */
void ph_last_error_to_comm(struct ncclComm* comm);
const char* ph_type_name(int datatype);
const char* ph_op_name(int op);

#endif
