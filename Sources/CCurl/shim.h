#ifndef SIWA_CCURL_SHIM_H
#define SIWA_CCURL_SHIM_H
/* libcurl (Debian's libcurl4-openssl-dev: OpenSSL for TLS). Variadic and macro-only parts are
 * wrapped as typed functions in CCurlShim. */
#include <curl/curl.h>
#endif
