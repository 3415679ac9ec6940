/// How a test tells that a process it ran crashed, from what the process wrote to standard error.
public enum CrashReport {
    /// What a crashed process leaves on standard error (libc, libmicrohttpd, the Swift runtime).
    public static let markers = [
        "double free", "corrupted", "malloc(", "free(): ", "Fatal error", "Program crashed", "Segmentation",
        "Backtracing",
    ]

    /// Whether `log` shows a crash.
    public static func showsCrash(_ log: String) -> Bool {
        markers.contains(where: log.contains)
    }

    /// The lines of `log` that say how a process crashed, or its last lines when none does.
    public static func summary(_ log: String) -> String {
        let lines = log.split(separator: "\n")
        let crash = lines.filter { line in
            markers.contains(where: line.contains) || line.contains(" crashed")
        }
        return (crash.isEmpty ? Array(lines.suffix(5)) : Array(crash.prefix(6))).joined(separator: "\n")
    }
}
