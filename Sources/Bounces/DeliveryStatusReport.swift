public import Foundation

/// A delivery status notification (RFC 3464: a multipart/report whose message/delivery-status part
/// holds one per-message group and one group per recipient), as Postfix and other MTAs write them.
public struct DeliveryStatusReport: Sendable, Equatable {
    /// One `Name: value` field of a delivery-status group, folded lines joined.
    public struct Field: Sendable, Equatable {
        public var name: String
        public var value: String

        public init(name: String, value: String) {
            self.name = name
            self.value = value
        }
    }

    /// One per-recipient group.
    public struct Recipient: Sendable, Equatable {
        /// Final-Recipient's address (its `rfc822;` type dropped).
        public var finalRecipient: String
        /// Original-Recipient's address, when given.
        public var originalRecipient: String?
        /// Action, lower-cased: failed, delayed, delivered, relayed or expanded.
        public var action: String
        /// Status: the enhanced status code `class.subject.detail` (RFC 3463).
        public var status: String
        /// Diagnostic-Code's text (its type, `smtp;`, dropped): the remote server's reply.
        public var diagnosticCode: String?
        /// Remote-MTA's name (its type, `dns;`, dropped).
        public var remoteMTA: String?
        /// Every field of the group, in order.
        public var fields: [Field]
    }

    /// Reporting-MTA's name (its type dropped).
    public var reportingMTA: String?
    /// The returned message's envelope sender: X-Postfix-Sender, else the returned headers'
    /// Return-Path; nil when the report carries neither.
    public var envelopeSender: String?
    /// The per-message group's fields, in order.
    public var messageFields: [Field]
    /// The per-recipient groups, in order (at least one).
    public var recipients: [Recipient]

    /// The largest report read (bytes): Postfix returns at most bounce_size_limit (50,000) bytes of
    /// the message, so anything much larger is not one of its reports.
    public static let maximumSize = 4 << 20
    /// The most recipient groups read from one report.
    public static let maximumRecipients = 1000

    /// Why a text is not a delivery status notification; never carries an address or the text.
    public enum ParseError: Error, Equatable, CustomStringConvertible {
        case tooLarge(Int)
        case notMultipartReport
        case noBoundary
        case noDeliveryStatus
        case noRecipient
        case tooManyRecipients
        case missingField(String)
        case malformedField(String)

        public var description: String {
            switch self {
            case .tooLarge(let size):
                "the report is \(size) bytes, over the \(DeliveryStatusReport.maximumSize) read"
            case .notMultipartReport: "not a multipart/report (Content-Type)"
            case .noBoundary: "the multipart/report has no boundary parameter"
            case .noDeliveryStatus: "no message/delivery-status part"
            case .noRecipient: "the delivery-status part has no per-recipient group"
            case .tooManyRecipients:
                "the delivery-status part has over \(DeliveryStatusReport.maximumRecipients) recipients"
            case .missingField(let name): "a per-recipient group has no \(name) field"
            case .malformedField(let name): "the \(name) field is malformed"
            }
        }
    }

    /// Parses one report: the whole message, headers first, as delivered to a pipe.
    public init(parsing data: Data) throws(ParseError) {
        guard data.count <= Self.maximumSize else { throw .tooLarge(data.count) }
        // Decoded with replacement: a stray 8-bit byte becomes U+FFFD and never ends the parse.
        let text = String(decoding: data, as: UTF8.self).replacingOccurrences(of: "\r\n", with: "\n")
        try self.init(text: text)
    }

    init(text: String) throws(ParseError) {
        let (headers, body) = MIMEText.split(text)
        guard let contentType = MIMEText.header("Content-Type", in: headers) else {
            throw .notMultipartReport
        }
        let (type, parameters) = MIMEText.contentType(contentType)
        guard type == "multipart/report" else { throw .notMultipartReport }
        guard let boundary = parameters["boundary"], !boundary.isEmpty else { throw .noBoundary }
        let parts = MIMEText.parts(of: body, boundary: boundary)
        var statusText: String?
        var returnedHeaders: [(name: String, value: String)] = []
        for part in parts {
            let (partHeaders, partBody) = MIMEText.split(part)
            let partType = MIMEText.header("Content-Type", in: partHeaders).map { MIMEText.contentType($0).0 }
            switch partType {
            case "message/delivery-status", "message/global-delivery-status":
                if statusText == nil { statusText = partBody }
            case "text/rfc822-headers", "message/rfc822", "message/global", "message/global-headers":
                returnedHeaders = MIMEText.split(partBody).headers
            default: break
            }
        }
        guard let statusText else { throw .noDeliveryStatus }
        let groups = MIMEText.groups(statusText)
        guard let perMessage = groups.first, groups.count > 1 else { throw .noRecipient }
        guard groups.count - 1 <= Self.maximumRecipients else { throw .tooManyRecipients }
        messageFields = perMessage.map { Field(name: $0.name, value: $0.value) }
        reportingMTA = MIMEText.header("Reporting-MTA", in: perMessage).map(MIMEText.typedValue)
        let postfixSender = MIMEText.header("X-Postfix-Sender", in: perMessage).map(MIMEText.typedValue)
        let returnPath = MIMEText.header("Return-Path", in: returnedHeaders).map(MIMEText.angleAddress)
        envelopeSender = [postfixSender, returnPath].compactMap { $0 }.first { !$0.isEmpty }
        recipients = try groups.dropFirst().map { group throws(ParseError) in try Self.recipient(group) }
    }

    static func recipient(_ group: [(name: String, value: String)]) throws(ParseError) -> Recipient {
        func required(_ name: String) throws(ParseError) -> String {
            guard let value = MIMEText.header(name, in: group) else { throw .missingField(name) }
            return value
        }
        let final = MIMEText.typedValue(try required("Final-Recipient"))
        guard !final.isEmpty else { throw .malformedField("Final-Recipient") }
        let action = try required("Action").lowercased()
        guard ["failed", "delayed", "delivered", "relayed", "expanded"].contains(action) else {
            throw .malformedField("Action")
        }
        // The status code alone: some MTAs add a comment after it.
        let status = String(try required("Status").prefix { !$0.isWhitespace && $0 != "(" })
        guard Self.isStatusCode(status) else { throw .malformedField("Status") }
        return Recipient(
            finalRecipient: final,
            originalRecipient: MIMEText.header("Original-Recipient", in: group).map(MIMEText.typedValue),
            action: action, status: status,
            diagnosticCode: MIMEText.header("Diagnostic-Code", in: group).map(MIMEText.typedValue),
            remoteMTA: MIMEText.header("Remote-MTA", in: group).map(MIMEText.typedValue),
            fields: group.map { Field(name: $0.name, value: $0.value) })
    }

    /// `class.subject.detail` with class 2, 4 or 5 and up to three digits each (RFC 3463).
    static func isStatusCode(_ text: String) -> Bool {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        return parts.count == 3 && ["2", "4", "5"].contains(parts[0])
            && parts.dropFirst().allSatisfy {
                (1...3).contains($0.count) && $0.allSatisfy(\.isASCII) && $0.allSatisfy(\.isNumber)
            }
    }
}

/// The little of RFC 5322 and MIME a report needs: header blocks, parameters, multipart bodies.
enum MIMEText {
    /// The header block (folded lines joined) and the body after the first empty line.
    static func split(_ text: String) -> (headers: [(name: String, value: String)], body: String) {
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false)
        var end = lines.count
        for (index, line) in lines.enumerated() where line.isEmpty {
            end = index
            break
        }
        let body = end < lines.count ? lines[(end + 1)...].joined(separator: "\n") : ""
        return (fields(lines[..<end]), body)
    }

    /// Blank-line separated groups of fields (a delivery-status body); empty groups skipped.
    static func groups(_ text: String) -> [[(name: String, value: String)]] {
        var groups: [[(name: String, value: String)]] = []
        var current: [Substring] = []
        for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
            if line.trimmingCharacters(in: .whitespaces).isEmpty {
                if !current.isEmpty { groups.append(fields(current[...])) }
                current = []
            } else {
                current.append(line)
            }
        }
        if !current.isEmpty { groups.append(fields(current[...])) }
        return groups.filter { !$0.isEmpty }
    }

    /// `Name: value` lines, a line starting with white space continuing the one before; a line
    /// without a colon is skipped (a comment or damage, never fatal to the rest).
    static func fields(_ lines: ArraySlice<Substring>) -> [(name: String, value: String)] {
        var fields: [(name: String, value: String)] = []
        for line in lines {
            if let first = line.first, first == " " || first == "\t" {
                if !fields.isEmpty {
                    fields[fields.count - 1].value += " " + line.trimmingCharacters(in: .whitespaces)
                }
                continue
            }
            guard let colon = line.firstIndex(of: ":") else { continue }
            let name = line[..<colon].trimmingCharacters(in: .whitespaces)
            guard !name.isEmpty else { continue }
            fields.append((name, line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)))
        }
        return fields
    }

    /// The first field named `name`, case-insensitively.
    static func header(_ name: String, in fields: [(name: String, value: String)]) -> String? {
        fields.first { $0.name.caseInsensitiveCompare(name) == .orderedSame }?.value
    }

    /// A Content-Type's type/subtype (lower-cased) and its parameters (names lower-cased, quotes dropped).
    static func contentType(_ value: String) -> (String, [String: String]) {
        var pieces: [String] = []
        var current = ""
        var quoted = false
        for character in value {
            if character == "\"" { quoted.toggle() }
            if character == ";" && !quoted {
                pieces.append(current)
                current = ""
            } else {
                current.append(character)
            }
        }
        pieces.append(current)
        var parameters: [String: String] = [:]
        for piece in pieces.dropFirst() {
            guard let equals = piece.firstIndex(of: "=") else { continue }
            let name = piece[..<equals].trimmingCharacters(in: .whitespaces).lowercased()
            var value = piece[piece.index(after: equals)...].trimmingCharacters(in: .whitespaces)
            if value.count >= 2, value.hasPrefix("\""), value.hasSuffix("\"") {
                value = String(value.dropFirst().dropLast())
            }
            parameters[name] = value
        }
        return (pieces[0].trimmingCharacters(in: .whitespaces).lowercased(), parameters)
    }

    /// The parts between `--boundary` lines, up to `--boundary--` (RFC 2046 § 5.1.1).
    static func parts(of body: String, boundary: String) -> [String] {
        let delimiter = "--" + boundary
        var parts: [String] = []
        var current: [Substring]?
        for line in body.split(separator: "\n", omittingEmptySubsequences: false) {
            let trimmed = line.trimmingCharacters(in: .whitespaces)
            if trimmed == delimiter + "--" {
                if let current { parts.append(current.joined(separator: "\n")) }
                return parts
            }
            if trimmed == delimiter {
                if let current { parts.append(current.joined(separator: "\n")) }
                current = []
            } else {
                current?.append(line)
            }
        }
        if let current { parts.append(current.joined(separator: "\n")) }
        return parts
    }

    /// A typed field's value without its type: `rfc822; a@b` → `a@b`, `smtp; 550 …` → `550 …`.
    static func typedValue(_ value: String) -> String {
        guard let semicolon = value.firstIndex(of: ";") else { return value }
        return value[value.index(after: semicolon)...].trimmingCharacters(in: .whitespaces)
    }

    /// `<a@b>` → `a@b` (Return-Path); an empty path `<>` → empty.
    static func angleAddress(_ value: String) -> String {
        let trimmed = value.trimmingCharacters(in: .whitespaces)
        guard let open = trimmed.firstIndex(of: "<"), let close = trimmed.lastIndex(of: ">"), open < close
        else { return trimmed }
        return String(trimmed[trimmed.index(after: open)..<close])
    }
}
