import Foundation

// libFuzzer target: JSON Web Key Set parsing, including RSA key construction from `n` and `e`.
@testable import AppleNotifications

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzJWKS(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let document = Data(UnsafeBufferPointer(start: data, count: size))
    guard let set = try? JSONWebKeySet(jsonData: document) else { return 0 }

    var seen: Set<String> = []
    for kid in set.keyIDs {
        guard seen.insert(kid).inserted else { fatalError("a kid listed twice as usable") }
        guard let key = set.key(id: kid) else { fatalError("a usable kid without a key") }
        guard key.bits >= 2048, key.bits <= 16384 else { fatalError("a usable key of \(key.bits) bits") }
        // Exercise the verification path with the key; a zero signature never verifies.
        let zeros = Data(count: (key.bits + 7) / 8)
        guard !key.verifyRS256(signature: zeros, signedData: Data("x".utf8)) else {
            fatalError("an all-zero signature verified")
        }
    }
    for skipped in set.skipped where skipped.reason == "duplicate kid" {
        guard let kid = skipped.keyID, set.key(id: kid) == nil else {
            fatalError("an ambiguous kid is usable")
        }
    }
    return 0
}
