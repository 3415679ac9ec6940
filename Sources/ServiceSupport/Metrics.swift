import Synchronization

/// A set of metrics rendered in the Prometheus text exposition format (version 0.0.4).
///
/// Metric handles are created once (at wiring time) and updated lock-free with atomics on hot paths;
/// only registration and rendering take the registry's lock.
public final class MetricsRegistry: Sendable {
    private struct Family {
        let name: String
        let help: String
        let type: String
        var series: [Series]
    }

    private enum Series {
        case counter(labels: String, Counter)
        case gauge(labels: String, Gauge)
        case histogram(labels: String, Histogram)
        case computed(labels: String, @Sendable () -> Double)
        /// Series whose label sets are known only at render time (one per row of a reading).
        case computedSet(@Sendable () -> [(labels: [(String, String)], value: Double)])
    }

    private let families = Mutex<[Family]>([])

    public init() {}

    /// A counter: only goes up. Registering the same name and labels twice returns the same handle.
    public func counter(_ name: String, help: String, labels: [(String, String)] = []) -> Counter {
        register(name, help: help, type: "counter", labels: labels) {
            .counter(labels: $0, Counter())
        } extract: {
            if case .counter(_, let c) = $0 { return c }
            return nil
        }
    }

    /// A gauge: a value that goes up and down.
    public func gauge(_ name: String, help: String, labels: [(String, String)] = []) -> Gauge {
        register(name, help: help, type: "gauge", labels: labels) {
            .gauge(labels: $0, Gauge())
        } extract: {
            if case .gauge(_, let g) = $0 { return g }
            return nil
        }
    }

    /// A gauge whose value is read from `read` at render time.
    public func computedGauge(
        _ name: String, help: String, labels: [(String, String)] = [], read: @escaping @Sendable () -> Double
    ) {
        let rendered = Self.render(labels: labels)
        families.withLock { families in
            if let i = families.firstIndex(where: { $0.name == name }) {
                families[i].series.append(.computed(labels: rendered, read))
            } else {
                families.append(
                    Family(name: name, help: help, type: "gauge", series: [.computed(labels: rendered, read)])
                )
            }
        }
    }

    /// A gauge family whose series (label sets and values) are read from `read` at render time: one
    /// series per element, none when it is empty (HELP and TYPE are rendered anyway). The caller bounds
    /// how many label sets it returns.
    public func computedGaugeSet(
        _ name: String, help: String,
        read: @escaping @Sendable () -> [(labels: [(String, String)], value: Double)]
    ) {
        families.withLock { families in
            families.append(Family(name: name, help: help, type: "gauge", series: [.computedSet(read)]))
        }
    }

    /// `siwa_build_info{version=…,commit=…,schema_version=…} 1`: what the process was built as, for
    /// joining onto other series and for alerts on mixed versions.
    public func buildInfo(labels: [(String, String)]) {
        gauge(
            "siwa_build_info",
            help:
                "Always 1; the labels say what this process was built as (version, commit, schema version).",
            labels: labels
        ).set(1)
    }

    /// A histogram with the given upper bounds (seconds, for latencies).
    public func histogram(
        _ name: String, help: String, labels: [(String, String)] = [],
        buckets: [Double] = Histogram.latencyBuckets
    ) -> Histogram {
        register(name, help: help, type: "histogram", labels: labels) {
            .histogram(labels: $0, Histogram(buckets: buckets))
        } extract: {
            if case .histogram(_, let h) = $0 { return h }
            return nil
        }
    }

    private func register<M>(
        _ name: String, help: String, type: String, labels: [(String, String)],
        make: (String) -> Series, extract: (Series) -> M?
    ) -> M {
        let rendered = Self.render(labels: labels)
        return families.withLock { families in
            if let i = families.firstIndex(where: { $0.name == name }) {
                for series in families[i].series {
                    if Self.labels(of: series) == rendered, let existing = extract(series) { return existing }
                }
                let series = make(rendered)
                families[i].series.append(series)
                return extract(series)!
            }
            let series = make(rendered)
            families.append(Family(name: name, help: help, type: type, series: [series]))
            return extract(series)!
        }
    }

    /// The whole registry in the Prometheus text format.
    public func render() -> String {
        let snapshot = families.withLock { $0 }
        var out = ""
        for family in snapshot {
            out += "# HELP \(family.name) \(family.help)\n# TYPE \(family.name) \(family.type)\n"
            for series in family.series {
                switch series {
                case .counter(let labels, let c):
                    out += "\(family.name)\(labels) \(c.value)\n"
                case .gauge(let labels, let g):
                    out += "\(family.name)\(labels) \(g.value)\n"
                case .computed(let labels, let read):
                    out += "\(family.name)\(labels) \(Self.format(read()))\n"
                case .computedSet(let read):
                    for (labels, value) in read() {
                        out += "\(family.name)\(Self.render(labels: labels)) \(Self.format(value))\n"
                    }
                case .histogram(let labels, let h):
                    let snap = h.snapshot()
                    var cumulative = 0
                    for (bound, count) in zip(h.buckets, snap.counts) {
                        cumulative += count
                        out +=
                            "\(family.name)_bucket\(Self.adding("le", Self.format(bound), to: labels)) \(cumulative)\n"
                    }
                    out += "\(family.name)_bucket\(Self.adding("le", "+Inf", to: labels)) \(snap.count)\n"
                    out += "\(family.name)_sum\(labels) \(Self.format(snap.sum))\n"
                    out += "\(family.name)_count\(labels) \(snap.count)\n"
                }
            }
        }
        return out
    }

    private static func labels(of series: Series) -> String {
        switch series {
        case .counter(let l, _), .gauge(let l, _), .histogram(let l, _), .computed(let l, _): l
        case .computedSet: ""
        }
    }

    private static func render(labels: [(String, String)]) -> String {
        guard !labels.isEmpty else { return "" }
        return "{" + labels.map { "\($0.0)=\(escape($0.1))" }.joined(separator: ",") + "}"
    }

    private static func adding(_ key: String, _ value: String, to labels: String) -> String {
        labels.isEmpty ? "{\(key)=\"\(value)\"}" : String(labels.dropLast()) + ",\(key)=\"\(value)\"}"
    }

    private static func escape(_ value: String) -> String {
        var out = "\""
        for ch in value {
            switch ch {
            case "\\": out += "\\\\"
            case "\"": out += "\\\""
            case "\n": out += "\\n"
            default: out.append(ch)
            }
        }
        return out + "\""
    }

    private static func format(_ value: Double) -> String {
        // The exposition format's spellings (Swift's own would be "nan" and "inf").
        if value.isNaN { return "NaN" }
        if value.isInfinite { return value > 0 ? "+Inf" : "-Inf" }
        if value == value.rounded(), abs(value) < 1e15 { return String(Int64(value)) }
        return String(value)
    }
}

/// A monotonically increasing count.
public final class Counter: Sendable {
    private let storage = Atomic<Int>(0)
    /// Adds `amount` (default 1).
    public func increment(by amount: Int = 1) { storage.add(amount, ordering: .relaxed) }
    /// The current count.
    public var value: Int { storage.load(ordering: .relaxed) }
}

/// A value that can go up and down.
public final class Gauge: Sendable {
    private let storage = Atomic<Int>(0)
    public func increment(by amount: Int = 1) { storage.add(amount, ordering: .relaxed) }
    public func decrement(by amount: Int = 1) { storage.subtract(amount, ordering: .relaxed) }
    public func set(_ value: Int) { storage.store(value, ordering: .relaxed) }
    /// The current value.
    public var value: Int { storage.load(ordering: .relaxed) }
}

/// A distribution of observed values in fixed buckets.
public final class Histogram: Sendable {
    /// Default buckets for latencies in seconds: 0.5 ms … 10 s.
    public static let latencyBuckets: [Double] = [
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
    ]

    /// Upper bounds, ascending.
    public let buckets: [Double]
    private let state: Mutex<(counts: [Int], sum: Double, count: Int)>

    init(buckets: [Double]) {
        self.buckets = buckets.sorted()
        self.state = Mutex((counts: Array(repeating: 0, count: buckets.count), sum: 0, count: 0))
    }

    /// Records one observation.
    public func observe(_ value: Double) {
        let index = buckets.firstIndex(where: { value <= $0 })
        state.withLock { s in
            if let index { s.counts[index] += 1 }
            s.sum += value
            s.count += 1
        }
    }

    /// Per-bucket (non-cumulative) counts, the sum and the total count.
    public func snapshot() -> (counts: [Int], sum: Double, count: Int) { state.withLock { $0 } }
}
