#include "CHTTPShim.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

struct siwa_http_daemon {
    struct MHD_Daemon *mhd;
    siwa_http_framing_fn framing;
    siwa_http_handler_fn handler;
    void *context;
    size_t max_body_bytes;
    const siwa_http_canned_response *body_too_large;
    const siwa_http_canned_response *no_memory;
    const siwa_http_canned_response *refused;
    uint64_t body_deadline_ms; /* the most time a body may take after its headers */
    uint16_t port;
    int quiesced_fd; /* returned by MHD_quiesce_daemon; ours to close after MHD_stop_daemon */
    atomic_long in_flight;
    atomic_int draining;
    /* Shutdown's handshake with the I/O threads (both sequentially consistent): an I/O thread counts a
     * request as unanswered *before* it checks `refusing`, and shutdown sets `refusing` *before* it
     * waits for `unanswered` to reach 0, so no request can be handed to the handler unseen. */
    atomic_long unanswered;
    atomic_int refusing;
};

struct siwa_http_exchange {
    siwa_http_daemon *daemon;
    struct MHD_Connection *connection;
    char *raw_uri;
    uint8_t *body;
    size_t length;
    size_t capacity;
    size_t discarded; /* bytes dropped after the body passed the limit */
    uint64_t headers_at_ms; /* monotonic time the headers were complete */
    int started;
    int answered;
    int too_large;
    /* Set by siwa_http_respond (on any thread) before it resumes the suspended connection; queued by
     * the access handler when libmicrohttpd calls it again on the connection's own thread. */
    struct MHD_Response *response;
    unsigned int response_status;
    int response_failed;
};

/* MARK: - Responses the daemon sends by itself (their status and body are HTTPServer's) */

static enum MHD_Result queue_canned(struct MHD_Connection *connection,
                                    const siwa_http_canned_response *canned) {
    if (canned == NULL) {
        return MHD_NO; /* nothing to send: close the connection */
    }
    struct MHD_Response *response = MHD_create_response_from_buffer(
        canned->body_length, (void *)canned->body, MHD_RESPMEM_PERSISTENT);
    if (response == NULL) {
        return MHD_NO;
    }
    if (canned->content_type != NULL) {
        MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, canned->content_type);
    }
    MHD_add_response_header(response, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result result = MHD_queue_response(connection, canned->status, response);
    MHD_destroy_response(response);
    return result;
}

static uint64_t monotonic_ms(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000u + (uint64_t)now.tv_nsec / 1000000u;
}

static void release_body(siwa_http_exchange *exchange) {
    free(exchange->body);
    exchange->body = NULL;
    exchange->length = 0;
    exchange->capacity = 0;
}

/* MARK: - libmicrohttpd callbacks */

/* Called once per request, before headers are parsed: allocates the per-request state. */
static void *on_request_started(void *cls, const char *uri, struct MHD_Connection *connection) {
    siwa_http_daemon *daemon = cls;
    siwa_http_exchange *exchange = calloc(1, sizeof *exchange);
    if (exchange == NULL) {
        return NULL;
    }
    exchange->daemon = daemon;
    exchange->connection = connection;
    if (uri != NULL) {
        exchange->raw_uri = strdup(uri); /* NULL on failure: the path from MHD is still available */
    }
    atomic_fetch_add(&daemon->in_flight, 1);
    return exchange;
}

/* Called once per request that reached on_request_started, however it ended: frees the state. */
static void on_request_completed(void *cls, struct MHD_Connection *connection, void **con_cls,
                                 enum MHD_RequestTerminationCode reason) {
    (void)connection;
    (void)reason;
    siwa_http_daemon *daemon = cls;
    siwa_http_exchange *exchange = *con_cls;
    if (exchange == NULL) {
        return;
    }
    *con_cls = NULL;
    release_body(exchange);
    if (exchange->response != NULL) {
        MHD_destroy_response(exchange->response);
    }
    free(exchange->raw_uri);
    free(exchange);
    atomic_fetch_sub(&daemon->in_flight, 1);
}

static int append_body(siwa_http_exchange *exchange, const char *data, size_t size) {
    if (exchange->capacity - exchange->length < size) {
        size_t wanted = exchange->capacity == 0 ? 1024 : exchange->capacity;
        while (wanted - exchange->length < size) {
            wanted *= 2;
        }
        if (wanted > exchange->daemon->max_body_bytes) {
            wanted = exchange->daemon->max_body_bytes;
        }
        uint8_t *grown = realloc(exchange->body, wanted);
        if (grown == NULL) {
            return 0;
        }
        exchange->body = grown;
        exchange->capacity = wanted;
    }
    memcpy(exchange->body + exchange->length, data, size);
    exchange->length += size;
    return 1;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *connection, const char *url,
                                 const char *method, const char *version, const char *upload_data,
                                 size_t *upload_data_size, void **con_cls) {
    siwa_http_daemon *daemon = cls;
    siwa_http_exchange *exchange = *con_cls;

    if (exchange == NULL) {
        /* The per-request state could not be allocated: refuse right away and close. */
        *upload_data_size = 0;
        return queue_canned(connection, daemon->no_memory);
    }
    if (exchange->response != NULL || exchange->response_failed) {
        /* Resumed: the handler has answered on its own thread; queue that answer here. */
        struct MHD_Response *response = exchange->response;
        exchange->response = NULL;
        if (response == NULL) {
            return MHD_NO; /* the response could not be built: close the connection */
        }
        enum MHD_Result result = MHD_queue_response(connection, exchange->response_status, response);
        MHD_destroy_response(response);
        return result;
    }
    if (exchange->answered) {
        /* A response is already queued (e.g. a framing refusal): discard whatever still arrives. */
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (!exchange->started) {
        /* First call: headers only. The framing check (HTTPServer's, in Swift) refuses what would
         * let a proxy and us disagree about where the request ends, and an announced oversized
         * body, before any of the body is read. */
        exchange->started = 1;
        exchange->headers_at_ms = monotonic_ms();
        const siwa_http_canned_response *refusal = daemon->framing(daemon->context, exchange, version);
        if (refusal != NULL) {
            exchange->answered = 1;
            return queue_canned(connection, refusal);
        }
        return MHD_YES;
    }
    if (*upload_data_size != 0) {
        size_t size = *upload_data_size;
        *upload_data_size = 0;
        if (monotonic_ms() - exchange->headers_at_ms > daemon->body_deadline_ms) {
            /* A body trickling in (a byte now and then resets libmicrohttpd's idle timeout) must
             * still arrive within one connection timeout of its headers; otherwise close. */
            exchange->answered = 1;
            release_body(exchange);
            return MHD_NO;
        }
        if (exchange->too_large) {
            /* Discarding the rest of an oversized chunked body. libmicrohttpd 0.9.75 only lets a
             * response be queued before the body or after all of it; a client that keeps
             * streaming well past the limit gets its connection closed instead. */
            exchange->discarded += size;
            return exchange->discarded > daemon->max_body_bytes ? MHD_NO : MHD_YES;
        }
        if (size > daemon->max_body_bytes - exchange->length) {
            /* A chunked body passed the limit: stop buffering now, answer body_too_large at its end. */
            exchange->too_large = 1;
            exchange->discarded = size;
            release_body(exchange);
            return MHD_YES;
        }
        if (!append_body(exchange, upload_data, size)) {
            /* Out of memory mid-body: no response can be queued now, so close the connection. */
            exchange->answered = 1;
            release_body(exchange);
            return MHD_NO;
        }
        return MHD_YES;
    }

    /* Final call: the whole request has arrived. The connection is suspended before the handler
     * sees it, so that the handler may answer from any thread at any time (even at once): this pool
     * thread goes back to its other connections instead of waiting for the answer. */
    exchange->answered = 1;
    if (exchange->too_large) {
        return queue_canned(connection, daemon->body_too_large);
    }
    siwa_http_request_view view = {
        .method = method,
        .path = url,
        .raw_uri = exchange->raw_uri,
        .version = version,
        .body = exchange->body,
        .body_length = exchange->length,
    };
    atomic_fetch_add(&daemon->unanswered, 1);
    if (atomic_load(&daemon->refusing)) {
        /* Shutting down past the grace period: no handler may start now. */
        atomic_fetch_sub(&daemon->unanswered, 1);
        release_body(exchange);
        return queue_canned(connection, daemon->refused);
    }
    MHD_suspend_connection(connection);
    daemon->handler(daemon->context, exchange, &view);
    release_body(exchange);
    return MHD_YES;
}

/* MARK: - Daemon lifecycle */

static pthread_once_t ignore_sigpipe_once = PTHREAD_ONCE_INIT;

static void ignore_sigpipe(void) { signal(SIGPIPE, SIG_IGN); }

static int open_listener(const siwa_http_config *config, int *error, int *system_error,
                         uint16_t *bound_port, int *is_ipv6) {
    struct sockaddr_storage address;
    socklen_t address_length;
    memset(&address, 0, sizeof address);
    struct sockaddr_in *v4 = (struct sockaddr_in *)&address;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&address;
    if (config->host != NULL && inet_pton(AF_INET, config->host, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons(config->port);
        address_length = sizeof *v4;
        *is_ipv6 = 0;
    } else if (config->host != NULL && inet_pton(AF_INET6, config->host, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons(config->port);
        address_length = sizeof *v6;
        *is_ipv6 = 1;
    } else {
        *error = SIWA_HTTP_ERROR_INVALID_ADDRESS;
        return -1;
    }

    int fd = socket(address.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        *error = SIWA_HTTP_ERROR_SOCKET;
        *system_error = errno;
        return -1;
    }
    int on = 1;
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    if (*is_ipv6) {
        (void)setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof on);
    }
    if (bind(fd, (struct sockaddr *)&address, address_length) != 0) {
        *error = SIWA_HTTP_ERROR_BIND;
        *system_error = errno;
        close(fd);
        return -1;
    }
    if (listen(fd, config->listen_backlog > 0 ? config->listen_backlog : SOMAXCONN) != 0) {
        *error = SIWA_HTTP_ERROR_LISTEN;
        *system_error = errno;
        close(fd);
        return -1;
    }
    struct sockaddr_storage bound;
    socklen_t bound_length = sizeof bound;
    if (getsockname(fd, (struct sockaddr *)&bound, &bound_length) != 0) {
        *error = SIWA_HTTP_ERROR_SOCKET;
        *system_error = errno;
        close(fd);
        return -1;
    }
    *bound_port = bound.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&bound)->sin6_port)
                                              : ntohs(((struct sockaddr_in *)&bound)->sin_port);
    return fd;
}

siwa_http_daemon *siwa_http_start(const siwa_http_config *config, siwa_http_framing_fn framing,
                                  siwa_http_handler_fn handler, void *context, int *error,
                                  int *system_error) {
    *error = SIWA_HTTP_OK;
    *system_error = 0;
    pthread_once(&ignore_sigpipe_once, ignore_sigpipe);

    siwa_http_daemon *daemon = calloc(1, sizeof *daemon);
    if (daemon == NULL) {
        *error = SIWA_HTTP_ERROR_OUT_OF_MEMORY;
        return NULL;
    }
    daemon->framing = framing;
    daemon->handler = handler;
    daemon->context = context;
    daemon->max_body_bytes = config->max_body_bytes;
    daemon->body_too_large = config->body_too_large;
    daemon->no_memory = config->no_memory;
    daemon->refused = config->refused;
    daemon->body_deadline_ms = (uint64_t)config->connection_timeout_seconds * 1000u;
    daemon->quiesced_fd = -1;
    atomic_init(&daemon->in_flight, 0);
    atomic_init(&daemon->draining, 0);
    atomic_init(&daemon->unanswered, 0);
    atomic_init(&daemon->refusing, 0);

    int is_ipv6 = 0;
    int fd = open_listener(config, error, system_error, &daemon->port, &is_ipv6);
    if (fd < 0) {
        free(daemon);
        return NULL;
    }

    /* poll(), not epoll: libmicrohttpd 0.9.75's MHD_quiesce_daemon races with its own epoll loop over
     * removing the listen socket from the epoll set and aborts the process ("Failed to remove listen
     * FD from epoll set") when it loses; an open upstream defect, met about once in 300 shutdowns
     * under traffic. With poll() quiescing only signals the threads. The connections per I/O thread
     * are few (a proxy in front keeps them alive), so poll() costs nothing measurable here. */
    unsigned int flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_ALLOW_SUSPEND_RESUME;
    if (is_ipv6) {
        flags |= MHD_USE_IPv6;
    }
    unsigned int threads = config->thread_count > 0 ? config->thread_count : 1;
    /* From here on libmicrohttpd owns the listen socket (it closes it in MHD_stop_daemon). */
    daemon->mhd = MHD_start_daemon(
        flags, 0, NULL, NULL, on_access, daemon,
        MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
        MHD_OPTION_THREAD_POOL_SIZE, threads,
        MHD_OPTION_CONNECTION_LIMIT, config->connection_limit,
        MHD_OPTION_CONNECTION_TIMEOUT, config->connection_timeout_seconds,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, config->connection_memory_limit,
        MHD_OPTION_URI_LOG_CALLBACK, on_request_started, daemon,
        MHD_OPTION_NOTIFY_COMPLETED, on_request_completed, daemon,
        MHD_OPTION_END);
    if (daemon->mhd == NULL) {
        *error = SIWA_HTTP_ERROR_DAEMON;
        close(fd);
        free(daemon);
        return NULL;
    }
    return daemon;
}

uint16_t siwa_http_port(const siwa_http_daemon *daemon) { return daemon->port; }

long siwa_http_in_flight(const siwa_http_daemon *daemon) {
    return atomic_load(&((siwa_http_daemon *)daemon)->in_flight);
}

void siwa_http_quiesce(siwa_http_daemon *daemon) {
    atomic_store(&daemon->draining, 1);
    if (daemon->quiesced_fd < 0) {
        MHD_socket fd = MHD_quiesce_daemon(daemon->mhd);
        if (fd != MHD_INVALID_SOCKET) {
            daemon->quiesced_fd = fd;
            /* Stop listening now so new clients are refused instead of queueing in the backlog;
             * the descriptor itself stays open until MHD_stop_daemon, as libmicrohttpd requires. */
            (void)shutdown(fd, SHUT_RDWR);
        }
    }
}

void siwa_http_refuse_requests(siwa_http_daemon *daemon) { atomic_store(&daemon->refusing, 1); }

long siwa_http_unanswered(const siwa_http_daemon *daemon) {
    return atomic_load(&((siwa_http_daemon *)daemon)->unanswered);
}

void siwa_http_stop(siwa_http_daemon *daemon) {
    MHD_stop_daemon(daemon->mhd);
    if (daemon->quiesced_fd >= 0) {
        close(daemon->quiesced_fd);
    }
    free(daemon);
}

/* MARK: - Request and response access for the handler */

struct header_visit {
    siwa_http_header_fn each;
    void *context;
};

static enum MHD_Result visit_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                    size_t key_size, const char *value, size_t value_size) {
    (void)kind;
    struct header_visit *visit = cls;
    if (key != NULL) {
        visit->each(visit->context, key, key_size, value != NULL ? value : "",
                    value != NULL ? value_size : 0);
    }
    return MHD_YES;
}

void siwa_http_each_header(siwa_http_exchange *exchange, siwa_http_header_fn each, void *context) {
    struct header_visit visit = {each, context};
    MHD_get_connection_values_n(exchange->connection, MHD_HEADER_KIND, visit_header, &visit);
}

void siwa_http_remote_address(siwa_http_exchange *exchange, char *buffer, size_t capacity) {
    if (capacity == 0) {
        return;
    }
    buffer[0] = '\0';
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(exchange->connection, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (info == NULL || info->client_addr == NULL) {
        return;
    }
    const struct sockaddr *address = info->client_addr;
    const void *raw = NULL;
    if (address->sa_family == AF_INET) {
        raw = &((const struct sockaddr_in *)address)->sin_addr;
    } else if (address->sa_family == AF_INET6) {
        raw = &((const struct sockaddr_in6 *)address)->sin6_addr;
    }
    if (raw == NULL || inet_ntop(address->sa_family, raw, buffer, (socklen_t)capacity) == NULL) {
        buffer[0] = '\0';
    }
}

int siwa_http_respond(siwa_http_exchange *exchange, unsigned int status, const char *headers,
                      size_t header_count, const uint8_t *body, size_t body_length) {
    struct MHD_Response *response = MHD_create_response_from_buffer(
        body_length, (void *)(body != NULL ? body : (const uint8_t *)""), MHD_RESPMEM_MUST_COPY);
    siwa_http_daemon *daemon = exchange->daemon; /* the exchange may be freed once resumed */
    if (response == NULL) {
        exchange->response_failed = 1;
        MHD_resume_connection(exchange->connection);
        atomic_fetch_sub(&daemon->unanswered, 1);
        return 0;
    }
    const char *cursor = headers;
    for (size_t i = 0; i < header_count && cursor != NULL; i++) {
        const char *name = cursor;
        const char *value = name + strlen(name) + 1;
        cursor = value + strlen(value) + 1;
        /* Refused headers (bad characters, or ones MHD manages itself) are dropped. */
        (void)MHD_add_response_header(response, name, value);
    }
    if (atomic_load(&daemon->draining)) {
        (void)MHD_add_response_header(response, MHD_HTTP_HEADER_CONNECTION, "close");
    }
    exchange->response_status = status;
    exchange->response = response;
    /* libmicrohttpd's resume takes its own lock, which publishes the two fields above to the
     * connection's thread before it calls the access handler again. */
    MHD_resume_connection(exchange->connection);
    atomic_fetch_sub(&daemon->unanswered, 1);
    return 1;
}
