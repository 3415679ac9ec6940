import AppleNotifications
import Foundation
import Synchronization

// siwa-bench: helpers for `make bench` (scripts/bench.py). Not installed; not part of the product.
//
//   siwa-bench sign --key PEM --kid KID --audience AUD --count N --out FILE
//       writes N distinct Apple-shaped request bodies, one per line, signing on every core.

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("siwa-bench: \(message)\n".utf8))
    exit(2)
}

var arguments = Array(CommandLine.arguments.dropFirst())
guard arguments.first == "sign" else {
    fail("usage: siwa-bench sign --key PEM --kid KID --audience AUD --count N --out FILE")
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
DispatchQueue.concurrentPerform(iterations: workers) { worker in
    var text = ""
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
