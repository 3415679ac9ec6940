import Dispatch
import Foundation
import ServiceSupport
import Synchronization
import Testing

/// Records what the services did, in order.
private final class Journal: Sendable {
    private let entries = Mutex<[String]>([])
    func add(_ entry: String) { entries.withLock { $0.append(entry) } }
    var all: [String] { entries.withLock { $0 } }
}

/// A task that runs until stopped, recording its start and (after a small piece of work) its end.
private final class LoopTask: Sendable {
    let name: String
    let journal: Journal
    private let stopped = DispatchSemaphore(value: 0)

    init(_ name: String, _ journal: Journal) {
        self.name = name
        self.journal = journal
    }

    var service: Service {
        .task(
            name,
            run: { [self] in
                journal.add("run \(name)")
                stopped.wait()
                journal.add("return \(name)")  // the group must not go on before this
            }, stop: { [self] in stopped.signal() })
    }
}

private struct Boom: Error {}

private let quiet = Logger(label: "test", level: .error, sink: { _ in })

private func background(_ name: String, _ journal: Journal, failing: Bool = false) -> Service {
    .background(
        name,
        start: {
            if failing { throw Boom() }
            journal.add("start \(name)")
        }, stop: { journal.add("stop \(name)") })
}

@Suite("ServiceGroup")
struct ServiceGroupTests {
    @Test("starts services in order and, when asked to stop, stops them in reverse, joining each task first")
    func ordersStartAndStop() {
        let journal = Journal()
        let task = LoopTask("lanes", journal)
        let group = ServiceGroup(
            [background("metrics", journal), task.service, background("late", journal)], signals: nil,
            logger: quiet)
        let outcome = Mutex<ServiceGroup.Outcome?>(nil)
        let done = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            let result = group.run()
            outcome.withLock { $0 = result }
            done.signal()
        }
        // All started (a stop during start-up would rightly start no more).
        #expect(waitForEntries(journal, containing: "run lanes"))
        #expect(waitForEntries(journal, containing: "start late"))
        group.stop()
        #expect(done.wait(timeout: .now() + 60) == .success)
        let entries = journal.all
        func position(_ entry: String) -> Int { entries.firstIndex(of: entry) ?? -1 }
        // Started in order; stopped in reverse, the task's thread ended before the service before it stops.
        #expect(position("start metrics") == 0, "\(entries)")
        #expect(position("start late") > position("start metrics"), "\(entries)")
        #expect(position("stop late") > position("start late"), "\(entries)")
        #expect(position("return lanes") > position("stop late"), "\(entries)")
        #expect(position("stop metrics") == entries.count - 1, "\(entries)")
        #expect(entries.count == 6, "\(entries)")
        #expect(outcome.withLock { $0?.exitStatus } == 0)
    }

    @Test("a task that returns by itself stops the group with status 0")
    func finishedTaskStopsGroup() {
        let journal = Journal()
        let group = ServiceGroup(
            [background("metrics", journal), .task("drain", run: { journal.add("drained") }, stop: {})],
            signals: nil, logger: quiet)
        let outcome = group.run()
        #expect(outcome.exitStatus == 0)
        #expect(journal.all == ["start metrics", "drained", "stop metrics"])
        guard case .finished(let service) = outcome else {
            Issue.record("unexpected outcome \(outcome)")
            return
        }
        #expect(service == "drain")
    }

    @Test("a task that throws stops the group with status 1")
    func failedTaskStopsGroup() {
        let journal = Journal()
        let group = ServiceGroup(
            [background("metrics", journal), .task("drain", run: { throw Boom() }, stop: {})],
            signals: nil, logger: quiet)
        let outcome = group.run()
        #expect(outcome.exitStatus == 1)
        #expect(journal.all == ["start metrics", "stop metrics"])
    }

    @Test("a service that cannot start stops those started before it; later ones never start")
    func startFailureUnwinds() {
        let journal = Journal()
        let task = LoopTask("lanes", journal)
        let group = ServiceGroup(
            [task.service, background("metrics", journal, failing: true), background("never", journal)],
            signals: nil, logger: quiet)
        let outcome = group.run()
        #expect(outcome.exitStatus == 1)
        guard case .startFailed(let service, _) = outcome else {
            Issue.record("unexpected outcome \(outcome)")
            return
        }
        #expect(service == "metrics")
        #expect(!journal.all.contains("start never"))
        #expect(journal.all.last == "return lanes")
    }

    private func waitForEntries(_ journal: Journal, containing entry: String) -> Bool {
        let deadline = ContinuousClock.now + .seconds(60)
        while ContinuousClock.now < deadline {
            if journal.all.contains(entry) { return true }
            Thread.sleep(forTimeInterval: 0.005)
        }
        return false
    }
}
