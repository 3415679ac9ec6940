public import Foundation
public import Postgres
public import ServiceSupport

/// A queue whose consumer calls out (the revoker, webhooks, Shared Signals push, suppressions): each
/// row is claimed under a lease (committed), called with no transaction open, and recorded only if the
/// lease is still the lane's — the lease rule of schema/54-leases.sql, ``CallLease``.
///
/// A conforming type gives what is its own: its claim, its call, its record, how soon its next row is
/// due, and its maintenance; ``OutboxLanes`` gives everything else (lanes, owner ids, LISTEN and
/// wake-ups, the batch window, the saturated wait, `run`/`stop`/`drainOnce`). docs/architecture.md
/// § "A new outbox" lists what else a new one adds.
public protocol Outbox: Sendable {
    /// A row as its claim leased it.
    associatedtype Item
    /// What one call came to, as the record takes it.
    associatedtype Call
    /// What one row ended as, for the caller of ``drainOnce()``.
    associatedtype Outcome

    /// The lanes this outbox runs on.
    var lanes: OutboxLanes { get }

    /// Leases a batch of rows due by `dueBy` to `lane` (``OutboxLane/owner``) and commits: nothing,
    /// saturated (due rows, but every queue holding some is at its cap), or the rows in call order.
    func claim(on connection: PostgresConnection, lane: OutboxLane, dueBy: Date) throws -> OutboxClaim<Item>

    /// Makes one row's call. No transaction is open: the row is held by its lease only.
    func call(_ item: Item, lane: OutboxLane, on connection: PostgresConnection) -> Call

    /// Whether `call` failed: the rest of its batch is then released unsent.
    func failed(_ call: Call) -> Bool

    /// Records the calls made and releases `unsent`, in one transaction, each only while its lease is the
    /// lane's; what each row ended as.
    func record(_ calls: [Call], unsent: [Item], lane: OutboxLane, on connection: PostgresConnection) throws
        -> [Outcome]

    /// After a drain found nothing to claim: how soon the lane's next row is due (nil: none known).
    func nextDue(on connection: PostgresConnection, lane: OutboxLane) throws -> Duration?

    /// The upkeep the first lane runs between its drains (pruning, repairs).
    var maintenance: [PeriodicTask<PostgresConnection>] { get }

    /// Whether ``drainOnce()`` runs every maintenance task once first (default false).
    var drainOnceRunsMaintenance: Bool { get }

    /// Called once before the lanes start (a warning about a setting).
    func starting()
}

extension Outbox {
    public var maintenance: [PeriodicTask<PostgresConnection>] { [] }
    public var drainOnceRunsMaintenance: Bool { false }
    public func failed(_ call: Call) -> Bool { false }
    public func starting() {}

    /// Runs every lane until ``stop()``; each finishes the calls in hand (recorded, or left to their
    /// leases).
    public func run() {
        starting()
        lanes.run(self)
    }

    /// Asks ``run()`` to return once the calls in hand are recorded; wakes waiting lanes at once. Safe
    /// from any thread.
    public func stop() { lanes.stopSignal.stop() }

    /// Whether ``stop()`` was called.
    public var isStopping: Bool { lanes.stopSignal.isStopped }

    /// Calls every row due now on one connection, as one lane of a single-lane process (or as each
    /// named lane in turn); returns what each ended as. What it schedules for later is not waited for.
    public func drainOnce() throws -> [Outcome] {
        let connection = try PostgresConnection(configuration: lanes.database)
        defer { connection.close() }
        if drainOnceRunsMaintenance { _ = try PeriodicTasks(maintenance).runAll(on: connection) }
        return try lanes.drainOnceLanes.flatMap { try lanes.drain(self, lane: $0, on: connection).outcomes }
    }
}

/// What one claim leased.
public enum OutboxClaim<Item> {
    /// Nothing is due now.
    case nothing
    /// Rows are due, but every queue holding some is at its cap: look again after
    /// ``OutboxLanes/saturatedWait``.
    case saturated
    /// Rows leased to the lane (committed), in call order.
    case leased([Item])
}

/// One lane of an outbox: a thread of its own with a connection of its own.
public struct OutboxLane: Sendable, Equatable {
    /// Its place among this process's lanes (the first runs the maintenance).
    public let index: Int
    /// Its name in logs and thread names: its index, or what it serves (a provider).
    public let name: String
    /// The lease owner it claims and records as: host, process, a random part, its name.
    public let owner: String
    /// How many lanes this process runs for the outbox.
    public let count: Int
}

/// The lanes of one outbox: each a ``ConsumerLoop`` on its own thread and connection, LISTENing on the
/// outbox's channel, draining claim → calls → record until nothing is due, then waiting for a NOTIFY,
/// the next due row or the poll interval.
public struct OutboxLanes: Sendable {
    /// How soon a lane looks again after a saturated claim (the lanes holding the capped queues claim
    /// their next rows themselves; this one serves a queue whose share grew).
    public static let saturatedWait: Duration = .milliseconds(100)

    /// The outbox's name in logs and thread names (`webhooks`).
    public let name: String
    /// The channel the outbox's producers notify.
    public let channel: String
    /// The database (the role needs `siwa_worker`).
    public let database: PostgresConfiguration
    /// The lanes, in order.
    public let lanes: [OutboxLane]
    /// What ``Outbox/drainOnce()`` drains as: each named lane, or one lane standing for all numbered ones.
    private(set) var drainOnceLanes: [OutboxLane]
    /// The longest wait between drains.
    public let pollInterval: Duration
    /// Where lanes log their database failures.
    public let logger: Logger
    /// Given by ``Outbox/stop()``: ends every lane.
    public let stopSignal = StopSignal()

    /// Lanes named `names` (one each); every lease owner shares a prefix of host, process and a random
    /// part.
    public init(
        name: String, channel: String, database: PostgresConfiguration, lanes names: [String],
        pollInterval: Duration, logger: Logger
    ) {
        let prefix = "\(ProcessInfo.processInfo.hostName):\(getpid()):\(UUID().uuidString.prefix(8))"
        self.name = name
        self.channel = channel
        self.database = database
        self.lanes = names.enumerated().map {
            OutboxLane(
                index: $0.offset, name: $0.element, owner: "\(prefix):\($0.element)", count: names.count)
        }
        drainOnceLanes = self.lanes
        self.pollInterval = pollInterval
        self.logger = logger
    }

    /// Lanes named 0, 1, … `count − 1`, each serving every queue of the outbox.
    public init(
        name: String, channel: String, database: PostgresConfiguration, count: Int, pollInterval: Duration,
        logger: Logger
    ) {
        self.init(
            name: name, channel: channel, database: database, lanes: (0..<count).map(String.init),
            pollInterval: pollInterval, logger: logger)
        drainOnceLanes = lanes.prefix(1).map {
            OutboxLane(index: 0, name: $0.name, owner: $0.owner, count: 1)
        }
    }

    func run<Box: Outbox>(_ outbox: Box) {
        logger.info("\(name) started", ["lanes": .string(lanes.map(\.name).joined(separator: ","))])
        let threads = lanes.map { lane in
            JoinableThread(name: "siwa-\(name)-\(lane.name)") { runLane(lane, of: outbox) }
        }
        for thread in threads { thread.join() }
        logger.info("\(name) stopped")
    }

    private func runLane<Box: Outbox>(_ lane: OutboxLane, of outbox: Box) {
        var tasks = PeriodicTasks(lane.index == 0 ? outbox.maintenance : [])
        var loop = ConsumerLoop.listening(
            on: channel, database: database, state: ConsumerLoopState(pollInterval: pollInterval),
            stop: stopSignal, logger: logger, failure: "\(name): database failure; connecting again",
            fields: ["lane": .string(lane.name)]
        ) { connection in
            _ = try tasks.runDue(on: connection)
            let due = try drain(outbox, lane: lane, on: connection).nextDue
            return [due, tasks.untilNextDue()].compactMap { $0 }.min()
        }
        try? loop.run()
    }

    /// One drain as `lane`: batches claimed, called and recorded until none is due by the drain's start
    /// (what it schedules for later is not called in it); the outcomes, and how soon to look again.
    public func drain<Box: Outbox>(_ outbox: Box, lane: OutboxLane, on connection: PostgresConnection) throws
        -> (outcomes: [Box.Outcome], nextDue: Duration?)
    {
        let start = try connection.value("SELECT now()", as: Date.self)
        var outcomes: [Box.Outcome] = []
        while !stopSignal.isStopped {
            let claimed = ContinuousClock.now
            switch try outbox.claim(on: connection, lane: lane, dueBy: start) {
            case .nothing:
                return (outcomes, try outbox.nextDue(on: connection, lane: lane))
            case .saturated:
                return (outcomes, Self.saturatedWait)
            case .leased(let items):
                // No transaction is open from here to the record: the rows are held by their leases only,
                // and no call starts later than the batch window after the claim.
                let (calls, unsent) = CallLease.callInTurn(
                    items, claimed: claimed, isStopping: { stopSignal.isStopped },
                    call: { outbox.call($0, lane: lane, on: connection) }, failed: outbox.failed)
                outcomes += try outbox.record(calls, unsent: unsent, lane: lane, on: connection)
            }
        }
        return (outcomes, nil)
    }
}

extension Duration {
    /// A queue's "next row due in `seconds`" (as `extract(epoch …)` gives it, negative when past) as a
    /// wait: rounded up to the millisecond, never negative.
    public static func untilDue(seconds: Double) -> Duration {
        .milliseconds(max(0, Int64((seconds * 1000).rounded(.up))))
    }
}
