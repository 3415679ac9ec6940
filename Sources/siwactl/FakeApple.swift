import AppleNotifications
import Foundation
import HTTPServer
import ServiceSupport
import Synchronization

/// `siwactl fake-apple`: a local stand-in for Apple's key endpoint, serving a JWKS file.
enum FakeAppleVerb {
    static let spec = CommandSpec(
        name: "siwactl fake-apple",
        abstract: """
            Serve DIR/jwks.json (as written by 'siwactl keygen') at /auth/keys, like Apple's key endpoint,
            for local runs of siwa-receiver. Re-reads the file when it changes (to demonstrate key
            rotation), logs one line per request on stderr, prints the URL for --jwks-url on stdout, and
            runs until SIGTERM or SIGINT.
            """,
        options: [
            CommandOption(
                "listen", valueName: "HOST:PORT", help: "Address to listen on (port 0: any free port).",
                defaultValue: "127.0.0.1:8081"),
            CommandOption("keys", valueName: "DIR", help: "Directory holding jwks.json.", isRequired: true),
        ])

    static let path = "/auth/keys"

    static let verb = Verb(name: "fake-apple", abstract: "Serve a JWKS file as Apple's key endpoint.") {
        arguments, environment in
        switch parse(spec, arguments, environment) {
        case .failure(let exit): return exit.status
        case .success(let parsed):
            guard let listen = ListenAddress(parsing: parsed.value("listen") ?? "") else {
                writeErrorLine(spec.name, "--listen must be HOST:PORT")
                return ExitStatus.usage
            }
            return await runReportingFailure(spec.name) { try run(parsed, listen: listen) }
        }
    }

    static func run(_ parsed: ParsedCommand, listen: ListenAddress) throws {
        // Installed before serving, so a signal arriving early is not lost.
        let signals = TerminationSignals()
        let file = KeySetFile(
            path: URL(fileURLWithPath: parsed.value("keys")!).appendingPathComponent("jwks.json").path)
        if case .failure(let failure) = file.current() { throw failure }
        var configuration = HTTPServer.Configuration()
        configuration.host = listen.host
        configuration.port = listen.port
        configuration.threadCount = 2
        let server = HTTPServer(
            configuration: configuration,
            onResponse: { request, response, _ in
                writeErrorLine(
                    "fake-apple",
                    "\(request.remoteAddress) \(request.method) \(request.path) \(response.status)"
                )
            },
            handler: { request in
                guard request.path == path else { return .error(status: 404, "not found") }
                guard request.method == "GET" || request.method == "HEAD" else {
                    return .error(status: 405, "method not allowed")
                }
                switch file.current() {
                case .success(let body):
                    return HTTPResponse(
                        status: 200,
                        headers: ["Content-Type": "application/json", "Cache-Control": "no-store"],
                        body: [UInt8](body))
                case .failure:
                    return .error(status: 503, "no valid key set")
                }
            })
        do {
            try server.start()
        } catch {
            throw ToolFailure("cannot listen on \(listen): \(error)")
        }
        let host = listen.host.contains(":") ? "[\(listen.host)]" : listen.host
        writeStandardOutput("http://\(host):\(server.port ?? listen.port)\(path)\n")
        let name = signals.wait()
        writeErrorLine("fake-apple", "\(name), stopping")
        server.shutdown(gracePeriod: .seconds(2))
    }
}

/// The JWKS file, re-read whenever its identity, size or modification time changes. A file that is
/// not a valid key set is reported once and the last good one is kept.
final class KeySetFile: Sendable {
    private struct Stamp: Equatable {
        var inode: UInt64
        var size: Int64
        var modified: timespec

        static func == (lhs: Stamp, rhs: Stamp) -> Bool {
            lhs.inode == rhs.inode && lhs.size == rhs.size && lhs.modified.tv_sec == rhs.modified.tv_sec
                && lhs.modified.tv_nsec == rhs.modified.tv_nsec
        }
    }

    private struct State {
        var stamp: Stamp?
        var body: Data?
    }

    let path: String
    private let state = Mutex(State())

    init(path: String) { self.path = path }

    /// The key set to serve, or why there is none.
    func current() -> Result<Data, ToolFailure> {
        var info = stat()
        guard stat(path, &info) == 0 else {
            return state.withLock {
                $0.body.map { .success($0) } ?? .failure(ToolFailure("cannot read \(path)"))
            }
        }
        let stamp = Stamp(inode: UInt64(info.st_ino), size: Int64(info.st_size), modified: info.st_mtim)
        return state.withLock { state -> Result<Data, ToolFailure> in
            if state.stamp != stamp {
                state.stamp = stamp
                if let data = FileManager.default.contents(atPath: path),
                    let keys = try? JSONWebKeySet(jsonData: data), !keys.keyIDs.isEmpty
                {
                    state.body = data
                    writeErrorLine(
                        "fake-apple", "loaded \(path): kids \(keys.keyIDs.joined(separator: ", "))")
                } else {
                    writeErrorLine("fake-apple", "\(path) is not a usable key set; keeping the previous one")
                }
            }
            return state.body.map { .success($0) } ?? .failure(ToolFailure("\(path) is not a usable key set"))
        }
    }
}
