/// The server's framing rules (RFC 9112), checked once a request's headers have arrived and before
/// any of its body is read, so that no proxy in front can disagree with us about where a request ends.
///
/// libmicrohttpd 0.9.75 is lenient where a proxy may read the same bytes differently: with two
/// `Content-Length` fields it uses the first, it takes `Content-Length : 5` (whitespace before the
/// colon) for an unknown field named `Content-Length ` and reads no body, and it uses chunked framing
/// even when a `Content-Length` is present. Each of these lets a request be smuggled inside another
/// one's body (or the reverse), so each is refused with 400 and the connection is closed:
/// - a field name that is not an RFC 9110 token (whitespace before the colon, or any other
///   character outside `tchar`);
/// - more than one `Content-Length` field (even with equal values), or one that is not all digits;
/// - `Transfer-Encoding` together with `Content-Length`, more than once, with any value but
///   `chunked`, or in an HTTP/1.0 request.
///
/// A `Content-Length` above the body limit is answered 413.
enum HTTPFraming {
    /// The framing-relevant part of a request's header fields, gathered one field at a time from the
    /// bytes libmicrohttpd holds: only the values of `Content-Length` and `Transfer-Encoding` become
    /// strings.
    struct Scan {
        fileprivate var badName = false
        fileprivate var contentLength: [String] = []
        fileprivate var transferEncoding: [String] = []

        /// Adds one header field (name and value as received).
        mutating func add(name: UnsafeBufferPointer<UInt8>, value: UnsafeBufferPointer<UInt8>) {
            guard !name.isEmpty, name.allSatisfy(HTTPFraming.isTokenCharacter) else {
                badName = true
                return
            }
            // Token characters are ASCII, so comparing ASCII-lowercased bytes is comparing lowercased names.
            if name.elementsEqual("content-length".utf8, by: Self.sameLetter) {
                contentLength.append(String(decoding: value, as: UTF8.self))
            } else if name.elementsEqual("transfer-encoding".utf8, by: Self.sameLetter) {
                transferEncoding.append(String(decoding: value, as: UTF8.self))
            }
        }

        private static func sameLetter(_ byte: UInt8, _ lowercase: UInt8) -> Bool {
            (byte >= 65 && byte <= 90 ? byte + 32 : byte) == lowercase
        }
    }

    /// The answer to send at once (``ServerAnswers/badRequest`` or ``ServerAnswers/contentTooLarge``), or
    /// `nil` when the request may proceed.
    ///
    /// - Parameters:
    ///   - scan: the request's header fields as received, names unaltered, in order.
    ///   - version: the request line's version, e.g. `HTTP/1.1`.
    ///   - maxBodyBytes: the largest body the server accepts.
    static func refusal(_ scan: Scan, version: String, maxBodyBytes: Int) -> CannedResponse? {
        if scan.badName { return ServerAnswers.badRequest }
        let contentLength = scan.contentLength
        let transferEncoding = scan.transferEncoding
        if !transferEncoding.isEmpty {
            guard transferEncoding.count == 1, contentLength.isEmpty, version == "HTTP/1.1",
                transferEncoding[0].trimmed().lowercased() == "chunked"
            else { return ServerAnswers.badRequest }
            return nil
        }
        guard contentLength.count <= 1 else { return ServerAnswers.badRequest }
        if let declared = contentLength.first {
            let digits = declared.trimmed()
            guard !digits.isEmpty, digits.utf8.allSatisfy({ $0 >= 48 && $0 <= 57 }) else {
                return ServerAnswers.badRequest
            }
            // All digits: a value too large for Int is too large for any body limit.
            guard let length = Int(digits), length <= maxBodyBytes else {
                return ServerAnswers.contentTooLarge
            }
        }
        return nil
    }

    /// `tchar` of RFC 9110 §5.6.2: ALPHA, DIGIT and ``!#$%&'*+-.^_`|~``.
    static func isTokenCharacter(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
            UInt8(ascii: "0")...UInt8(ascii: "9"):
            return true
        case UInt8(ascii: "!"), UInt8(ascii: "#"), UInt8(ascii: "$"), UInt8(ascii: "%"), UInt8(ascii: "&"),
            UInt8(ascii: "'"), UInt8(ascii: "*"), UInt8(ascii: "+"), UInt8(ascii: "-"), UInt8(ascii: "."),
            UInt8(ascii: "^"), UInt8(ascii: "_"), UInt8(ascii: "`"), UInt8(ascii: "|"), UInt8(ascii: "~"):
            return true
        default:
            return false
        }
    }
}

extension String {
    fileprivate func trimmed() -> String {
        var scalars = Substring(self)
        while let last = scalars.last, last == " " || last == "\t" { scalars.removeLast() }
        while let first = scalars.first, first == " " || first == "\t" { scalars.removeFirst() }
        return String(scalars)
    }
}
