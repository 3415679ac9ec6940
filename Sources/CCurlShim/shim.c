#include "CCurlShim.h"

#include <pthread.h>

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_result = CURLE_FAILED_INIT;

static void global_init(void) { global_result = curl_global_init(CURL_GLOBAL_DEFAULT); }

CURLcode siwa_curl_global_init_once(void) {
    pthread_once(&global_once, global_init);
    return global_result;
}

CURLcode siwa_curl_setopt_long(CURL *handle, CURLoption option, long value) {
    return curl_easy_setopt(handle, option, value);
}

CURLcode siwa_curl_setopt_off_t(CURL *handle, CURLoption option, curl_off_t value) {
    return curl_easy_setopt(handle, option, value);
}

CURLcode siwa_curl_setopt_string(CURL *handle, CURLoption option, const char *value) {
    return curl_easy_setopt(handle, option, value);
}

CURLcode siwa_curl_setopt_pointer(CURL *handle, CURLoption option, void *value) {
    return curl_easy_setopt(handle, option, value);
}

CURLcode siwa_curl_setopt_slist(CURL *handle, CURLoption option, struct curl_slist *value) {
    return curl_easy_setopt(handle, option, value);
}

CURLcode siwa_curl_setopt_curlu(CURL *handle, CURLoption option, CURLU *value) {
    return curl_easy_setopt(handle, option, value);
}

CURLcode siwa_curl_setopt_data_function(CURL *handle, CURLoption option, siwa_curl_data_fn function) {
    return curl_easy_setopt(handle, option, function);
}

CURLcode siwa_curl_getinfo_long(CURL *handle, CURLINFO info, long *value) {
    return curl_easy_getinfo(handle, info, value);
}

CURLcode siwa_curl_getinfo_off_t(CURL *handle, CURLINFO info, curl_off_t *value) {
    return curl_easy_getinfo(handle, info, value);
}

unsigned int siwa_curlh_header(void) { return CURLH_HEADER; }
