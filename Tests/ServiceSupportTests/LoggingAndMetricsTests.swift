import Foundation
import ServiceSupport
import Synchronization
import Testing

@Suite("JSON logs and Prometheus metrics")
struct LoggingAndMetricsTests {
    final class Lines: Sendable {
        let storage = Mutex<[String]>([])
        func append(_ line: String) { storage.withLock { $0.append(line) } }
        var all: [String] { storage.withLock { $0 } }
    }

    @Test("each log line is one JSON object with escaped text and typed fields")
    func logLines() throws {
        let lines = Lines()
        let logger = Logger(label: "test", level: .info, sink: { lines.append($0) })
        logger.debug("hidden")
        logger.info(
            "quote \" backslash \\ newline \n tab \t bell \u{7}", ["n": 3, "ok": .bool(true), "s": "x"])
        #expect(lines.all.count == 1)
        let line = try #require(lines.all.first)
        #expect(line.hasSuffix("}\n") && !line.dropLast().contains("\n"))
        let object = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
        #expect(object["msg"] as? String == "quote \" backslash \\ newline \n tab \t bell \u{7}")
        #expect(object["level"] as? String == "info")
        #expect(object["logger"] as? String == "test")
        #expect(object["n"] as? Int == 3)
        #expect(object["ok"] as? Bool == true)
    }

    @Test("counters, gauges and histograms render in the Prometheus text format")
    func metrics() {
        let registry = MetricsRegistry()
        let accepted = registry.counter("siwa_t_total", help: "Things.", labels: [("outcome", "a\"b")])
        accepted.increment(by: 2)
        #expect(registry.counter("siwa_t_total", help: "Things.", labels: [("outcome", "a\"b")]) === accepted)
        registry.gauge("siwa_g", help: "Level.").set(5)
        registry.computedGauge("siwa_c", help: "Computed.") { 1.5 }
        let histogram = registry.histogram("siwa_h_seconds", help: "Time.", buckets: [0.1, 1])
        histogram.observe(0.05)
        histogram.observe(0.5)
        histogram.observe(5)
        let text = registry.render()
        for line in [
            "# HELP siwa_t_total Things.", "# TYPE siwa_t_total counter", #"siwa_t_total{outcome="a\"b"} 2"#,
            "siwa_g 5", "siwa_c 1.5", "# TYPE siwa_h_seconds histogram",
            #"siwa_h_seconds_bucket{le="0.1"} 1"#,
            #"siwa_h_seconds_bucket{le="1"} 2"#, #"siwa_h_seconds_bucket{le="+Inf"} 3"#,
            "siwa_h_seconds_sum 5.55",
            "siwa_h_seconds_count 3",
        ] {
            #expect(text.contains(line + "\n"), "missing: \(line)")
        }
    }

    @Test(
        "a gauge that cannot be read renders NaN, and infinities as +Inf and -Inf, as Prometheus spells them")
    func specialValues() {
        let registry = MetricsRegistry()
        registry.computedGauge("siwa_nan", help: "Unknown.") { .nan }
        registry.computedGauge("siwa_up", help: "Up.") { .infinity }
        registry.computedGauge("siwa_down", help: "Down.") { -.infinity }
        let text = registry.render()
        #expect(text.contains("siwa_nan NaN\n"), "\(text)")
        #expect(text.contains("siwa_up +Inf\n"), "\(text)")
        #expect(text.contains("siwa_down -Inf\n"), "\(text)")
    }
}

@Suite("Duration conversions")
struct DurationConversionTests {
    @Test("seconds, whole milliseconds rounded up, and dispatch intervals")
    func conversions() {
        #expect(Duration.milliseconds(1500).inSeconds == 1.5)
        #expect(Duration.microseconds(1001).wholeMilliseconds == 2)
        #expect(Duration.seconds(3).wholeMilliseconds == 3000)
        #expect(Duration.milliseconds(250).dispatchInterval == .nanoseconds(250_000_000))
        #expect(Duration.seconds(-1).dispatchInterval == .nanoseconds(0))
    }
}
