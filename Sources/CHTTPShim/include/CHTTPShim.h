#ifndef SIWA_CHTTPSHIM_H
#define SIWA_CHTTPSHIM_H
/* Placeholder: the libmicrohttpd shim (daemon start with options, response helpers). */
int siwa_http_shim_version(void);
#endif
