#ifndef SIWA_CCURLSHIM_H
#define SIWA_CCURLSHIM_H

/* Typed wrappers for libcurl's variadic curl_easy_setopt / curl_easy_getinfo and for what exists
 * only as macros. Mechanism only: which options are set, and to what, is decided in Swift
 * (HTTPClient). */

#include <curl/curl.h>

/* curl_global_init(CURL_GLOBAL_DEFAULT), exactly once per process (pthread_once); every call
 * returns the result of that one initialisation. */
CURLcode siwa_curl_global_init_once(void);

CURLcode siwa_curl_setopt_long(CURL *handle, CURLoption option, long value);
CURLcode siwa_curl_setopt_off_t(CURL *handle, CURLoption option, curl_off_t value);
CURLcode siwa_curl_setopt_string(CURL *handle, CURLoption option, const char *value);
CURLcode siwa_curl_setopt_pointer(CURL *handle, CURLoption option, void *value);
CURLcode siwa_curl_setopt_slist(CURL *handle, CURLoption option, struct curl_slist *value);
CURLcode siwa_curl_setopt_curlu(CURL *handle, CURLoption option, CURLU *value);

/* The signature of CURLOPT_WRITEFUNCTION and CURLOPT_HEADERFUNCTION callbacks. */
typedef size_t (*siwa_curl_data_fn)(char *data, size_t size, size_t count, void *context);
CURLcode siwa_curl_setopt_data_function(CURL *handle, CURLoption option, siwa_curl_data_fn function);

CURLcode siwa_curl_getinfo_long(CURL *handle, CURLINFO info, long *value);
CURLcode siwa_curl_getinfo_off_t(CURL *handle, CURLINFO info, curl_off_t *value);

/* The header origin CURLH_HEADER (headers of the final response, not trailers, CONNECT or 1xx). */
unsigned int siwa_curlh_header(void);

#endif
