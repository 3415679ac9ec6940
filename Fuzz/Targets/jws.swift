import Foundation

// libFuzzer target: splitting and decoding a compact JWS (shape only, nothing verified).
@testable import AppleNotifications

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzCompactJWS(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let token = String(decoding: UnsafeBufferPointer(start: data, count: size), as: UTF8.self)
    guard let jws = try? CompactJWS(token) else { return 0 }

    // What was accepted must be exactly three strict segments whose decodings are what we hold.
    let segments = token.split(separator: ".", omittingEmptySubsequences: false)
    guard segments.count == 3, token.utf8.count <= CompactJWS.maximumLength,
        Base64URL.encode(jws.header) == segments[0], Base64URL.encode(jws.payload) == segments[1],
        Base64URL.encode(jws.signature) == segments[2],
        jws.signingInput == Data("\(segments[0]).\(segments[1])".utf8)
    else { fatalError("CompactJWS accepted a token that does not match its parts") }
    guard (try? JSONValue.object(from: jws.header, what: "header")) != nil else {
        fatalError("CompactJWS accepted a header that is not a JSON object")
    }
    if let kid = jws.keyID, !jws.headerNames.contains("kid") { fatalError("kid \(kid.count) without member") }
    if jws.algorithm != nil, !jws.headerNames.contains("alg") { fatalError("alg without member") }
    return 0
}
