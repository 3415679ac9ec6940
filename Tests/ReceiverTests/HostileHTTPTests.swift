import AppleNotifications
import Foundation
import TestSupport
import Testing

/// Attacks on the live receiver over raw sockets. Every test runs its attack while a ``Canary``
/// keeps delivering genuine notifications (one every 20 ms), and checks that each canary delivery
/// got 200 with p99 latency and memory growth within ``ServiceBounds`` (measurements are printed
/// as `[hostile] …` lines), that the attack was refused or cut off, and that it stored nothing.
@Suite("Hostile HTTP against a running receiver", .serialized)
struct HostileHTTPTests {
    /// The `sub` of notifications that attacks carry, where they carry any.
    static let attacker = "001.attack"

    // MARK: - Slow clients

    /// libmicrohttpd's timeout is an idle timeout: headers dripping faster than it keep a connection
    /// (bounded by the connection limit and 32 KiB of header memory each; nginx's total header
    /// timeout cuts them in production). So this checks that dripping connections cannot starve
    /// deliveries, and that they are cut off as soon as they pause for one timeout.
    @Test("slowloris: 200 connections dripping header bytes do not starve deliveries and are then cut off")
    func slowlorisHeaders() throws {
        let harness = try ReceiverHarness(connectionTimeout: .seconds(2))
        try underAttack("slowloris headers", harness) { _ in
            let connections = try (0..<200).map { _ in try harness.rawConnection() }
            for connection in connections {
                try connection.send("POST /apple/notifications HTTP/1.1\r\nHost: x\r\n")
            }
            let header = Array("X-Slow: \(String(repeating: "a", count: 200))".utf8)
            let dripped = drip(connections, every: .milliseconds(500), for: .seconds(5)) {
                header[$0 % header.count]
            }
            print("[hostile] slowloris headers: \(dripped.open) of 200 still open after 5 s of dripping")
            let paused = ContinuousClock.now
            #expect(waitUntil(timeout: .seconds(5)) { connections.allSatisfy { $0.isClosedByServer() } })
            print("[hostile] slowloris headers: all cut off \(ContinuousClock.now - paused) after pausing")
        }
        #expect(try harness.rowsNotFromCanary() == 0)
    }

    @Test("slow bodies: Content-Length 1000 sent a byte per second are cut off, and deliveries go on")
    func slowBodies() throws {
        let harness = try ReceiverHarness(connectionTimeout: .seconds(2))
        let body = Self.body(Self.attackToken())
        try underAttack("slow bodies", harness) { _ in
            let connections = try (0..<100).map { _ in try harness.rawConnection() }
            for connection in connections {
                try connection.send(
                    "POST /apple/notifications HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        + "Content-Length: 1000\r\n\r\n")
            }
            let dripped = drip(connections, every: .seconds(1), for: .seconds(8)) { body[$0 % body.count] }
            print("[hostile] slow bodies: all cut off after \(dripped.elapsed)")
            #expect(
                dripped.open == 0, "\(dripped.open) of 100 slow bodies still open after 8 s (timeout 2 s)")
            // The body must arrive within one timeout of the headers; the next byte after that closes.
            #expect(dripped.elapsed < .milliseconds(4500))
        }
        #expect(try harness.rowsNotFromCanary() == 0)
    }

    @Test("requests stalled mid-header or mid-body are closed after the connection timeout")
    func stalledRequests() throws {
        let harness = try ReceiverHarness(connectionTimeout: .seconds(2))
        let body = Self.body(Self.attackToken())
        try underAttack("stalled requests", harness) { _ in
            var connections: [RawHTTPConnection] = []
            for index in 0..<200 {
                let connection = try harness.rawConnection()
                if index.isMultiple(of: 2) {
                    try connection.send("POST /apple/notifications HTTP/1.1\r\nHost: x\r\nX-Half: ")
                } else {
                    try connection.send(
                        "POST /apple/notifications HTTP/1.1\r\nHost: x\r\nContent-Length: \(body.count)\r\n\r\n"
                    )
                    try connection.send(Array(body.dropLast()))
                }
                connections.append(connection)
            }
            let started = ContinuousClock.now
            #expect(waitUntil(timeout: .seconds(6)) { connections.allSatisfy { $0.isClosedByServer() } })
            let elapsed = ContinuousClock.now - started
            #expect(elapsed >= .milliseconds(1500), "closed after \(elapsed), before the 2 s timeout")
        }
        #expect(try harness.rowsNotFromCanary() == 0)
    }

    // MARK: - Oversized requests

    enum HeaderAttack: String, CaseIterable, Sendable, CustomTestStringConvertible {
        case oneHundredKilobyteHeader
        case tenThousandHeaders

        var fields: String {
            switch self {
            case .oneHundredKilobyteHeader:
                "X-Huge: \(String(repeating: "a", count: 100_000))\r\n"
            case .tenThousandHeaders:
                (0..<10_000).map { "X-H\($0): v\r\n" }.joined()
            }
        }

        var testDescription: String { rawValue }
    }

    @Test("oversized headers are answered 4xx or cut off and store nothing", arguments: HeaderAttack.allCases)
    func oversizedHeaders(attack: HeaderAttack) throws {
        let harness = try ReceiverHarness()
        let body = Self.body(Self.attackToken())
        let request =
            Array(
                ("POST /apple/notifications HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    + "Content-Length: \(body.count)\r\n" + attack.fields + "\r\n").utf8) + body
        var outcomes: [Result<RawHTTPOutcome, any Error>] = []
        try underAttack("headers: \(attack)", harness) { _ in
            outcomes = hammer { () throws -> RawHTTPOutcome in
                let connection = try harness.rawConnection(timeout: .seconds(5))
                connection.sendUnlessClosed(request)
                return try connection.readOutcome()
            }
        }
        print("[hostile] headers: \(attack): \(tally(outcomes))")
        #expect(!outcomes.isEmpty)
        #expect(outcomes.allSatisfy { (try? $0.get())?.isRefusal == true }, "\(tally(outcomes))")
        #expect(try harness.rowsNotFromCanary() == 0)
    }

    @Test(
        "chunked bodies past the 64 KiB limit are answered 413 or cut off and store nothing",
        arguments: [64 * 1024 + 1, 100_000, 200_000])
    func chunkedPastLimit(size: Int) throws {
        let harness = try ReceiverHarness()
        // A genuine notification padded with JSON whitespace: storing it would prove the limit leaked.
        let genuine = Self.body(Self.attackToken())
        let body = genuine + [UInt8](repeating: 0x20, count: size - genuine.count)
        var outcomes: [Result<RawHTTPOutcome, any Error>] = []
        try underAttack("chunked \(size) bytes", harness) { _ in
            outcomes = hammer(threads: 2) { () throws -> RawHTTPOutcome in
                let connection = try harness.rawConnection(timeout: .seconds(5))
                try connection.send(
                    "POST /apple/notifications HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        + "Transfer-Encoding: chunked\r\n\r\n")
                var offset = 0
                while offset < body.count {
                    let end = min(offset + 8192, body.count)
                    let chunk =
                        Array((String(end - offset, radix: 16) + "\r\n").utf8) + body[offset..<end] + [
                            13, 10,
                        ]
                    guard connection.sendUnlessClosed(chunk) else { break }
                    offset = end
                }
                connection.sendUnlessClosed(Array("0\r\n\r\n".utf8))
                return try connection.readOutcome()
            }
        }
        print("[hostile] chunked \(size) bytes: \(tally(outcomes))")
        #expect(!outcomes.isEmpty)
        #expect(
            outcomes.allSatisfy { outcome in
                guard let outcome = try? outcome.get() else { return false }
                return outcome == .answered(status: 413) || outcome == .closed
            }, "\(tally(outcomes))")
        #expect(try harness.rowsNotFromCanary() == 0)
    }

    // MARK: - Malformed bodies and tokens

    @Test("malformed bodies and tokens are refused and store nothing", arguments: MalformedRequest.allCases)
    func malformed(request: MalformedRequest) throws {
        let harness = try ReceiverHarness()
        let body = request.body()
        var outcomes: [Result<Int, any Error>] = []
        try underAttack("malformed: \(request)", harness) { _ in
            outcomes = hammer(threads: 2, for: .milliseconds(300)) { try harness.post(body).status }
        }
        let statuses = Set(outcomes.map { (try? $0.get()) ?? -1 })
        print("[hostile] malformed: \(request): \(outcomes.count) requests, statuses \(statuses.sorted())")
        #expect(statuses == [request.expectedStatus])
        #expect(try harness.rowsNotFromCanary() == 0)
    }

    /// The body is read with the token's own strict JSON parser: Apple sends no byte-order mark, and
    /// refusing one keeps a single, unambiguous reading of every body.
    @Test("a byte-order mark before a genuine body is refused as malformed and stores nothing")
    func byteOrderMark() throws {
        let harness = try ReceiverHarness()
        let token = Self.attackToken()
        var texts: [String] = []
        try underAttack("byte-order mark", harness) { _ in
            texts.append(try harness.post(Array("\u{FEFF}".utf8) + Self.body(token)).text)
        }
        #expect(texts == [#"{"error":"malformed","reason":"bad_body"}"#])
        #expect(try harness.rows(subject: Self.attacker) == 0)
    }

    /// Two readers could pick different members of such a body; the strict parser refuses it, so no
    /// proxy in front can have seen a different notification than the one we would store.
    @Test("a body naming payload twice is refused as malformed and stores neither notification")
    func duplicatePayloadKey() throws {
        let harness = try ReceiverHarness()
        let first = Self.attackToken()
        let second = Self.attackToken()
        let body = Array(#"{"payload":"\#(first)","payload":"\#(second)"}"#.utf8)
        var response = ""
        try underAttack("duplicate payload key", harness) { _ in
            response = try harness.post(body).text
        }
        #expect(response == #"{"error":"malformed","reason":"bad_body"}"#)
        #expect(try harness.rows(subject: Self.attacker) == 0)
    }

    // MARK: - Connections

    @Test("a thousand idle connections held open do not stop genuine deliveries")
    func thousandIdleConnections() throws {
        let harness = try ReceiverHarness(connectionLimit: 1100)
        var held: [RawHTTPConnection] = []
        try underAttack("1000 idle connections", harness) { canary in
            for index in 0..<1000 {
                let connection = try harness.rawConnection()
                if index.isMultiple(of: 2) { try connection.send("POST /apple/notifications HTTP/1.1\r\n") }
                held.append(connection)
            }
            let deliveries = canary.deliveries
            #expect(waitUntil { canary.deliveries >= deliveries + 25 })
        }
        // They really were held (well inside the default 10 s timeout) while the canary delivered.
        #expect(held.filter { $0.isClosedByServer() }.isEmpty)
        #expect(try harness.rowsNotFromCanary() == 0)
    }

    @Test("connections past the limit do not hang: once idle ones time out, requests are served again")
    func connectionLimit() throws {
        let harness = try ReceiverHarness(connectionTimeout: .seconds(2), connectionLimit: 32)
        let held = try (0..<32).map { _ in try harness.rawConnection() }
        for connection in held { try connection.send("POST /apple/notifications HTTP/1.1\r\n") }

        let clock = ContinuousClock()
        let started = clock.now
        let extra = try harness.rawConnection(timeout: .seconds(6))
        extra.sendUnlessClosed(Array("GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".utf8))
        let outcome = try extra.readOutcome()
        let waited = clock.now - started
        print("[hostile] connection past the limit: \(outcome) after \(waited)")
        // Refused at once, or served once the idle connections are cut off: never left hanging.
        #expect(outcome == .closed || outcome == .answered(status: 200))
        #expect(waited < .seconds(5))

        #expect(waitUntil(timeout: .seconds(6)) { held.allSatisfy { $0.isClosedByServer() } })
        try underAttack("after the connection limit", harness) { _ in }
    }

    // MARK: - Pipelining and smuggling

    @Test("pipelined requests on one connection are answered in order and each jti is stored once")
    func pipelining() throws {
        let harness = try ReceiverHarness()
        let subject = "001.pipelined"
        let first = Self.body(TestSigning.token(subject: subject))
        let second = Self.body(TestSigning.token(subject: subject))
        var texts: [String] = []
        try underAttack("pipelining", harness) { _ in
            let connection = try harness.rawConnection()
            var wire = Self.post(first) + Self.post(second) + Self.post(first)
            wire += Array("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n".utf8)
            try connection.send(wire)
            for _ in 0..<4 {
                let response = try connection.readResponse()
                texts.append("\(response.status) \(response.text)")
            }
        }
        #expect(
            texts == [
                #"200 {"status":"accepted"}"#, #"200 {"status":"accepted"}"#, #"200 {"status":"duplicate"}"#,
                #"200 {"status":"ok"}"#,
            ])
        #expect(try harness.rows(subject: subject) == 2)
    }

    enum Smuggling: String, CaseIterable, Sendable, CustomTestStringConvertible {
        /// `Content-Length` covers everything; chunked framing ends at once and leaves a second request.
        case contentLengthThenChunked
        /// Chunked framing covers a whole inner request; `Content-Length` covers only 4 bytes of it.
        case chunkedThenContentLength

        var testDescription: String { rawValue }

        func wire(smuggling inner: [UInt8]) -> [UInt8] {
            let head = "POST /apple/notifications HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            switch self {
            case .contentLengthThenChunked:
                let body = Array("0\r\n\r\n".utf8) + inner
                return Array(
                    (head + "Content-Length: \(body.count)\r\nTransfer-Encoding: chunked\r\n\r\n").utf8)
                    + body
            case .chunkedThenContentLength:
                let body =
                    Array((String(inner.count, radix: 16) + "\r\n").utf8) + inner
                    + Array("\r\n0\r\n\r\n".utf8)
                return Array((head + "Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n").utf8) + body
            }
        }
    }

    @Test(
        "a request with both Content-Length and Transfer-Encoding stores its smuggled notification at most once",
        arguments: Smuggling.allCases)
    func smuggling(attack: Smuggling) throws {
        let harness = try ReceiverHarness()
        let subject = "001.smuggled"
        let inner = Self.post(Self.body(TestSigning.token(subject: subject)))
        var outcomes: [RawHTTPOutcome] = []
        try underAttack("smuggling: \(attack)", harness) { _ in
            let connection = try harness.rawConnection(timeout: .seconds(5))
            // The smuggled notification again, plainly, then a request after which the server closes.
            let last = Array("GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".utf8)
            try connection.send(attack.wire(smuggling: inner) + inner + last)
            while outcomes.count < 6 {
                let outcome = try connection.readOutcome()
                outcomes.append(outcome)
                if outcome == .closed { break }
            }
            #expect(try harness.rows(subject: subject) <= 1)
        }
        print("[hostile] smuggling: \(attack): \(outcomes)")
        #expect(try harness.rows(subject: subject) <= 1)
        // The same notification sent plainly afterwards is stored (or already was) exactly once.
        let plain = try harness.rawConnection()
        try plain.send(inner)
        #expect(try plain.readResponse().status == 200)
        #expect(try harness.rows(subject: subject) == 1)
    }

    // MARK: - Helpers

    static func attackToken() -> String { TestSigning.token(subject: attacker) }

    static func body(_ token: String) -> [UInt8] { Array(#"{"payload":"\#(token)"}"#.utf8) }

    /// A complete keep-alive POST of `body` to the notification endpoint.
    static func post(_ body: [UInt8]) -> [UInt8] {
        Array(
            ("POST /apple/notifications HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + "Content-Length: \(body.count)\r\n\r\n").utf8) + body
    }
}

/// Sends one more byte (`byte(round)`) to every connection still open, every `interval`, until the
/// server has closed them all or `duration` has passed; returns how many are still open and when
/// the last one closed (or `duration`).
private func drip(
    _ connections: [RawHTTPConnection], every interval: Duration, for duration: Duration,
    byte: (Int) -> UInt8
) -> (open: Int, elapsed: Duration) {
    let clock = ContinuousClock()
    let started = clock.now
    var open = connections
    var round = 0
    while !open.isEmpty && clock.now - started < duration {
        for connection in open { connection.sendUnlessClosed([byte(round)]) }
        round += 1
        let next = clock.now.advanced(by: interval)
        while clock.now < next && !open.isEmpty {
            open.removeAll { $0.isClosedByServer() }
            Thread.sleep(forTimeInterval: 0.05)
        }
    }
    return (open.count, clock.now - started)
}

/// Counts outcomes by description, for failure messages and the printed record.
private func tally<T>(_ outcomes: [Result<T, any Error>]) -> [String: Int] {
    var counts: [String: Int] = [:]
    for outcome in outcomes {
        let key =
            switch outcome {
            case .success(let value): "\(value)"
            case .failure(let error): "error: \(error)"
            }
        counts[key, default: 0] += 1
    }
    return counts
}

/// Requests that must be refused before anything is stored, with the status each must get.
enum MalformedRequest: String, CaseIterable, Sendable, CustomTestStringConvertible {
    // Encodings.
    case invalidUTF8InBody
    case invalidUTF8InToken
    case rawNULInPayload
    case escapedNULInPayload
    case leadingNUL
    case invalidUTF8InSignedClaims
    // JSON.
    case nestedHundredThousandDeep
    case nestedSixtyThousandDeep
    case nestedSignedClaims
    case hugeExponentInBody
    case hugeIntegerInBody
    case hugeExponentIat
    case hugeExponentExp
    case hugeIntegerIat
    case hugeIntegerExp
    case hugeExponentEventTime
    case hugeIntegerEventTimeInObject
    case duplicateJTI
    case duplicateAlgInHeader
    // Token shapes.
    case tenThousandSegments
    case tenThousandEmptySegments
    case tokenJustOver16KiB
    case token60KiB
    case signedTokenOver16KiB

    var testDescription: String { rawValue }

    var expectedStatus: Int {
        switch self {
        case .nestedHundredThousandDeep: 413  // 100 KB: over the body limit before any parsing
        default: 400
        }
    }

    func body() -> [UInt8] {
        let genuine = HostileHTTPTests.attackToken()
        let digits = String(repeating: "9", count: 400)
        switch self {
        case .invalidUTF8InBody:
            return Array(#"{"payload":""#.utf8) + [0xFF, 0xFE, 0xC3, 0x28] + Array(#""}"#.utf8)
        case .invalidUTF8InToken:
            var token = Array(genuine.utf8)
            token.insert(contentsOf: [0xC3, 0x28], at: token.count / 2)
            return Array(#"{"payload":""#.utf8) + token + Array(#""}"#.utf8)
        case .rawNULInPayload:
            return Array(#"{"payload":""#.utf8) + Array(genuine.utf8) + [0] + Array(#""}"#.utf8)
        case .escapedNULInPayload:
            return Array(#"{"payload":"\#(genuine)\u0000"}"#.utf8)
        case .leadingNUL:
            return [0] + HostileHTTPTests.body(genuine)
        case .invalidUTF8InSignedClaims:
            let claims = Array(Forge.claims().utf8)
            let marker = Array(HostileHTTPTests.attacker.utf8)
            var bytes = claims
            if let range = claims.firstRange(of: marker) {
                bytes.replaceSubrange(range, with: [0xFF, 0xC3, 0x28])
            }
            return Forge.body(claimsBytes: bytes)
        case .nestedHundredThousandDeep:
            return Array(#"{"payload":"#.utf8) + [UInt8](repeating: 0x5B, count: 100_000)
        case .nestedSixtyThousandDeep:
            return Array(#"{"payload":"#.utf8) + [UInt8](repeating: 0x5B, count: 60_000)
        case .nestedSignedClaims:
            let nested = String(repeating: "[", count: 5_000) + String(repeating: "]", count: 5_000)
            return Forge.body(claims: Forge.claims(extra: #","deep":\#(nested)"#))
        case .hugeExponentInBody:
            return Array(#"{"payload":1e999999}"#.utf8)
        case .hugeIntegerInBody:
            return Array(#"{"payload":\#(digits)}"#.utf8)
        case .hugeExponentIat:
            return Forge.body(claims: Forge.claims(iat: "1e999999"))
        case .hugeExponentExp:
            return Forge.body(claims: Forge.claims(exp: "1e999999"))
        case .hugeIntegerIat:
            return Forge.body(claims: Forge.claims(iat: digits))
        case .hugeIntegerExp:
            return Forge.body(claims: Forge.claims(exp: digits))
        case .hugeExponentEventTime:
            return Forge.body(claims: Forge.claims(events: Forge.eventsString(eventTime: "1e999999")))
        case .hugeIntegerEventTimeInObject:
            return Forge.body(claims: Forge.claims(events: Forge.eventsObject(eventTime: digits)))
        case .duplicateJTI:
            return Forge.body(claims: Forge.claims(extra: #","jti":"\#(UUID().uuidString)""#))
        case .duplicateAlgInHeader:
            return Forge.body(
                claims: Forge.claims(),
                header: #"{"kid":"\#(TestSigning.apple.keyID)","alg":"RS256","alg":"none"}"#)
        case .tenThousandSegments:
            return HostileHTTPTests.body(Array(repeating: "a", count: 10_000).joined(separator: "."))
        case .tenThousandEmptySegments:
            return HostileHTTPTests.body(String(repeating: ".", count: 9_999))
        case .tokenJustOver16KiB:
            return HostileHTTPTests.body(Forge.junkToken(length: 16 * 1024 + 1))
        case .token60KiB:
            return HostileHTTPTests.body(Forge.junkToken(length: 60 * 1024))
        case .signedTokenOver16KiB:
            let padding = String(repeating: "p", count: 13 * 1024)
            return Forge.body(claims: Forge.claims(extra: #","pad":"\#(padding)""#))
        }
    }
}

/// Tokens genuinely signed with the test stand-in for Apple's key over claims written by hand, so
/// they can hold what no JSON encoder would write.
enum Forge {
    static let header = #"{"kid":"\#(TestSigning.apple.keyID)","alg":"RS256"}"#

    static func claims(
        iat: String? = nil, exp: String? = nil, events: String? = nil, extra: String = ""
    ) -> String {
        let now = Int(Date().timeIntervalSince1970)
        return #"{"iss":"https://appleid.apple.com","aud":"\#(TestSigning.audience)","#
            + #""iat":\#(iat ?? String(now)),"exp":\#(exp ?? String(now + 86_400)),"#
            + #""jti":"\#(UUID().uuidString)","events":\#(events ?? eventsString())\#(extra)}"#
    }

    /// The `events` claim as Apple sends it: a JSON string holding an object.
    static func eventsString(eventTime: String? = nil) -> String {
        let time = eventTime ?? String(Int(Date().timeIntervalSince1970 * 1000))
        return
            #""{\"type\":\"consent-revoked\",\"sub\":\"\#(HostileHTTPTests.attacker)\",\"event_time\":\#(time)}""#
    }

    /// The `events` claim as Apple's documentation shows it: an object.
    static func eventsObject(eventTime: String) -> String {
        #"{"type":"consent-revoked","sub":"\#(HostileHTTPTests.attacker)","event_time":\#(eventTime)}"#
    }

    static func body(claims: String, header: String = header) -> [UInt8] {
        body(claimsBytes: Array(claims.utf8), header: header)
    }

    static func body(claimsBytes: [UInt8], header: String = header) -> [UInt8] {
        do {
            let token = try TestSigning.apple.sign(
                headerJSON: Data(header.utf8), claimsJSON: Data(claimsBytes))
            return HostileHTTPTests.body(token)
        } catch {
            fatalError("test signing failed: \(error)")
        }
    }

    /// `length` characters of base64url text shaped like a token (three segments).
    static func junkToken(length: Int) -> String {
        let third = String(repeating: "A", count: length / 3)
        let token = third + "." + third + "." + third
        return token + String(repeating: "A", count: max(0, length - token.count))
    }
}
