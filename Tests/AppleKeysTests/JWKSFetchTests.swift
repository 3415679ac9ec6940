import AppleKeys
import AppleNotifications
import Foundation
import TestSupport
import Testing

/// Key fetching against hostile key servers on loopback: each answer is written by hand, so the
/// server can lie about encodings and lengths, stream without end, or redirect.
@Suite("Fetching the key set trusts the network no further than TLS", .serialized)
struct JWKSFetchTests {
    @Test(
        "http is allowed only for IP literals in 127.0.0.0/8, ::1 and localhost",
        arguments: [
            ("http://127.0.0.1:8080/auth/keys", true), ("http://127.254.3.9/k", true),
            ("http://[::1]:9/k", true), ("http://localhost:9/k", true), ("http://LOCALHOST/k", true),
            ("https://appleid.apple.com/auth/keys", true), ("https://127.attacker.example/k", true),
            ("http://127.attacker.example/auth/keys", false), ("http://127.0.0.1.nip.io/k", false),
            ("http://localhost.attacker.example/k", false), ("http://128.0.0.1/k", false),
            ("http://[::2]/k", false), ("http://[::ffff:10.0.0.1]/k", false), ("http://10.0.0.1/k", false),
            ("http://0x7f.0.0.1/k", false), ("ftp://127.0.0.1/k", false),
        ])
    func loopbackPolicy(url: String, allowed: Bool) throws {
        let result = Result { try JWKSSource(url: URL(string: url)!) }
        switch result {
        case .success: #expect(allowed, "\(url) was accepted")
        case .failure(let error):
            #expect(!allowed, "\(url) was refused: \(error)")
            #expect(String(describing: error).contains("https"))
        }
    }

    @Test("the fetch asks for identity encoding and loads a plain key set")
    func identityRequested() throws {
        let body = Array(TestSigning.apple.jwksJSON())
        let server = try ScriptedHTTPServer { _, write in
            _ = write(
                Self.head(200, ["Content-Length: \(body.count)", "Content-Type: application/json"]) + body)
        }
        let data = try JWKSSource(url: server.url(), timeout: 5).fetch()
        #expect(try JSONWebKeySet(jsonData: data).keyIDs == [TestSigning.apple.keyID])
        let head = try #require(server.requestHeads.first).lowercased()
        #expect(head.contains("accept-encoding: identity\r\n"))
    }

    @Test("a gzip bomb is refused without being inflated, and memory stays bounded")
    func gzipBomb() throws {
        // 512 MiB of zeros, about 0.5 MiB gzipped: inflated, it would take the process past 512 MiB.
        let bomb = try Self.gzippedZeros(megabytes: 512)
        #expect(bomb.count < 1 << 20)
        let server = try ScriptedHTTPServer { _, write in
            _ = write(
                Self.head(
                    200,
                    [
                        "Content-Length: \(bomb.count)", "Content-Encoding: gzip",
                        "Content-Type: application/json",
                    ])
                    + bomb)
        }
        let before = Self.residentBytes()
        Self.resetPeakResident()
        let started = ContinuousClock.now
        let error = try #require(throws: JWKSFetchError.self) {
            try JWKSSource(url: server.url(), timeout: 10).fetch()
        }
        let growth = Self.peakResidentBytes() - before
        print(
            "[jwks] gzip bomb: \(error); peak RSS growth \(growth >> 20) MiB in \(ContinuousClock.now - started)"
        )
        #expect(error.description.contains("Content-Encoding"))
        #expect(growth < 128 << 20, "peak RSS grew by \(growth >> 20) MiB")
    }

    @Test("a Content-Length above the limit is refused before any of the body is read")
    func oversizedContentLength() throws {
        let server = try ScriptedHTTPServer { _, write in
            // Announce 64 MiB, send nothing more: a client that waits for the body times out.
            _ = write(Self.head(200, ["Content-Length: \(64 << 20)", "Content-Type: application/json"]))
            Thread.sleep(forTimeInterval: 6)
        }
        let started = ContinuousClock.now
        let error = try #require(throws: JWKSFetchError.self) {
            try JWKSSource(url: server.url(), timeout: 5, maxBytes: 1 << 20).fetch()
        }
        #expect(error.description.contains("Content-Length"), "\(error)")
        #expect(ContinuousClock.now - started < .seconds(3))
    }

    @Test("a chunked body is cut off once it passes the limit, while it streams")
    func chunkedOversize() throws {
        let chunk = [UInt8](repeating: 0x20, count: 64 << 10)
        let chunkFrame = Array("\(String(chunk.count, radix: 16))\r\n".utf8) + chunk + Array("\r\n".utf8)
        let server = try ScriptedHTTPServer { _, write in
            guard write(Self.head(200, ["Transfer-Encoding: chunked", "Content-Type: application/json"]))
            else { return }
            // Up to 256 MiB, until the client hangs up.
            for _ in 0..<4096 where write(chunkFrame) {}
        }
        let error = try #require(throws: JWKSFetchError.self) {
            try JWKSSource(url: server.url(), timeout: 10, maxBytes: 1 << 20).fetch()
        }
        #expect(error.description.contains("larger than"), "\(error)")
        #expect(waitUntil(timeout: .seconds(10)) { server.requestHeads.count == 1 })
        // Socket buffers hold a few MiB; reading on to the end would have taken all 256 MiB.
        Thread.sleep(forTimeInterval: 0.5)
        print("[jwks] chunked oversize: the server wrote \(server.bytesWritten >> 20) MiB before the cut")
        #expect(server.bytesWritten < 32 << 20)
    }

    @Test("a redirect is refused: its target is never asked, and its keys never verify a token")
    func redirectRefused() throws {
        let target = try JWKSTestServer(body: TestSigning.other.jwksJSON())
        defer { target.stop() }
        let redirector = try ScriptedHTTPServer { _, write in
            _ = write(Self.head(302, ["Location: \(target.url.absoluteString)", "Content-Length: 0"]))
        }
        let error = try #require(throws: JWKSFetchError.self) {
            try JWKSSource(url: redirector.url(), timeout: 5).fetch()
        }
        #expect(error.description.contains("redirect"), "\(error)")
        #expect(target.requestCount == 0)

        // Through the key store, as the receiver uses it: the attacker's kid stays unknown.
        let store = KeyStore(source: { try JWKSSource(url: redirector.url(), timeout: 5).fetch() })
        #expect(throws: NotificationError.self) { try store.key(id: TestSigning.other.keyID) }
        #expect(!store.hasKeys)
        #expect(target.requestCount == 0)
    }

    // MARK: - Helpers

    static func head(_ status: Int, _ headers: [String]) -> [UInt8] {
        let reason = status == 200 ? "OK" : "Found"
        return Array(
            (["HTTP/1.1 \(status) \(reason)", "Connection: close"] + headers).joined(separator: "\r\n")
                .appending("\r\n\r\n").utf8)
    }

    /// `megabytes` MiB of zero bytes, gzipped by the system's gzip.
    static func gzippedZeros(megabytes: Int) throws -> [UInt8] {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("bomb-\(UUID()).gz")
        defer { try? FileManager.default.removeItem(at: file) }
        let result = try Subprocess.run(
            "/bin/sh", ["-c", "head -c \(megabytes)M /dev/zero | gzip -9 > '\(file.path)'"],
            timeout: .seconds(120))
        guard result.status == 0 else { throw TestHTTPError("gzip failed: \(result.standardError)") }
        return Array(try Data(contentsOf: file))
    }

    static func statusField(_ name: String) -> Int {
        guard let text = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8) else { return 0 }
        for line in text.split(separator: "\n") where line.hasPrefix(name + ":") {
            let kilobytes = line.split(separator: " ").dropFirst().first.flatMap { Int($0) } ?? 0
            return kilobytes * 1024
        }
        return 0
    }

    static func residentBytes() -> Int { statusField("VmRSS") }
    static func peakResidentBytes() -> Int { statusField("VmHWM") }

    /// Resets VmHWM to the current RSS (Linux: writing 5 to clear_refs).
    static func resetPeakResident() {
        try? "5".write(toFile: "/proc/self/clear_refs", atomically: false, encoding: .utf8)
    }
}
