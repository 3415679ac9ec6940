import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// `siwactl doctor` against loopback endpoints set up wrong on purpose, and one set up right.
@Suite("siwactl doctor finds each misconfiguration of a deployed endpoint")
struct DoctorTests {
    static let path = "/apple/notifications"

    static func doctor(
        _ url: String, _ extra: [String] = ["--allow-http-loopback"], environment: [String: String] = [:]
    )
        throws -> ExecutableLocator.Result
    {
        try siwactl(["doctor"] + extra + [url], environment: environment)
    }

    /// The output line of a check, e.g. "FAIL  route  …".
    static func line(_ result: ExecutableLocator.Result, _ check: String) -> String? {
        result.standardOutput.split(separator: "\n").map(String.init).first {
            $0.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first.map(String.init)
                == check
        }
    }

    @Test("a working receiver passes every check (plain http to loopback only a warning), exit 0")
    func workingReceiver() throws {
        let receiver = try ReceiverHarness(audience: "com.example.doctor")
        let result = try Self.doctor(
            receiver.notificationURL, ["--allow-http-loopback", "--audience", "com.example.doctor"])
        #expect(result.status == 0, "\(result.standardOutput)\(result.standardError)")
        #expect(Self.line(result, "route")?.hasPrefix("ok") == true, "\(result.standardOutput)")
        #expect(Self.line(result, "signature")?.hasPrefix("ok") == true, "\(result.standardOutput)")
        #expect(Self.line(result, "https")?.hasPrefix("warn") == true, "\(result.standardOutput)")
        #expect(Self.line(result, "time") != nil, "\(result.standardOutput)")
        #expect(!result.standardOutput.contains("FAIL"), "\(result.standardOutput)")
        // The forged notification was refused, so nothing was stored.
        #expect(try receiver.totalRows() == 0)
    }

    @Test("a server answering 404 at the URL is a wrong path")
    func wrongPath() throws {
        let server = try StaticHTTPServer(path: "/somewhere-else")
        defer { server.stop() }
        let result = try Self.doctor("http://127.0.0.1:\(server.port)\(Self.path)")
        #expect(result.status == 1)
        let route = Self.line(result, "route") ?? ""
        #expect(route.hasPrefix("FAIL") && route.contains("wrong path"), "\(result.standardOutput)")
    }

    @Test("a stub answering 200 to everything is reported as verification off")
    func verificationOff() throws {
        let stub = try StaticHTTPServer(path: Self.path, body: Data(#"{"status":"accepted"}"#.utf8))
        defer { stub.stop() }
        let result = try Self.doctor("http://127.0.0.1:\(stub.port)\(Self.path)")
        #expect(result.status == 1)
        let signature = Self.line(result, "signature") ?? ""
        #expect(
            signature.hasPrefix("FAIL") && signature.contains("verification is off"),
            "\(result.standardOutput)")
        #expect(Self.line(result, "route")?.contains("accepts anything") == true, "\(result.standardOutput)")
    }

    @Test("plain http without --allow-http-loopback fails and sends nothing")
    func plainHTTP() throws {
        let stub = try StaticHTTPServer(path: Self.path, body: Data(#"{"status":"accepted"}"#.utf8))
        defer { stub.stop() }
        let result = try Self.doctor("http://127.0.0.1:\(stub.port)\(Self.path)", [])
        #expect(result.status == 1)
        #expect(Self.line(result, "https")?.hasPrefix("FAIL") == true, "\(result.standardOutput)")
        #expect(stub.requestCount == 0)
        // The flag does not open plain http to a host that is not loopback.
        let remote = try Self.doctor("http://192.0.2.1\(Self.path)")
        #expect(remote.status == 1)
        #expect(Self.line(remote, "https")?.hasPrefix("FAIL") == true, "\(remote.standardOutput)")
    }

    @Test("a slow answer and a 400 to a notification are warnings, not failures: exit 0")
    func warningsOnly() throws {
        let server = try StaticHTTPServer(path: Self.path)
        defer { server.stop() }
        server.fail(status: 400)
        server.setDelay(.milliseconds(1500))
        let result = try Self.doctor(
            "http://127.0.0.1:\(server.port)\(Self.path)", ["--allow-http-loopback", "--slow-after", "1"])
        #expect(result.status == 0, "\(result.standardOutput)")
        #expect(Self.line(result, "route")?.hasPrefix("ok") == true, "\(result.standardOutput)")
        #expect(Self.line(result, "signature")?.hasPrefix("warn") == true, "\(result.standardOutput)")
        #expect(Self.line(result, "time")?.hasPrefix("warn") == true, "\(result.standardOutput)")
        #expect(result.standardOutput.contains("healthy: 0 failed, 3 warning(s)"), "\(result.standardOutput)")
    }

    @Test("nothing listening is a connection failure")
    func nothingListening() throws {
        let nothing = try RefusingPort()  // held until the end of scope
        defer { withExtendedLifetime(nothing) {} }
        let result = try Self.doctor("http://127.0.0.1:\(nothing.port)\(Self.path)")
        #expect(result.status == 1)
        #expect(Self.line(result, "connection")?.hasPrefix("FAIL") == true, "\(result.standardOutput)")
    }

    @Test("a host that does not resolve fails the DNS check")
    func unresolvable() throws {
        let result = try Self.doctor("https://doctor.example.invalid\(Self.path)", [])
        #expect(result.status == 1)
        #expect(Self.line(result, "dns")?.hasPrefix("FAIL") == true, "\(result.standardOutput)")
    }

    @Test("a bad URL is a usage error")
    func usage() throws {
        #expect(try Self.doctor("not a url", []).status == 2)
        #expect(try Self.doctor("ftp://127.0.0.1/x", []).status == 2)
    }

    /// Runs `body` with the port of `openssl s_server` serving a self-signed certificate for "localhost"
    /// (TEST ONLY), with `options` added (e.g. a protocol version), and the certificate's path.
    static func withSelfSignedServer(
        _ options: [String] = [], _ body: (_ port: Int, _ certificate: String) throws -> Void
    ) throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("siwa-doctor-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let made = try Subprocess.run(
            "/bin/sh",
            [
                "-c",
                "openssl req -x509 -newkey rsa:2048 -nodes -keyout server.key -out server.pem -days 1 "
                    + "-subj /CN=localhost -addext subjectAltName=DNS:localhost 2>/dev/null",
            ], workingDirectory: directory.path)
        try #require(made.status == 0, "\(made.standardError)")
        // Port 0: s_server prints "ACCEPT 127.0.0.1:PORT" once it listens.
        let output = directory.appendingPathComponent("s_server.out")
        let server = try Subprocess(
            "/usr/bin/openssl",
            [
                "s_server", "-accept", "127.0.0.1:0", "-cert", "server.pem", "-key", "server.key", "-WWW",
            ] + options,
            standardOutput: output.path, workingDirectory: directory.path)
        defer {
            server.send(SIGKILL)
            _ = server.wait(timeout: .seconds(5))
        }
        let port = try ListenAddresses.printedPort("ACCEPT", in: output, of: server)
        try body(port, directory.appendingPathComponent("server.pem").path)
    }

    @Test("a self-signed certificate fails the TLS check with its fix")
    func selfSigned() throws {
        try Self.withSelfSignedServer { port, _ in
            let result = try Self.doctor("https://localhost:\(port)\(Self.path)", [])
            #expect(result.status == 1)
            let tls = Self.line(result, "tls") ?? ""
            #expect(tls.hasPrefix("FAIL") && tls.contains("self-signed"), "\(result.standardOutput)")
            #expect(result.standardOutput.contains("fix: serve a certificate chain from a public CA"))
        }
    }

    @Test("an endpoint offering only TLS 1.1 fails the TLS check, even with its certificate trusted")
    func oldTLS() throws {
        try Self.withSelfSignedServer(["-tls1_1", "-cipher", "DEFAULT@SECLEVEL=0"]) {
            port, certificate in
            let result = try Self.doctor(
                "https://localhost:\(port)\(Self.path)", [], environment: ["SSL_CERT_FILE": certificate])
            #expect(result.status == 1)
            let tls = Self.line(result, "tls") ?? ""
            #expect(tls.hasPrefix("FAIL") && tls.contains("TLS older than 1.2"), "\(result.standardOutput)")
        }
    }

    @Test("a working receiver behind an nginx TLS proxy passes every check, TLS included, exit 0")
    func workingReceiverOverTLS() throws {
        let receiver = try ReceiverHarness(audience: "com.example.doctor")
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("siwa-doctor-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        // TEST ONLY: a throwaway CA (trusted through SSL_CERT_FILE) and a certificate for "localhost".
        try makeLocalhostCertificate(in: directory)
        // nginx cannot bind port 0 and report it: it shares a port held here (SO_REUSEPORT) instead.
        let held = try RefusingPort(sharedByReusePort: true)
        defer { withExtendedLifetime(held) {} }
        let port = held.port
        let dir = directory.path
        let configuration = """
            daemon off;
            master_process off;
            error_log \(dir)/error.log;
            pid \(dir)/nginx.pid;
            events {}
            http {
                access_log off;
                client_body_temp_path \(dir)/body;
                proxy_temp_path \(dir)/proxy;
                server {
                    listen 127.0.0.1:\(port) ssl reuseport;
                    server_name localhost;
                    ssl_certificate \(dir)/server.pem;
                    ssl_certificate_key \(dir)/server.key;
                    ssl_protocols TLSv1.2 TLSv1.3;
                    location / { proxy_pass http://127.0.0.1:\(receiver.port); }
                }
            }
            """
        try configuration.write(
            to: directory.appendingPathComponent("nginx.conf"), atomically: true, encoding: .utf8)
        let nginx = try Subprocess(
            "/usr/sbin/nginx", ["-p", dir, "-c", "\(dir)/nginx.conf"], workingDirectory: dir)
        defer {
            nginx.send(SIGKILL)
            _ = nginx.wait(timeout: .seconds(5))
        }
        try #require(waitUntil { (try? RawHTTPConnection(host: "127.0.0.1", port: port)) != nil })
        let result = try Self.doctor(
            "https://localhost:\(port)\(Self.path)",
            ["--audience", "com.example.doctor", "--slow-after", "30"],
            environment: ["SSL_CERT_FILE": "\(dir)/ca.pem"])
        #expect(result.status == 0, "\(result.standardOutput)\(result.standardError)")
        for check in ["dns", "tls", "route", "signature", "time"] {
            #expect(Self.line(result, check)?.hasPrefix("ok") == true, "\(check): \(result.standardOutput)")
        }
        #expect(Self.line(result, "https") == nil, "\(result.standardOutput)")
        #expect(result.standardOutput.contains("healthy: 0 failed, 0 warning(s)"), "\(result.standardOutput)")
    }
}
