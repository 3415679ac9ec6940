#ifndef SIWA_CLIBPQ_SHIM_H
#define SIWA_CLIBPQ_SHIM_H
#include <libpq-fe.h>
#endif
