import AppleNotifications
public import Foundation
public import HTTPServer
import Synchronization

/// Why the local Apple cannot start: one line naming the file or address.
public struct FakeAppleError: Error, CustomStringConvertible, Sendable {
    /// The line to show.
    public var description: String

    /// An error with this line.
    public init(_ description: String) { self.description = description }
}

/// The local Apple on the project's HTTP server: the key endpoint serving a JWKS file (re-read when it
/// changes, for key rotation) and, with settings, the token side (``FakeAppleAuthority``). Serves
/// loopback only; never reads the environment or prints (lines go to `log`).
public final class FakeAppleServer: Sendable {
    /// Where it listens and what it answers.
    public struct Configuration: Sendable {
        /// A loopback address.
        public var host: String
        /// The port; 0 picks a free one (read ``FakeAppleServer/port`` after ``start()``).
        public var port: Int
        /// The directory holding `jwks.json` (and `private-key.pem`, which signs id_tokens), as
        /// `siwactl keygen` writes it.
        public var keysDirectory: String
        /// The token endpoints' team and clients; nil: they answer 404.
        public var settings: FakeAppleAuthority.Settings?
        /// Faults from the start (every call), if any.
        public var fault: FakeAppleAuthority.FaultPlan?
        /// Handler threads.
        public var threadCount: Int

        /// A configuration serving `keysDirectory` on `host:port`.
        public init(
            host: String = "127.0.0.1", port: Int = 0, keysDirectory: String,
            settings: FakeAppleAuthority.Settings? = nil, fault: FakeAppleAuthority.FaultPlan? = nil,
            threadCount: Int = 4
        ) {
            self.host = host
            self.port = port
            self.keysDirectory = keysDirectory
            self.settings = settings
            self.fault = fault
            self.threadCount = threadCount
        }
    }

    /// The key endpoint's path.
    public static let keysPath = "/auth/keys"

    /// The token side.
    public let authority: FakeAppleAuthority
    /// The key set served at ``keysPath``.
    public let keySet: KeySetFile
    private let server: HTTPServer
    private let host: String

    /// Loads the key set (and, with settings, the signing key it publishes). Does not listen yet.
    /// - Parameter log: receives one line per request and event; a line may quote what a client sent
    ///   (the percent-decoded path), so a sink that writes to a terminal or a text log escapes it
    ///   (`writeErrorLine` does: ``TerminalText``).
    public init(configuration: Configuration, log: @escaping @Sendable (String) -> Void) throws {
        let directory = URL(fileURLWithPath: configuration.keysDirectory)
        let file = KeySetFile(path: directory.appendingPathComponent("jwks.json").path, log: log)
        if case .failure(let failure) = file.current() { throw failure }
        let authority: FakeAppleAuthority
        if let settings = configuration.settings {
            let keyPath = directory.appendingPathComponent("private-key.pem").path
            guard let pemData = FileManager.default.contents(atPath: keyPath) else {
                throw FakeAppleError("cannot read \(keyPath)")
            }
            let pem = String(decoding: pemData, as: UTF8.self)
            let unnamed = try NotificationSigner(privateKeyPEM: pem)
            // Sign with the kid that jwks.json publishes for this key, so verifiers find it.
            let published =
                (try? JSONWebKeySet(
                    jsonData: (try? Data(contentsOf: URL(fileURLWithPath: file.path))) ?? Data()))
            let kid = published?.keyIDs.first {
                published?.key(id: $0)?.modulus == unnamed.publicKey().modulus
            }
            guard let kid else { throw FakeAppleError("\(keyPath) is not the key published in \(file.path)") }
            authority = FakeAppleAuthority(
                settings: settings, signer: try NotificationSigner(privateKeyPEM: pem, keyID: kid),
                fault: configuration.fault, log: log)
        } else {
            authority = FakeAppleAuthority(
                settings: nil, signer: try NotificationSigner.generate(), fault: nil, log: log)
        }
        var http = HTTPServer.Configuration()
        http.host = configuration.host
        http.port = configuration.port
        http.threadCount = configuration.threadCount
        self.authority = authority
        self.keySet = file
        self.host = configuration.host
        server = HTTPServer(
            configuration: http,
            onResponse: { request, response, _ in
                log("\(request.remoteAddress) \(request.method) \(request.path) \(response.status)")
            },
            handler: { request in
                if let answer = authority.handle(request) { return answer }
                guard request.path == Self.keysPath else { return .error(status: 404, "not found") }
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
    }

    /// Starts listening.
    public func start() throws(HTTPServerError) { try server.start() }

    /// The port it listens on, once started.
    public var port: Int? { server.port }

    /// The bound address (`HOST:PORT`), once started.
    public var address: String? { server.address }

    /// `http://HOST:PORT`, once started.
    public var baseURL: String? {
        port.map { "http://\(host.contains(":") ? "[\(host)]" : host):\($0)" }
    }

    /// Stops listening, letting requests in flight finish within `gracePeriod`.
    @discardableResult
    public func shutdown(gracePeriod: Duration = .seconds(2)) -> Bool {
        server.shutdown(gracePeriod: gracePeriod)
    }
}

/// The JWKS file, re-read whenever its identity, size or modification time changes. A file that is
/// not a valid key set is reported once and the last good one is kept.
public final class KeySetFile: Sendable {
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

    /// The file's path.
    public let path: String
    private let state = Mutex(State())
    private let log: @Sendable (String) -> Void

    /// The key set at `path`; loads and refusals are reported to `log`.
    public init(path: String, log: @escaping @Sendable (String) -> Void) {
        self.path = path
        self.log = log
    }

    /// The key set to serve, or why there is none.
    public func current() -> Result<Data, FakeAppleError> {
        var info = stat()
        guard stat(path, &info) == 0 else {
            return state.withLock {
                $0.body.map { .success($0) } ?? .failure(FakeAppleError("cannot read \(path)"))
            }
        }
        let stamp = Stamp(inode: UInt64(info.st_ino), size: Int64(info.st_size), modified: info.st_mtim)
        return state.withLock { state -> Result<Data, FakeAppleError> in
            if state.stamp != stamp {
                state.stamp = stamp
                if let data = FileManager.default.contents(atPath: path),
                    let keys = try? JSONWebKeySet(jsonData: data), !keys.keyIDs.isEmpty
                {
                    state.body = data
                    log("loaded \(path): kids \(keys.keyIDs.joined(separator: ", "))")
                } else {
                    log("\(path) is not a usable key set; keeping the previous one")
                }
            }
            return state.body.map { .success($0) }
                ?? .failure(FakeAppleError("\(path) is not a usable key set"))
        }
    }
}
