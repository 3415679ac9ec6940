import CHTTPShim
import Synchronization

/// Answers one request whose connection is suspended, exactly once, from any thread.
///
/// The connection holds no thread while it waits: whoever has the answer calls ``respond(_:)``, and the
/// connection's own I/O thread sends it. Calls after the first are ignored. A responder dropped without
/// an answer answers 500 `{"error":"internal error"}` itself, so no connection is left suspended (and
/// the server's shutdown, which waits for every answer, cannot hang on a forgotten one).
public final class HTTPResponder: Sendable {
    /// The request being answered.
    public let request: HTTPRequest
    private let exchange: ExchangeHandle
    private let dispatcher: Dispatcher
    private let started = ContinuousClock.now
    private let answered = Atomic<Bool>(false)

    init(_ exchange: OpaquePointer, request: HTTPRequest, dispatcher: Dispatcher) {
        self.exchange = ExchangeHandle(pointer: exchange)
        self.request = request
        self.dispatcher = dispatcher
    }

    deinit {
        if !answered.load(ordering: .acquiring) {
            _ = dispatcher.send(.error(status: 500, "internal error"), on: exchange.pointer)
        }
    }

    /// Whether the request has been answered.
    public var hasResponded: Bool { answered.load(ordering: .acquiring) }

    /// Sends `response` (the first call only; later ones are ignored). Callable from any thread; it does
    /// not block, and once it returns the request and its connection are no longer this caller's.
    public func respond(_ response: HTTPResponse) {
        guard
            answered.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing)
                .exchanged
        else { return }
        _ = dispatcher.send(response, on: exchange.pointer)
        dispatcher.onResponse?(request, response, ContinuousClock.now - started)
    }

    /// Runs `work` on one of the server's handler threads (it may block, e.g. on the database) and
    /// answers with what it returns. Requests handed over this way wait only for a free handler thread
    /// (``HTTPServer/Configuration/threadCount``), in arrival order.
    public func respondBlocking(_ work: @escaping @Sendable () -> HTTPResponse) {
        dispatcher.pool.submit { [self] in respond(work()) }
    }

    /// Runs `work` on one of the server's handler threads (it may block); `work`, or something it
    /// starts, answers through this responder.
    public func offload(_ work: @escaping @Sendable () -> Void) {
        dispatcher.pool.submit(work)
    }
}

/// A suspended request's C handle: valid until it is answered, which ``HTTPResponder`` does once.
// @unchecked: the pointer is only handed back to the C shim, which may be called from any thread for a
// suspended connection; ``HTTPResponder`` makes sure it is used once.
private struct ExchangeHandle: @unchecked Sendable {
    let pointer: OpaquePointer
}
