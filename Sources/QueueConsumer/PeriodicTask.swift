import ServiceSupport

/// A named piece of upkeep that a consumer runs on its own connection every ``interval`` (a prune, a
/// repair, a sweep): one file per task, run by ``PeriodicTasks``.
public struct PeriodicTask<Connection> {
    /// Counts of what one run did, by name (for the consumer's log line); empty when it has none.
    public typealias Report = [String: Int]

    /// The task's name, for logs.
    public let name: String
    /// How often it runs.
    public let interval: Duration
    /// One run on the consumer's connection.
    public let body: (Connection) throws -> Report

    /// A task; it is due at once, then every `interval`.
    public init(_ name: String, every interval: Duration, body: @escaping (Connection) throws -> Report) {
        self.name = name
        self.interval = interval
        self.body = body
    }
}

/// A consumer's periodic tasks, each on its own schedule, run between its drains on its connection.
///
/// No thread of its own: the consumer's loop calls ``runDue(on:now:)`` after a drain and waits at most
/// ``untilNextDue(now:)``. A task that throws is due again after its interval, like one that succeeded.
public struct PeriodicTasks<Connection> {
    /// The tasks, in the order they run.
    public let tasks: [PeriodicTask<Connection>]
    private var schedules: [Every]

    /// Tasks that are all due at once.
    public init(_ tasks: [PeriodicTask<Connection>]) {
        self.tasks = tasks
        schedules = tasks.map { Every($0.interval) }
    }

    /// Runs, in order, every task due at `now`; returns their reports added up. The first task that
    /// throws ends the round (the tasks after it stay due) and its error is rethrown.
    public mutating func runDue(on connection: Connection, now: ContinuousClock.Instant = .now) throws
        -> PeriodicTask<Connection>.Report
    {
        var report: PeriodicTask<Connection>.Report = [:]
        for index in tasks.indices where schedules[index].take(now: now) {
            report.merge(try tasks[index].body(connection), uniquingKeysWith: +)
        }
        return report
    }

    /// Runs every task once now, in order, whatever its schedule (a `--once` drain).
    public func runAll(on connection: Connection) throws -> PeriodicTask<Connection>.Report {
        var report: PeriodicTask<Connection>.Report = [:]
        for task in tasks { report.merge(try task.body(connection), uniquingKeysWith: +) }
        return report
    }

    /// How long until the first task is due (zero or less: one is due now); nil without tasks.
    public func untilNextDue(now: ContinuousClock.Instant = .now) -> Duration? {
        schedules.map { $0.remaining(now: now) }.min()
    }
}
