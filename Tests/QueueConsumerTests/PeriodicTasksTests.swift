import QueueConsumer
import Testing

@Suite("PeriodicTasks: named tasks on their own schedules, run between drains")
struct PeriodicTasksTests {
    struct Failure: Error {}

    /// A log of the tasks' runs; the connection the runner hands each body.
    final class Runs {
        var names: [String] = []
    }

    @Test("every task is due at once, then once per its interval")
    func schedules() throws {
        let runs = Runs()
        let start = ContinuousClock.now
        var tasks = PeriodicTasks<Runs>([
            PeriodicTask("prune", every: .seconds(60)) { runs in
                runs.names.append("prune")
                return ["pruned": 2]
            },
            PeriodicTask("repair", every: .seconds(10)) { runs in
                runs.names.append("repair")
                return ["pruned": 1, "repaired": 3]
            },
        ])
        #expect(tasks.untilNextDue(now: start) == .zero)
        let first = try tasks.runDue(on: runs, now: start)
        #expect(runs.names == ["prune", "repair"])
        #expect(first == ["pruned": 3, "repaired": 3])
        #expect(tasks.untilNextDue(now: start + .seconds(4)) == .seconds(6))
        #expect(try tasks.runDue(on: runs, now: start + .seconds(9)) == [:])
        _ = try tasks.runDue(on: runs, now: start + .seconds(10))
        #expect(runs.names == ["prune", "repair", "repair"])
        _ = try tasks.runDue(on: runs, now: start + .seconds(60))
        #expect(runs.names == ["prune", "repair", "repair", "prune", "repair"])
    }

    @Test("a task that throws ends the round; the ones after it stay due, it waits its interval")
    func failure() throws {
        let runs = Runs()
        let start = ContinuousClock.now
        var tasks = PeriodicTasks<Runs>([
            PeriodicTask("failing", every: .seconds(30)) { runs in
                runs.names.append("failing")
                throw Failure()
            },
            PeriodicTask("after", every: .seconds(30)) { runs in
                runs.names.append("after")
                return [:]
            },
        ])
        #expect(throws: Failure.self) { _ = try tasks.runDue(on: runs, now: start) }
        #expect(runs.names == ["failing"])
        #expect(tasks.untilNextDue(now: start + .seconds(1)) == .zero)
        _ = try tasks.runDue(on: runs, now: start + .seconds(1))
        #expect(runs.names == ["failing", "after"])
    }

    @Test("runAll runs every task once, due or not; no tasks: nothing is ever due")
    func runAll() throws {
        let runs = Runs()
        var tasks = PeriodicTasks<Runs>([
            PeriodicTask("a", every: .seconds(60)) { runs in
                runs.names.append("a")
                return ["n": 1]
            }
        ])
        _ = try tasks.runDue(on: runs)
        #expect(try tasks.runAll(on: runs) == ["n": 1])
        #expect(runs.names == ["a", "a"])
        #expect(PeriodicTasks<Runs>([]).untilNextDue() == nil)
    }
}
