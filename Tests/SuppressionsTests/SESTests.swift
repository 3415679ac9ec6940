import AppleNotifications
import Foundation
import HTTPClient
import Postgres
import QueueConsumer
import ServiceSupport
import Suppressions
import TestSupport
import Testing

/// AWS's SigV4 example credentials (the General Reference's test suite).
private let example = SigV4Signer.Credentials(
    accessKeyID: "AKIDEXAMPLE", secretAccessKey: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
private let emptyHash = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
/// 2015-08-30 12:36:00 UTC, the test suite's X-Amz-Date.
private let exampleDate = Date(timeIntervalSince1970: 1_440_938_160)

@Suite("Amazon SES v2: SigV4 and the account suppression list", .serialized)
struct SESTests {
    @Test("SigV4 get-vanilla: the canonical request, string to sign and signature AWS publishes")
    func getVanilla() {
        let signer = SigV4Signer(credentials: example, region: "us-east-1", service: "service")
        let signed = signer.signature(
            method: "GET", path: "/", query: nil,
            headers: [("Host", "example.amazonaws.com"), ("X-Amz-Date", "20150830T123600Z")],
            payloadHash: emptyHash, timestamp: "20150830T123600Z")
        #expect(
            signed.canonicalRequest
                == "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\n\(emptyHash)"
        )
        #expect(
            signed.stringToSign
                == "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\n"
                + "bb579772317eb040ac9ed261061d46c1f17a8133879d6129b6e1c25292927e63")
        let published =
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
            + "SignedHeaders=host;x-amz-date, "
            + "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
        #expect(signed.authorization == published)
        // The same through sign(), which derives Host from the URL and adds X-Amz-Date itself.
        let headers = signer.sign(
            method: "GET", url: "https://example.amazonaws.com/", headers: [], body: [], date: exampleDate,
            contentHash: false)
        #expect(headers.map(\.0) == ["X-Amz-Date", "Authorization"])
        #expect(headers.last?.1 == published)
        // get-vanilla-query-order-key-case: the query is sorted before it is signed.
        let query = signer.sign(
            method: "GET", url: "https://example.amazonaws.com/?Param2=value2&Param1=value1", headers: [],
            body: [], date: exampleDate, contentHash: false)
        #expect(
            query.last?.1.hasSuffix(
                "Signature=b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500")
                == true)
    }

    @Test(
        "every SES request signed as botocore's SigV4Auth signs it (body, encoded path, session token, port)")
    func matchesBotocore() throws {
        let token = "FQoGZXIvYXdzEXAMPLE//token+with/slashes="
        var requests: [SigV4Reference.Request] = []
        var ours: [String] = []
        for (endpoint, sessionToken) in [
            ("https://email.eu-west-1.amazonaws.com", nil), ("https://email.eu-west-1.amazonaws.com", token),
            ("http://127.0.0.1:8443", token),
        ] as [(String, String?)] {
            let provider = SESProvider(
                credentials: .init(
                    accessKeyID: example.accessKeyID, secretAccessKey: example.secretAccessKey,
                    sessionToken: sessionToken),
                region: "eu-west-1", endpoint: endpoint, now: { Date(timeIntervalSince1970: 1_796_000_000) })
            for request in [
                provider.request(.add, address: "a.b+c@privaterelay.appleid.com"),
                provider.request(.remove, address: "a.b+c@privaterelay.appleid.com"),
                provider.lookup(address: "x y@example.com"),
            ] {
                let headers = request.headers.filter { $0.name != "Authorization" }.map {
                    ($0.name, $0.value)
                }
                requests.append(
                    .init(
                        method: request.method, url: request.url, headers: headers, body: request.body ?? []))
                ours.append(request.headers.first { $0.name == "Authorization" }?.value ?? "none")
            }
            let tokens = try SigV4Reference.authorizations(
                Array(requests.suffix(3)), accessKeyID: example.accessKeyID,
                secretAccessKey: example.secretAccessKey, sessionToken: sessionToken, region: "eu-west-1",
                service: "ses")
            #expect(tokens == Array(ours.suffix(3)))
        }
        #expect(
            ours.allSatisfy { $0.contains("SignedHeaders=accept;") && $0.contains("x-amz-content-sha256") })
        #expect(ours[3].contains("x-amz-security-token"))
    }

    @Test("the credentials file: AWS's names, a section line and comments skipped, the token optional")
    func credentialsFile() throws {
        let key = try SigV4Signer.Credentials(
            fileText:
                "[default]\n# rotated monthly\naws_access_key_id = AKID1\nAWS_SECRET_ACCESS_KEY=s/e+c=\n")
        #expect(key.accessKeyID == "AKID1" && key.secretAccessKey == "s/e+c=" && key.sessionToken == nil)
        let temporary = try SigV4Signer.Credentials(
            fileText: "aws_access_key_id=A\naws_secret_access_key=B\naws_session_token = T==\n")
        #expect(temporary.sessionToken == "T==")
        #expect(throws: ConfigurationError.self) {
            try SigV4Signer.Credentials(fileText: "aws_access_key_id=A\n")
        }
        #expect(throws: ConfigurationError.self) {
            try SigV4Signer.Credentials(fileText: "secret-on-its-own\n")
        }
    }

    @Test("calls per event against the fake SES, each signature checked: 2 per add, 2 per remove of ours")
    func callsPerEvent() throws {
        let fixture = try Fixture([.ses])
        let fake = fixture.fakes["ses"]!
        try fixture.database.connection.execute(
            "INSERT INTO siwa.accounts (sub, email, is_private_email) VALUES ('s2', $1, true)", [.text(bob)])
        try fixture.apply([("email-disabled", "s1", alice)])
        #expect(try fixture.dispatcher().drainOnce().map(\.outcome.recordedName) == ["done"])
        #expect(fake.sesEntries[alice]?.reason == "BOUNCE" && fake.sesEntries[alice]?.messageID == nil)
        try fixture.apply([("email-enabled", "s1", alice), ("account-delete", "s2", nil)])
        #expect(try fixture.dispatcher().drainOnce().map(\.outcome.recordedName) == ["done", "done"])
        let path = "/v2/email/suppression/addresses"
        #expect(
            fake.calls.map { "\($0.method) \($0.path) \($0.status)" } == [
                "GET \(path)/\(alice) 404", "PUT \(path) 200", "GET \(path)/\(alice) 200",
                "DELETE \(path)/\(alice) 200", "GET \(path)/\(bob) 404", "PUT \(path) 200",
            ])
        #expect(fake.suppressed == [bob])
    }

    @Test(
        "ownership: SES's own suppression is not added nor removed; ours, re-listed by SES since, is left")
    func ownership() throws {
        let fixture = try Fixture([.ses], preset: [alice])
        let fake = fixture.fakes["ses"]!
        try fixture.apply([("email-disabled", "s1", alice), ("email-disabled", "s2", bob)])
        #expect(
            try fixture.dispatcher().drainOnce().map(\.outcome.recordedName) == ["already_there", "done"])
        // SES suppresses bob for a bounce of its own after our add: the entry is no longer ours.
        fake.suppressAsSES(bob)
        try fixture.apply([("email-enabled", "s1", alice), ("email-enabled", "s2", bob)])
        #expect(try fixture.dispatcher().drainOnce().map(\.outcome.recordedName) == ["not_ours"])
        #expect(fake.suppressed == [alice, bob])
        #expect(!fake.calls.contains { $0.method == "DELETE" })
        #expect(
            try fixture.rows() == [
                "ses add done already_there", "ses add done done", "ses remove done not_ours",
                "ses remove done not_ours",
            ])
        #expect(try fixture.database.value("SELECT count(*) FROM siwa.suppressions_we_added") as Int == 0)
    }

    @Test("a remove whose entry is gone already: not_there after the read, no DELETE")
    func removeAbsent() throws {
        let fixture = try Fixture([.ses])
        let fake = fixture.fakes["ses"]!
        try fixture.apply([("email-disabled", "s1", alice)])
        #expect(try fixture.dispatcher().drainOnce().map(\.outcome.recordedName) == ["done"])
        // Someone took it off the list in the console meanwhile.
        fake.script([.init(status: 404)])
        try fixture.apply([("email-enabled", "s1", alice)])
        #expect(try fixture.dispatcher().drainOnce().map(\.outcome.recordedName) == ["not_there"])
        #expect(fake.calls.map(\.method) == ["GET", "PUT", "GET"])
    }

    @Test(
        "SES errors: 429 TooManyRequestsException retried, 400 BadRequestException and a bad signature permanent"
    )
    func errors() throws {
        let fixture = try Fixture([.ses])
        let fake = fixture.fakes["ses"]!
        fake.script([
            .init(status: 429, headers: [("x-amzn-ErrorType", "TooManyRequestsException")]),
            .init(status: 404), .init(status: 400, headers: [("x-amzn-ErrorType", "BadRequestException")]),
        ])
        try fixture.apply([("email-disabled", "s1", alice)])
        #expect(try fixture.dispatcher().drainOnce().map(\.outcome.recordedName) == ["retry"])
        try fixture.makeDue()
        #expect(try fixture.dispatcher().drainOnce().map(\.outcome.recordedName) == ["permanent"])
        // A wrong secret: the fake recomputes the signature and refuses it.
        let wrong = SESProvider(
            credentials: .init(accessKeyID: FakeSuppressionProvider.sesAccessKeyID, secretAccessKey: "wrong"),
            region: FakeSuppressionProvider.sesRegion, endpoint: fake.baseURL)
        try fixture.apply([("email-disabled", "s2", bob)])
        let dispatcher = SuppressionDispatcher(
            configuration: try .init(
                database: try fixture.database.configuration(asMemberOf: "siwa_worker"),
                providers: ["ses": wrong]),
            logger: quietLogger)
        let refused = try #require(try dispatcher.drainOnce().first)
        #expect(refused.outcome.recordedName == "permanent" && refused.status == 403)
        #expect(fake.suppressed.isEmpty)
    }
}

@Suite("Amazon SES v2: the credentials file read again when it changes", .serialized)
struct SESCredentialsRotationTests {
    /// Writes an SES credentials file for `secret` as rotation does: a new file renamed over the old.
    func write(_ path: String, secret: String, mode: Int = 0o600) throws {
        let next = path + ".next"
        try Data(
            "aws_access_key_id = \(FakeSuppressionProvider.sesAccessKeyID)\naws_secret_access_key = \(secret)\n"
                .utf8
        ).write(to: URL(fileURLWithPath: next))
        try FileManager.default.setAttributes([.posixPermissions: mode], ofItemAtPath: next)
        _ = rename(next, path)
    }

    @Test(
        "a rotated --ses-credentials-file: the next call is signed with the new key; a bad file keeps the last good one, logged without the secret"
    )
    func rotated() throws {
        let fixture = try Fixture([.ses])
        let fake = fixture.fakes["ses"]!
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(UUID().uuidString)
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("ses-credentials").path
        try write(path, secret: fake.credential)
        let logs = LogCapture()
        let file = try SESCredentialsFile(path: path, logger: logs.logger())
        let dispatcher = SuppressionDispatcher(
            configuration: try .init(
                database: try fixture.database.configuration(asMemberOf: "siwa_worker"),
                providers: [
                    "ses": SESProvider(
                        credentialsFile: file, region: FakeSuppressionProvider.sesRegion,
                        endpoint: fake.baseURL)
                ]),
            logger: quietLogger)
        try fixture.apply([("email-disabled", "s1", alice)])
        #expect(try dispatcher.drainOnce().map(\.outcome.recordedName) == ["done"])
        // The key is rotated: SES accepts only the new one, which the file now holds.
        fake.rotateCredential("rotated-secret/1")
        try write(path, secret: "rotated-secret/1")
        try fixture.apply([("email-enabled", "s1", alice)])
        #expect(try dispatcher.drainOnce().map(\.outcome.recordedName) == ["done"])
        #expect(fake.calls.map(\.status) == [404, 200, 200, 200])
        // A new file open to others is refused: the last good key stays, the error is logged once.
        try write(path, secret: "leaked-secret", mode: 0o644)
        try fixture.apply([("email-disabled", "s2", bob)])
        #expect(try dispatcher.drainOnce().map(\.outcome.recordedName) == ["done"])
        #expect(fake.calls.suffix(2).map(\.status) == [404, 200])
        #expect(logs.all.contains("chmod 600") && logs.all.contains("ses-credentials"))
        #expect(!logs.all.contains("leaked-secret") && !logs.all.contains("rotated-secret"))
    }
}
