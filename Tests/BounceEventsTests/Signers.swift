import Foundation
import TestSupport
import Testing

/// Keys, certificates and signatures made by the `openssl` command (TEST ONLY), never by the code under
/// test: SendGrid's P-256 key, an RSA "SNS" signing certificate, and a TLS certificate for localhost.
final class Signers: Sendable {
    let directory: URL
    /// SendGrid's verification key as its Mail Settings show it: base64 DER SubjectPublicKeyInfo.
    let sendGridPublicKey: String

    init() throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("siwa-esp-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        try Self.shell(
            """
            openssl ecparam -name prime256v1 -genkey -noout -out sendgrid.pem &&
            openssl pkey -in sendgrid.pem -pubout -outform DER -out sendgrid.der &&
            openssl req -x509 -newkey rsa:2048 -nodes -keyout sns.key -out sns-cert.pem -days 1 \
                -subj /CN=sns.us-east-1.amazonaws.com &&
            openssl req -x509 -newkey rsa:2048 -nodes -keyout other.key -out other-cert.pem -days 1 \
                -subj /CN=sns.us-east-1.amazonaws.com &&
            openssl req -x509 -newkey rsa:2048 -nodes -keyout tls.key -out tls.pem -days 1 \
                -subj /CN=localhost -addext subjectAltName=DNS:localhost
            """, in: directory)
        sendGridPublicKey = try Data(contentsOf: directory.appendingPathComponent("sendgrid.der"))
            .base64EncodedString()
    }

    deinit { try? FileManager.default.removeItem(at: directory) }

    /// The TLS certificate of the loopback HTTPS server (trusted through SSL_CERT_FILE).
    var tlsCertificate: String { directory.appendingPathComponent("tls.pem").path }

    /// `openssl dgst -<digest> -sign <key>` of `message`: DER ECDSA or PKCS #1 v1.5 RSA.
    func sign(_ message: [UInt8], key: String, digest: String = "sha256") throws -> Data {
        let name = UUID().uuidString
        try Data(message).write(to: directory.appendingPathComponent(name))
        try Self.shell("openssl dgst -\(digest) -sign \(key) -out \(name).sig \(name)", in: directory)
        return try Data(contentsOf: directory.appendingPathComponent("\(name).sig"))
    }

    /// Hex HMAC-SHA256 by `openssl dgst -hmac`.
    func hmac(key: String, _ message: String) throws -> String {
        let result = try Subprocess.run(
            "/usr/bin/openssl", ["dgst", "-sha256", "-hmac", key, "-r"], input: Data(message.utf8))
        try #require(result.status == 0, "\(result.standardError)")
        return String(result.standardOutput.prefix(64))
    }

    static func shell(_ script: String, in directory: URL) throws {
        let result = try Subprocess.run(
            "/bin/sh", ["-c", script + " 2>/dev/null"], workingDirectory: directory.path)
        try #require(result.status == 0, "\(result.standardError)")
    }

    /// Runs `body` with the port of a Python HTTPS server for localhost that answers every GET 200 and
    /// appends its path to `requests` (SNS's SubscribeURL, as the listener confirms a subscription).
    func withConfirmationServer(_ body: (_ port: Int, _ requests: URL) throws -> Void) throws {
        let script = """
            import http.server, ssl, sys
            class Handler(http.server.BaseHTTPRequestHandler):
                def do_GET(self):
                    with open(sys.argv[1], "a") as log:
                        log.write(self.path + "\\n")
                    self.send_response(200)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                def log_message(self, *args):
                    pass
            server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain("tls.pem", "tls.key")
            server.socket = context.wrap_socket(server.socket, server_side=True)
            print("ACCEPT 127.0.0.1:%d" % server.server_address[1], flush=True)
            server.serve_forever()
            """
        let requests = directory.appendingPathComponent("requests-\(UUID())")
        let output = directory.appendingPathComponent("confirm-\(UUID()).out")
        let server = try Subprocess(
            "/usr/bin/python3", ["-c", script, requests.path], standardOutput: output.path,
            workingDirectory: directory.path)
        defer {
            server.send(SIGKILL)
            _ = server.wait(timeout: .seconds(5))
        }
        let port = try ListenAddresses.printedPort("ACCEPT", in: output, of: server)
        try body(port, requests)
    }

    /// Runs `body` with the port of `openssl s_server -WWW` serving this directory over TLS for localhost.
    func withHTTPSServer(_ body: (_ port: Int) throws -> Void) throws {
        let output = directory.appendingPathComponent("s_server-\(UUID()).out")
        let server = try Subprocess(
            "/usr/bin/openssl",
            ["s_server", "-accept", "127.0.0.1:0", "-cert", "tls.pem", "-key", "tls.key", "-WWW"],
            standardOutput: output.path, workingDirectory: directory.path)
        defer {
            server.send(SIGKILL)
            _ = server.wait(timeout: .seconds(5))
        }
        let port = try ListenAddresses.printedPort("ACCEPT", in: output, of: server)
        try body(port)
    }
}
