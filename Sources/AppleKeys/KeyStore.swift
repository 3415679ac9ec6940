public import AppleNotifications
public import Foundation
import ServiceSupport

/// Apple's signing keys, cached in memory.
///
/// - The set is loaded at start and refreshed periodically; a failed refresh keeps the last good keys.
/// - A `kid` that is not held triggers a refetch, at most once per cooldown (periodic refreshes do not
///   count), and concurrent misses wait for that one fetch instead of starting their own: a flood of
///   junk kids cannot hammer Apple, and a key Apple has just rotated in is picked up at once.
/// - A `kid` missing from a set fetched within the cooldown is *unknown* (the token is refused); a `kid`
///   missing while the set cannot be fetched is *not available* (the caller should ask for a retry).
// @unchecked: the `let`s are immutable and Sendable; every `var` is read and written only while
// `condition` is locked (the refresher and the fetching callers wait on it).
public final class KeyStore: @unchecked Sendable {
    /// Timing of fetches.
    public struct Configuration: Sendable {
        /// How often the set is refreshed while all is well.
        public var refreshInterval: Duration
        /// The least time between two fetches caused by unknown kids (and between retries after a failure).
        public var cooldown: Duration

        /// The refresh interval when none is configured: an hour.
        public static let defaultRefreshInterval: Duration = .seconds(3600)
        /// The cooldown when none is configured: 30 seconds.
        public static let defaultCooldown: Duration = .seconds(30)

        public init(
            refreshInterval: Duration = Configuration.defaultRefreshInterval,
            cooldown: Duration = Configuration.defaultCooldown
        ) {
            self.refreshInterval = refreshInterval
            self.cooldown = cooldown
        }
    }

    /// What one fetch did, for metrics and logs.
    public enum FetchOutcome: Sendable {
        case success(keyCount: Int)
        /// A failed fetch; `heldKeys` is how many keys of an earlier fetch stay in use (0: none, every
        /// notification is answered 503 until a fetch succeeds).
        case failure(reason: String, heldKeys: Int)
    }

    private let source: @Sendable () throws -> Data
    private let configuration: Configuration
    private let observer: @Sendable (FetchOutcome) -> Void
    private let clock = ContinuousClock()

    // Guarded by `condition`.
    private let condition = NSCondition()
    private var keys: JSONWebKeySet?
    private var lastMissFetch: ContinuousClock.Instant?
    private var lastAttemptFailed = false
    private var fetching = false
    private var generation = 0
    private var stopped = false
    private var refresher: JoinableThread?

    /// - Parameters:
    ///   - source: fetches the key set's bytes (e.g. ``JWKSSource/fetch()``).
    ///   - observer: told about every fetch; must be cheap.
    public init(
        configuration: Configuration = Configuration(),
        source: @escaping @Sendable () throws -> Data,
        observer: @escaping @Sendable (FetchOutcome) -> Void = { _ in }
    ) {
        self.configuration = configuration
        self.source = source
        self.observer = observer
    }

    /// Whether a key set has been loaded (readiness).
    public var hasKeys: Bool {
        condition.lock()
        defer { condition.unlock() }
        return keys != nil
    }

    /// The kids of the usable keys held now.
    public var keyIDs: [String] {
        condition.lock()
        defer { condition.unlock() }
        return keys?.keyIDs ?? []
    }

    /// The key for `kid` if it is held now; never fetches, never waits for a fetch (only for the
    /// lock, which no fetch holds). For threads that must not block: on `nil`, call ``key(id:)`` from
    /// one that may.
    public func heldKey(id kid: String) -> RSAPublicKey? {
        condition.lock()
        defer { condition.unlock() }
        return keys?.key(id: kid)
    }

    /// The key for `kid`, refetching the set if needed (see the type's documentation).
    public func key(id kid: String) throws(NotificationError) -> RSAPublicKey {
        condition.lock()
        defer { condition.unlock() }
        if let key = keys?.key(id: kid) { return key }
        if fetching {
            let awaited = generation
            while fetching && generation == awaited { condition.wait() }
        } else if let last = lastMissFetch, clock.now - last < configuration.cooldown {
            // A miss caused a fetch within the cooldown: its answer stands.
        } else {
            lastMissFetch = clock.now
            fetchHoldingLock()
        }
        if let key = keys?.key(id: kid) { return key }
        if lastAttemptFailed {
            throw NotificationError(
                .keyNotAvailable, .unknownKeyID, "kid not held and the key set cannot be fetched")
        }
        throw NotificationError(.verificationFailed, .unknownKeyID, "kid not in a freshly fetched key set")
    }

    /// Starts the background refresher: an immediate load, then a refresh every `refreshInterval`
    /// (every `cooldown` while fetches fail or no keys are held).
    public func start() {
        condition.lock()
        defer { condition.unlock() }
        guard refresher == nil, !stopped else { return }
        refresher = JoinableThread(name: "siwa-jwks-refresh") { [self] in self.refreshLoop() }
    }

    /// Stops the background refresher and returns once its thread has ended. A fetch in progress is
    /// waited for; it is bounded by the source's own timeout (``JWKSSource/timeout``).
    public func stop() {
        condition.lock()
        stopped = true
        condition.broadcast()
        let thread = refresher
        condition.unlock()
        thread?.join()
    }

    private func refreshLoop() {
        condition.lock()
        defer { condition.unlock() }
        while !stopped {
            if !fetching { fetchHoldingLock() }
            let pause =
                (keys == nil || lastAttemptFailed) ? configuration.cooldown : configuration.refreshInterval
            let deadline = Date(timeIntervalSinceNow: pause.inSeconds)
            while !stopped && Date() < deadline { _ = condition.wait(until: deadline) }
        }
    }

    /// Runs one fetch with the lock released during I/O. Call with the lock held and `fetching` false.
    private func fetchHoldingLock() {
        fetching = true
        condition.unlock()
        let outcome: Result<JSONWebKeySet, any Error>
        do {
            let set = try JSONWebKeySet(jsonData: try source())
            outcome =
                set.keyIDs.isEmpty
                ? .failure(JWKSFetchError("key set holds no usable RS256 key")) : .success(set)
        } catch {
            outcome = .failure(error)
        }
        condition.lock()
        let held = keys?.keyIDs.count ?? 0
        condition.unlock()
        switch outcome {
        case .success(let set): observer(.success(keyCount: set.keyIDs.count))
        case .failure(let error): observer(.failure(reason: String(describing: error), heldKeys: held))
        }
        condition.lock()
        switch outcome {
        case .success(let set):
            keys = set
            lastAttemptFailed = false
        case .failure:
            lastAttemptFailed = true  // the last good keys stay in use
        }
        fetching = false
        generation &+= 1
        condition.broadcast()
    }

}
