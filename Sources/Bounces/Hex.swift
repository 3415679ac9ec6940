import Crypto

/// HMAC-SHA256 (Crypto's).
func hmacSHA256(key: [UInt8], message: [UInt8]) -> [UInt8] {
    HMACSHA256.authenticationCode(key: key, message: message)
}

/// Lower-case hexadecimal.
func hex(_ bytes: [UInt8]) -> String {
    let digits = Array("0123456789abcdef".utf8)
    var out = [UInt8]()
    out.reserveCapacity(bytes.count * 2)
    for byte in bytes {
        out.append(digits[Int(byte >> 4)])
        out.append(digits[Int(byte & 15)])
    }
    return String(decoding: out, as: UTF8.self)
}
