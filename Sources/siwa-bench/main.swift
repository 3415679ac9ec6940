import AppleNotifications
import Foundation
import Synchronization

// siwa-bench: helpers for `make bench` (scripts/bench.py). Not installed; not part of the product.
//
//   siwa-bench sign --key PEM --kid KID --audience AUD --count N --out FILE
//       writes N distinct Apple-shaped request bodies, one per line, signing on every core.
//   siwa-bench rows --key PEM --kid KID --audience AUD --count N --out FILE
//                   [--subs 20000 --jti-prefix drain- --sub-prefix drain-sub-]
//       writes the drain's N queued notifications (g = 1 … N: the type g % 4, user g % subs, an email
//       for the email events, event_time g ms before now) as COPY text rows (g, jti, event_type, sub,
//       audience, email, is_private_email, event_time, issued_at, expires_at, raw_token), each with the
//       token signed with exactly those claims, as the receiver stores them; the worker verifies them.

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("siwa-bench: \(message)\n".utf8))
    exit(2)
}

var arguments = Array(CommandLine.arguments.dropFirst())
guard let command = arguments.first, command == "sign" || command == "rows" else {
    fail("usage: siwa-bench sign|rows --key PEM --kid KID --audience AUD --count N --out FILE")
}
arguments.removeFirst()
var options: [String: String] = [:]
while arguments.count >= 2, arguments[0].hasPrefix("--") {
    options[String(arguments[0].dropFirst(2))] = arguments[1]
    arguments.removeFirst(2)
}
guard let keyPath = options["key"], let kid = options["kid"], let audience = options["audience"],
    let count = options["count"].flatMap(Int.init), count > 0, let output = options["out"]
else { fail("missing or invalid options") }

let pem = (try? String(contentsOfFile: keyPath, encoding: .utf8)) ?? ""
guard let signer = try? NotificationSigner(privateKeyPEM: pem, keyID: kid) else {
    fail("cannot read key \(keyPath)")
}
let types = ["email-disabled", "email-enabled", "consent-revoked", "account-delete"]
let workers = ProcessInfo.processInfo.activeProcessorCount
final class Chunks: Sendable {
    private let storage: Mutex<[String]>
    init(_ count: Int) { storage = Mutex(Array(repeating: "", count: count)) }
    func set(_ index: Int, _ text: String) { storage.withLock { $0[index] = text } }
    var parts: [String] { storage.withLock { $0 } }
}
let chunks = Chunks(workers)
let now = Date()
let subs = options["subs"].flatMap(Int.init) ?? 20_000
let jtiPrefix = options["jti-prefix"] ?? "drain-"
let subPrefix = options["sub-prefix"] ?? "drain-sub-"
/// One drain row (see the usage above): g, its claims, and the token signed with them.
@Sendable func drainRow(_ g: Int) -> String {
    let type = types[g % 4]  // the SQL seed's (ARRAY[…])[1 + g % 4]
    let email: String? = g % 4 < 2 ? "d\(g)@privaterelay.appleid.com" : nil
    let eventTime = Date(
        timeIntervalSince1970: (now.timeIntervalSince1970 * 1000).rounded() / 1000 - Double(g) / 1000)
    let iat = now.timeIntervalSince1970.rounded(.down)
    let sub = "\(subPrefix)\(g % subs)"
    let jti = "\(jtiPrefix)\(g)"
    let token = try! signer.sign(
        type: type, subject: sub, audience: audience, email: email, isPrivateEmail: email.map { _ in true },
        eventTime: eventTime, issuedAt: now, jti: jti)
    let fields = [
        String(g), jti, type, sub, audience, email ?? "\\N", email == nil ? "\\N" : "t",
        String(format: "%.3f", eventTime.timeIntervalSince1970), String(Int64(iat)),
        String(Int64(iat) + 86_400),
        token,
    ]
    return fields.joined(separator: "\t") + "\n"
}
DispatchQueue.concurrentPerform(iterations: workers) { worker in
    var text = ""
    if command == "rows" {
        for g in stride(from: worker + 1, through: count, by: workers) { text += drainRow(g) }
        chunks.set(worker, text)
        return
    }
    for index in stride(from: worker, to: count, by: workers) {
        let type = types[index % types.count]
        let isEmail = type.hasPrefix("email")
        let token = try! signer.sign(
            type: type,
            subject: String(format: "000%06d.bench%024d.%04d", index % 1_000_000, index, index % 10_000),
            audience: audience, email: isEmail ? "bench\(index)@privaterelay.appleid.com" : nil,
            isPrivateEmail: isEmail ? true : nil, eventTime: now, issuedAt: now,
            jti: "bench-\(index)-\(UUID().uuidString)")
        text += #"{"payload":"\#(token)"}"# + "\n"
    }
    chunks.set(worker, text)
}
FileManager.default.createFile(atPath: output, contents: Data(chunks.parts.joined().utf8))
