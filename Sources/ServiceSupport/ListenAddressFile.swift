import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// `--listen-address-file FILE`: where a process writes the addresses its listeners bound, one line
/// `NAME HOST:PORT` per listener, once all of them listen.
///
/// The file is written to a temporary file beside it and renamed into place, so a reader sees every line
/// or no file; one left by an earlier run is removed at start (``removeStale()``) and the file is removed
/// when the process stops. With port 0 this is how a supervisor or a test learns the kernel's choice.
public struct ListenAddressFile: Sendable {
    /// The file's path.
    public let path: String

    public init(path: String) { self.path = path }

    /// The text of the file: `NAME HOST:PORT` per listener, in the order given.
    public static func text(_ listeners: [(name: String, address: String)]) -> String {
        listeners.map { "\($0.name) \($0.address)\n" }.joined()
    }

    /// Parses the file's text into name → address; nil when a line is not `NAME HOST:PORT`.
    public static func parse(_ text: String) -> [String: String]? {
        var listeners: [String: String] = [:]
        for line in text.split(separator: "\n") {
            let parts = line.split(separator: " ")
            guard parts.count == 2, ListenAddress(parsing: String(parts[1])) != nil else { return nil }
            listeners[String(parts[0])] = String(parts[1])
        }
        return listeners
    }

    /// Removes a file left by an earlier run, so that whoever waits for the file never reads a stale one.
    /// - Throws: ``ConfigurationError`` when a file is there and cannot be removed.
    public func removeStale() throws(ConfigurationError) {
        guard unlink(path) == 0 || errno == ENOENT else { throw failure("cannot remove the old file") }
    }

    /// Writes `listeners` atomically: a temporary file in the same directory, renamed over `path`.
    /// - Throws: ``ConfigurationError`` naming the file and the system's reason.
    public func write(_ listeners: [(name: String, address: String)]) throws(ConfigurationError) {
        let temporary = "\(path).\(getpid()).tmp"
        do {
            try Data(Self.text(listeners).utf8).write(to: URL(fileURLWithPath: temporary))
        } catch {
            unlink(temporary)
            throw ConfigurationError("--listen-address-file \(path): cannot write \(temporary): \(error)")
        }
        guard rename(temporary, path) == 0 else {
            let error = failure("cannot rename \(temporary) to it")
            unlink(temporary)
            throw error
        }
    }

    /// Removes the file (when the process stops); a file already gone is fine.
    public func remove() { unlink(path) }

    private func failure(_ what: String) -> ConfigurationError {
        ConfigurationError("--listen-address-file \(path): \(what): \(String(cString: strerror(errno)))")
    }
}

extension CommandOption {
    /// `--listen-address-file FILE` with the environment twin `environmentVariable`: see
    /// ``ListenAddressFile``; `names` lists the file's listener names for the help text.
    public static func listenAddressFile(environmentVariable: String?, names: String) -> CommandOption {
        CommandOption(
            "listen-address-file", valueName: "FILE",
            help:
                "Once listening, write the bound addresses here (\(names)), one 'NAME HOST:PORT' line each; with port 0, the kernel's choice.",
            environmentVariable: environmentVariable)
    }
}

extension Service {
    /// A service that writes `file` once the services before it listen (`listeners` reads their bound
    /// addresses then) and removes it when stopped; put it after the last listener of the group.
    public static func listenAddressFile(
        _ file: ListenAddressFile, listeners: @escaping @Sendable () -> [(name: String, address: String)]
    ) -> Service {
        .background(
            "listen address file", start: { try file.write(listeners()) }, stop: { file.remove() })
    }
}
