public import Foundation
import ServiceSupport

/// A fresh path for a process's `--listen-address-file`, and the wait for what the process writes there.
///
/// Services under test listen on port 0 and report the kernel's choice in that file: no port is chosen
/// before the process binds it.
public struct ListenAddresses: Sendable {
    /// The path to give as `--listen-address-file`; removed on ``remove()``.
    public let url: URL

    public init() {
        url = FileManager.default.temporaryDirectory.appendingPathComponent(
            "listen-\(UUID().uuidString).addresses")
    }

    /// `["--listen-address-file", path]`.
    public var arguments: [String] { ["--listen-address-file", url.path] }

    /// Waits up to `timeout` for the file to appear and returns its listeners (name → `HOST:PORT`).
    /// - Throws: when `process` exits first or the time runs out, with `log()` (its standard error).
    public func wait(
        for process: Subprocess, timeout: Duration = .seconds(20), log: () -> String
    ) throws -> [String: String] {
        var listeners: [String: String]?
        _ = waitUntil(timeout: timeout) {
            if let text = try? String(contentsOf: url, encoding: .utf8) {
                listeners = ListenAddressFile.parse(text)
                if listeners != nil { return true }
            }
            return !process.isRunning
        }
        if let listeners { return listeners }
        let why = process.isRunning ? "wrote no listen address file within \(timeout)" : "exited"
        throw ExecutableError("the process \(why): \(log())")
    }

    /// Waits as ``wait(for:timeout:log:)`` and returns the address of listener `name`.
    public func address(
        _ name: String, of process: Subprocess, timeout: Duration = .seconds(20), log: () -> String
    ) throws -> String {
        try Self.address(name, in: wait(for: process, timeout: timeout, log: log))
    }

    /// The port of a `HOST:PORT` address.
    public static func port(of address: String) throws -> Int {
        guard let port = ListenAddress(parsing: address)?.port else {
            throw ExecutableError("not HOST:PORT: \(address)")
        }
        return port
    }

    /// The port a third-party server (`openssl s_server`, a Python script) printed to `output` on a line
    /// `PREFIX HOST:PORT` once listening; waits up to `timeout`, and throws with `output`'s text when
    /// `process` exits first.
    public static func printedPort(
        _ prefix: String, in output: URL, of process: Subprocess, timeout: Duration = .seconds(20)
    ) throws -> Int {
        var port: Int?
        _ = waitUntil(timeout: timeout) {
            let text = (try? String(contentsOf: output, encoding: .utf8)) ?? ""
            for line in text.split(separator: "\n") where line.hasPrefix(prefix + " ") {
                port = ListenAddress(parsing: String(line.dropFirst(prefix.count + 1)))?.port
            }
            return port != nil || !process.isRunning
        }
        guard let port else {
            let text = (try? String(contentsOf: output, encoding: .utf8)) ?? ""
            throw ExecutableError("no '\(prefix) HOST:PORT' line from the server: \(text)")
        }
        return port
    }

    /// The address of listener `name` in `listeners`, or a thrown error naming what the file held.
    public static func address(_ name: String, in listeners: [String: String]) throws -> String {
        guard let address = listeners[name] else {
            throw ExecutableError("no '\(name)' listener in the listen address file: \(listeners)")
        }
        return address
    }

    /// Removes the file (the process removes it when it stops cleanly; not when killed).
    public func remove() { try? FileManager.default.removeItem(at: url) }
}

/// A loopback port where nothing listens, held for as long as the value lives: its socket is bound but
/// not listening, so connections are refused and no other listener can take the port meanwhile.
///
/// With `sharedByReusePort`, a server that binds with `SO_REUSEPORT` too (nginx's `listen … reuseport`,
/// for a third-party server that cannot bind port 0 and report it) may listen there and then takes every
/// connection; our own listeners never set `SO_REUSEPORT`, so none of them can.
public final class RefusingPort: Sendable {
    /// The port.
    public let port: Int
    private let fd: Int32

    public init(sharedByReusePort: Bool = false) throws {
        (fd, port) = try LoopbackSocket.bound(reusePort: sharedByReusePort)
    }

    deinit { close(fd) }
}
