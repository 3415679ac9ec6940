#ifndef SIWA_CHTTPSHIM_H
#define SIWA_CHTTPSHIM_H
/*
 * A thin C layer over libmicrohttpd for the HTTPServer module.
 *
 * Everything that does not import into Swift lives here: the variadic MHD_start_daemon, the option
 * and flag enums, the per-request state machine of the access handler (body accumulation up to the
 * size limit, suspend/resume), and response construction. Swift sees only opaque handles and plain C
 * types. No decision about a request is made here: statuses and bodies, including those of the
 * answers the daemon sends by itself, are HTTPServer's (Swift), passed in as canned responses.
 */
#include <stddef.h>
#include <stdint.h>

/** A running daemon; owned by the caller of siwa_http_start until siwa_http_stop frees it. */
typedef struct siwa_http_daemon siwa_http_daemon;

/** One request in progress; owned by the daemon, valid only during the handler call. */
typedef struct siwa_http_exchange siwa_http_exchange;

/**
 * A response the daemon sends by itself, without a handler, closing the connection after it. The
 * strings must stay valid for as long as the daemon runs (HTTPServer passes static ones).
 */
typedef struct siwa_http_canned_response {
    unsigned int status;
    const char *content_type; /* may be NULL */
    const char *body;
    size_t body_length;
} siwa_http_canned_response;

/** How to run the daemon. `host` must be a numeric IPv4 or IPv6 address. */
typedef struct siwa_http_config {
    const char *host;
    uint16_t port;
    unsigned int thread_count;
    size_t max_body_bytes;
    unsigned int connection_limit;
    unsigned int connection_timeout_seconds;
    size_t connection_memory_limit;
    int listen_backlog;
    /* What the daemon answers by itself (each required, valid for the daemon's life): */
    const siwa_http_canned_response *body_too_large; /* a chunked body went past max_body_bytes */
    const siwa_http_canned_response *no_memory;      /* a request's state could not be allocated */
    const siwa_http_canned_response *refused;        /* completed after siwa_http_refuse_requests */
} siwa_http_config;

/** A complete request, handed to the handler once the whole body has arrived. */
typedef struct siwa_http_request_view {
    const char *method;
    const char *path;
    const char *raw_uri; /* as sent, including any query string; may be NULL */
    const char *version;
    const uint8_t *body; /* may be NULL when body_length is 0 */
    size_t body_length;
} siwa_http_request_view;

/**
 * Called on a daemon pool thread with a complete request, whose connection is suspended meanwhile.
 * Must copy what it needs from `request` before returning (the view is freed then), and must
 * eventually call siwa_http_respond exactly once for `exchange`, from any thread (the exchange stays
 * valid until then). The return value is ignored.
 */
typedef int (*siwa_http_handler_fn)(void *context, siwa_http_exchange *exchange,
                                    const siwa_http_request_view *request);

/**
 * Called on a daemon I/O thread once a request's headers have arrived, before any of its body is
 * read: may inspect the headers (siwa_http_each_header) and returns NULL to go on, or the response to
 * send at once (valid for the daemon's life), closing the connection without reading the body.
 */
typedef const siwa_http_canned_response *(*siwa_http_framing_fn)(void *context,
                                                                 siwa_http_exchange *exchange,
                                                                 const char *version);

/** Receives one request header; the strings are valid only during the call. */
typedef void (*siwa_http_header_fn)(void *context, const char *name, size_t name_length,
                                    const char *value, size_t value_length);

/** Why siwa_http_start failed (with errno in `*system_error` where one applies). */
enum {
    SIWA_HTTP_OK = 0,
    SIWA_HTTP_ERROR_INVALID_ADDRESS = 1,
    SIWA_HTTP_ERROR_SOCKET = 2,
    SIWA_HTTP_ERROR_BIND = 3,
    SIWA_HTTP_ERROR_LISTEN = 4,
    SIWA_HTTP_ERROR_DAEMON = 5,
    SIWA_HTTP_ERROR_OUT_OF_MEMORY = 6
};

/**
 * Binds and listens on the configured address, then starts libmicrohttpd with an internal poll()
 * thread pool. Returns NULL on failure with `*error` set to one of the SIWA_HTTP_ERROR_* values.
 * `context` is passed to `framing` and `handler` unchanged and must outlive the daemon.
 */
siwa_http_daemon *siwa_http_start(const siwa_http_config *config, siwa_http_framing_fn framing,
                                  siwa_http_handler_fn handler, void *context, int *error,
                                  int *system_error);

/** The port the daemon is bound to (the real one when 0 was configured). */
uint16_t siwa_http_port(const siwa_http_daemon *daemon);

/** Requests received but not yet completed (uploading, waiting for their handler, or sending). */
long siwa_http_in_flight(const siwa_http_daemon *daemon);

/** Stops accepting new connections; existing ones continue and are asked to close after a response. */
void siwa_http_quiesce(siwa_http_daemon *daemon);

/** From now on, requests that complete are answered with the configured `refused` response by the
 * daemon itself instead of being handed to the handler; call after quiesce, once the grace period is
 * over. */
void siwa_http_refuse_requests(siwa_http_daemon *daemon);

/** Requests handed to the handler and not yet answered with siwa_http_respond. Once it is 0 after
 * siwa_http_refuse_requests, it stays 0 and siwa_http_stop is safe. */
long siwa_http_unanswered(const siwa_http_daemon *daemon);

/** Stops the daemon (closing all connections), closes the listen socket, and frees `daemon`. Every
 * exchange must have been answered first (libmicrohttpd cannot stop with suspended connections): call
 * siwa_http_refuse_requests, then wait for siwa_http_unanswered to reach 0. */
void siwa_http_stop(siwa_http_daemon *daemon);

/** Calls `each` for every request header, in arrival order. */
void siwa_http_each_header(siwa_http_exchange *exchange, siwa_http_header_fn each, void *context);

/** Writes the client's numeric address into `buffer` (NUL-terminated, empty when unknown). */
void siwa_http_remote_address(siwa_http_exchange *exchange, char *buffer, size_t capacity);

/**
 * Answers the request: builds the response and resumes the connection, whose own thread then
 * sends it. Callable from any thread, exactly once per exchange; the exchange must not be used
 * afterwards. `headers` holds `header_count` pairs as consecutive NUL-terminated strings
 * ("name\0value\0name\0value\0"). The body is copied. Returns 1, or 0 when the response could
 * not be built (the connection is then closed).
 */
int siwa_http_respond(siwa_http_exchange *exchange, unsigned int status, const char *headers,
                      size_t header_count, const uint8_t *body, size_t body_length);

#endif
