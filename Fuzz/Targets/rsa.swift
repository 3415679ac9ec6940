import Foundation

// libFuzzer target: RSA public key construction from raw big-endian `n` and `e`, then RS256 checks.
// Input layout: one byte for the length of `e` (mod 10), `e`, then `n` up to a 0xFF 0x00 marker, then
// the signature (whatever follows).
@testable import AppleNotifications

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzRSA(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    guard let first = bytes.first else { return 0 }
    let exponentEnd = min(bytes.count, 1 + Int(first) % 10)
    let exponent = Data(bytes[1..<exponentEnd])
    let rest = bytes[exponentEnd...]
    var modulusEnd = rest.endIndex
    var signatureStart = rest.endIndex
    var index = rest.startIndex
    while index + 1 < rest.endIndex {
        if rest[index] == 0xFF, rest[index + 1] == 0x00 {
            modulusEnd = index
            signatureStart = index + 2
            break
        }
        index += 1
    }
    let modulus = Data(rest[rest.startIndex..<modulusEnd])
    guard let key = try? RSAPublicKey(modulus: modulus, exponent: exponent) else { return 0 }
    guard key.bits > 0, key.bits <= 16384 else { fatalError("a key of \(key.bits) bits was built") }
    guard key.modulus.first != 0, key.exponent.first != 0 else { fatalError("leading zeros kept") }
    _ = key.verifyRS256(signature: Data(bytes[signatureStart...]), signedData: Data(bytes))
    // A JWK round trip of the key gives back the same parameters.
    let jwk = key.jwk(keyID: "k")
    guard jwk["n"] == Base64URL.encode(key.modulus), jwk["e"] == Base64URL.encode(key.exponent) else {
        fatalError("JWK does not carry the key's parameters")
    }
    return 0
}
