import Foundation
import TestSupport
import Testing

/// `siwactl simulate` through a TLS endpoint whose certificate a private CA signed (a TLS proxy in
/// front of a staging receiver): trusted through SSL_CERT_FILE or --cacert, refused otherwise.
@Suite("siwactl simulate honours SSL_CERT_FILE and --cacert")
struct SimulateTLSTests {
    @Test("refused without the CA; answered with --cacert and with SSL_CERT_FILE")
    func privateCA() throws {
        let directory = try scratchDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        // TEST ONLY: a throwaway CA and a certificate for "localhost" it signed.
        try makeLocalhostCertificate(in: directory)
        let keys = directory.appendingPathComponent("keys")
        let keygen = try siwactl(["keygen", "--out", keys.path])
        try #require(keygen.status == 0, "\(keygen.standardError)")

        // An HTTPS endpoint that answers every POST as an accepting receiver would.
        let output = directory.appendingPathComponent("server.out")
        let server = try Subprocess(
            "/usr/bin/python3",
            [
                "-c",
                """
                import http.server, ssl
                class H(http.server.BaseHTTPRequestHandler):
                    def do_POST(self):
                        self.rfile.read(int(self.headers.get('Content-Length', 0)))
                        body = b'{"status":"accepted"}'
                        self.send_response(200)
                        self.send_header('Content-Length', str(len(body)))
                        self.end_headers()
                        self.wfile.write(body)
                    def log_message(self, *args):
                        pass
                s = http.server.HTTPServer(('127.0.0.1', 0), H)
                c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                c.load_cert_chain('server.pem', 'server.key')
                s.socket = c.wrap_socket(s.socket, server_side=True)
                print(f'ACCEPT 127.0.0.1:{s.server_port}', flush=True)
                s.serve_forever()
                """,
            ], standardOutput: output.path, workingDirectory: directory.path)
        defer {
            server.send(SIGKILL)
            _ = server.wait(timeout: .seconds(5))
        }
        let port = try ListenAddresses.printedPort("ACCEPT", in: output, of: server)

        let arguments = [
            "simulate", "--to", "https://localhost:\(port)/apple/notifications", "--key",
            keys.appendingPathComponent("private-key.pem").path, "--audience", "com.example.app", "--type",
            "consent-revoked", "--sub", "001.tls",
        ]
        let refused = try siwactl(arguments)
        #expect(refused.status == 1, "\(refused.standardOutput)\(refused.standardError)")
        #expect(refused.standardOutput.contains("no answer"), "\(refused.standardOutput)")

        let ca = directory.appendingPathComponent("ca.pem").path
        let withFlag = try siwactl(arguments + ["--cacert", ca])
        #expect(withFlag.status == 0, "\(withFlag.standardOutput)\(withFlag.standardError)")
        #expect(withFlag.standardOutput.contains(#"200 {"status":"accepted"}"#), "\(withFlag.standardOutput)")

        let withEnvironment = try siwactl(arguments, environment: ["SSL_CERT_FILE": ca])
        #expect(
            withEnvironment.status == 0, "\(withEnvironment.standardOutput)\(withEnvironment.standardError)")
    }

    @Test("siwactl webhooks --help gives each subcommand's whole first sentence")
    func webhooksHelp() throws {
        let result = try siwactl(["webhooks", "--help"])
        #expect(result.status == 0)
        let lines = result.standardOutput.split(separator: "\n").filter { $0.hasPrefix("  ") }
        #expect(lines.count >= 7, "\(result.standardOutput)")
        for line in lines {
            #expect(line.hasSuffix("."), "cut off: \(line)")
        }
        #expect(
            result.standardOutput.contains(
                "Add a webhook endpoint: https (or http to a loopback IP literal)."),
            "\(result.standardOutput)")
    }
}
