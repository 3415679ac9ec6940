import Dispatch
import Foundation
import Synchronization

/// Waits for SIGTERM or SIGINT, the signals that ask a service to stop gracefully.
///
/// Create it before starting work (it ignores the default disposition of both signals at once, so a
/// signal arriving early is not lost), then call ``wait()`` from the main thread.
public final class TerminationSignals {
    private let semaphore = DispatchSemaphore(value: 0)
    private let received = ReceivedSignal()
    private let sources: [any DispatchSourceSignal]

    public init() {
        signal(SIGPIPE, SIG_IGN)
        var sources: [any DispatchSourceSignal] = []
        for number in [SIGTERM, SIGINT] {
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler { [semaphore, received] in
                received.set(number)
                semaphore.signal()
            }
            source.resume()
            sources.append(source)
        }
        self.sources = sources
    }

    /// Blocks until SIGTERM or SIGINT arrives; returns the signal's name.
    @discardableResult
    public func wait() -> String {
        semaphore.wait()
        return received.get() == SIGINT ? "SIGINT" : "SIGTERM"
    }

    /// Blocks until a signal arrives or `timeout` passes; returns whether a signal arrived.
    public func wait(timeout: Duration) -> Bool {
        semaphore.wait(timeout: .now() + timeout.dispatchInterval) == .success
    }

    deinit {
        for source in sources { source.cancel() }
    }
}

private final class ReceivedSignal: Sendable {
    private let value = Mutex<Int32>(0)
    func set(_ number: Int32) { value.withLock { $0 = number } }
    func get() -> Int32 { value.withLock { $0 } }
}
