// Shared by every fuzz target (compiled into each binary).

@_silgen_name("__lsan_disable") private func leakSanitizerDisable()
@_silgen_name("__lsan_enable") private func leakSanitizerEnable()

/// Builds a target's long-lived fixtures (keys, verifiers) with LeakSanitizer paused.
///
/// They live in globals for the whole run, but Swift stores some class references with enum tag bits
/// set (e.g. inside `Data`), which LeakSanitizer cannot recognise as pointers, so without this it would
/// report them as leaked. Allocations made inside each input's run are still checked.
func withoutLeakChecks<T>(_ body: () throws -> T) rethrows -> T {
    leakSanitizerDisable()
    defer { leakSanitizerEnable() }
    return try body()
}
