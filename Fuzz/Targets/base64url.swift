import Foundation

// libFuzzer target: strict base64url decoding, and the round trip in both directions.
@testable import AppleNotifications

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzBase64URL(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))

    // Decoding arbitrary text: either refused, or the one canonical encoding of what it decoded to.
    let text = String(decoding: bytes, as: UTF8.self)
    if let decoded = try? Base64URL.decode(text) {
        guard Base64URL.encode(decoded) == text else {
            fatalError("decode accepted a non-canonical encoding")
        }
    }

    // Encoding arbitrary bytes always decodes back to them.
    let encoded = Base64URL.encode(bytes)
    guard let back = try? Base64URL.decode(encoded), Array(back) == bytes else {
        fatalError("decode(encode(x)) != x")
    }
    return 0
}
