import Foundation
import Synchronization

/// A thread that can be joined: ``join()`` returns only once the thread has ended completely.
///
/// `Foundation.Thread` starts detached threads that cannot be waited for; a service that promises to
/// have stopped every thread it started before it returns from its shutdown needs `pthread_join`.
public final class JoinableThread: Sendable {
    private let handle: pthread_t
    /// Whether it was joined; the lock is held across `pthread_join`, so a second caller waits for it.
    private let joined = Mutex<Bool>(false)

    /// Starts `body` on a new thread named `name` (the first 15 bytes are shown by `ps` and `top`).
    public init(name: String, _ body: @escaping @Sendable () -> Void) {
        let context = Unmanaged.passRetained(Start(name: name, body: body)).toOpaque()
        var handle = pthread_t()
        let status = pthread_create(
            &handle, nil,
            { context in
                let start = Unmanaged<Start>.fromOpaque(context!).takeRetainedValue()
                Thread.current.name = start.name  // Foundation passes it on to the kernel (ps, top)
                start.body()
                return nil
            }, context)
        guard status == 0 else {
            fatalError("pthread_create failed: \(String(cString: strerror(status)))")
        }
        self.handle = handle
    }

    /// Blocks until the thread has ended; later calls return at once. Must not be called from the thread
    /// itself.
    public func join() {
        joined.withLock { joined in
            guard !joined else { return }
            pthread_join(handle, nil)
            joined = true
        }
    }

    deinit {
        if !joined.withLock({ $0 }) { pthread_detach(handle) }
    }

    private final class Start {
        let name: String
        let body: @Sendable () -> Void
        init(name: String, body: @escaping @Sendable () -> Void) {
            self.name = name
            self.body = body
        }
    }
}
