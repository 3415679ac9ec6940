import AppleNotifications
import Foundation
import ServiceSupport

/// The list the old team hands to the new team (`siwactl transfer export --output`), and the digest that
/// makes it verifiable.
///
/// Apple's transfer guide says not to hand over team-scoped identifiers or relay addresses, so the list
/// holds neither: each line is a transfer identifier and an *account reference*, the SHA-256 of a random
/// salt (in the header, new for every list written) and the old sub. The new team, which holds the app's
/// database, finds each account by computing the same reference from its own subs; anyone else learns
/// nothing from a reference.
///
/// The list decides whose account each new sub goes to, so a list with two transfer identifiers swapped
/// would hand one user's account and sessions to another without any other check noticing. The
/// **digest** is the SHA-256 of the pairing itself (``canonicalText(targetTeam:entries:)``: the target
/// team, then every `sub TAB transfer_sub` in byte order): the export prints it, the two teams compare it
/// by another channel than the one carrying the list, and the import refuses a list whose pairing does not
/// give exactly that digest, before it loads anything.
public struct TransferList: Sendable, Equatable {
    /// One user: the account reference and the transfer identifier.
    public struct Line: Sendable, Equatable {
        /// hex(SHA-256(salt + old sub)).
        public var account: String
        /// Apple's transfer identifier for the target team.
        public var transferSub: String

        /// A line.
        public init(account: String, transferSub: String) {
            self.account = account
            self.transferSub = transferSub
        }
    }

    /// The header's `format`.
    public static let format = "siwa-transfer-list"
    /// The header's `version` (1 was the list of subs written before 5.0.0).
    public static let version = 2

    /// The recipient's team ID.
    public var targetTeam: String
    /// The salt of the account references (hex).
    public var salt: String
    /// One line per user.
    public var lines: [Line]

    /// The list of `entries` (sub and transfer identifier) for `targetTeam`, references salted with
    /// `salt` (by default a new random one). Refuses a sub or transfer identifier that is empty or holds
    /// a control character (the digest's text could not tell it apart).
    public init(targetTeam: String, entries: [TransferExport.Entry], salt: String = TransferList.randomSalt())
        throws
    {
        try Self.requireListable(entries)
        self.targetTeam = targetTeam
        self.salt = salt
        self.lines = entries.map {
            Line(account: Self.accountReference(salt: salt, sub: $0.sub), transferSub: $0.transferSub)
        }
        .sorted { $0.account < $1.account }
    }

    /// A list as read.
    public init(targetTeam: String, salt: String, lines: [Line]) {
        self.targetTeam = targetTeam
        self.salt = salt
        self.lines = lines
    }

    /// 16 random bytes as hex.
    public static func randomSalt() -> String {
        var generator = SystemRandomNumberGenerator()
        return (0..<16).map { _ in String(format: "%02x", UInt8.random(in: 0...255, using: &generator)) }
            .joined()
    }

    /// The account reference of `sub` under `salt`: hex(SHA-256(salt + sub)).
    public static func accountReference(salt: String, sub: String) -> String {
        SHA256Digest.hex(salt + sub)
    }

    /// The text the digest is the SHA-256 of: `siwa-transfer-list 2 TEAM` and a newline, then
    /// `sub TAB transfer_sub` and a newline for every entry, ordered by sub and then transfer identifier,
    /// byte by byte (`LC_ALL=C sort`, `ORDER BY … COLLATE "C"`). Either team can make it with psql and
    /// check the digest with `sha256sum` (docs/operations.md § 14).
    public static func canonicalText(targetTeam: String, entries: [TransferExport.Entry]) throws -> String {
        try requireListable(entries)
        let sorted = entries.sorted { left, right in
            left.sub == right.sub
                ? Array(left.transferSub.utf8).lexicographicallyPrecedes(Array(right.transferSub.utf8))
                : Array(left.sub.utf8).lexicographicallyPrecedes(Array(right.sub.utf8))
        }
        var text = "\(format) \(version) \(targetTeam)\n"
        for entry in sorted { text += "\(entry.sub)\t\(entry.transferSub)\n" }
        return text
    }

    /// The digest of a pairing: SHA-256 of ``canonicalText(targetTeam:entries:)``, 64 lower-case hex digits.
    public static func digest(targetTeam: String, entries: [TransferExport.Entry]) throws -> String {
        SHA256Digest.hex(try canonicalText(targetTeam: targetTeam, entries: entries))
    }

    /// Whether `text` has the form of a digest (64 hex digits).
    public static func isDigest(_ text: String) -> Bool {
        text.count == 64 && text.allSatisfy(\.isHexDigit)
    }

    static func requireListable(_ entries: [TransferExport.Entry]) throws {
        func listable(_ text: String) -> Bool {
            !text.isEmpty && !text.unicodeScalars.contains { $0.properties.generalCategory == .control }
        }
        guard entries.allSatisfy({ listable($0.sub) && listable($0.transferSub) }) else {
            throw TeamTransferError(
                "a sub or transfer identifier is empty or holds a control character: it cannot be listed")
        }
    }

    /// The file: a header line `{"format", "version", "target_team", "salt", "users"}`, then
    /// `{"account", "transfer_sub"}` per line.
    public var text: String {
        var text = JSONText.line([
            "format": Self.format, "version": Self.version, "target_team": targetTeam, "salt": salt,
            "users": lines.count,
        ])
        for line in lines {
            text += JSONText.line(["account": line.account, "transfer_sub": line.transferSub])
        }
        return text
    }

    /// Writes ``text`` to `path`, replacing the file at once (mode 600).
    public func write(to path: String) throws {
        let temporary = path + ".tmp-\(getpid())"
        guard
            FileManager.default.createFile(
                atPath: temporary, contents: Data(text.utf8), attributes: [.posixPermissions: 0o600])
        else { throw TeamTransferError("cannot write \(temporary)") }
        guard rename(temporary, path) == 0 else {
            unlink(temporary)
            throw TeamTransferError("cannot replace \(path)")
        }
    }

    /// Reads a list written by ``write(to:)``. Refuses a list of subs (written before 5.0.0), a header
    /// whose user count differs from the lines (a truncated copy), and malformed lines.
    public static func read(path: String) throws -> TransferList {
        let text: String
        do {
            text = try String(contentsOfFile: path, encoding: .utf8)
        } catch {
            throw TeamTransferError("cannot read \(path)")
        }
        func object(_ line: Substring) -> [String: Any]? {
            try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
        }
        let rows = text.split(separator: "\n").filter { !$0.isEmpty }
        guard let first = rows.first, let header = object(first), header["format"] as? String == format,
            (header["version"] as? NSNumber)?.intValue == version,
            let team = header["target_team"] as? String, let salt = header["salt"] as? String, !salt.isEmpty,
            let users = (header["users"] as? NSNumber)?.intValue
        else {
            if let first = rows.first, object(first)?["sub"] != nil {
                throw TeamTransferError(
                    "\(path) lists the old team's subs (written by siwactl before 5.0.0, which Apple says not to hand over) and has no digest: have the old team write it again with this version's 'siwactl transfer export --output' (it asks Apple nothing for users already done) and send you the digest it prints by another channel"
                )
            }
            throw TeamTransferError(
                "\(path) line 1: expected the header {\"format\": \"\(format)\", \"version\": \(version), \"target_team\", \"salt\", \"users\"}"
            )
        }
        var lines: [Line] = []
        for (number, row) in rows.dropFirst().enumerated() {
            guard let object = object(row), let account = object["account"] as? String,
                let transferSub = object["transfer_sub"] as? String, !account.isEmpty, !transferSub.isEmpty
            else {
                throw TeamTransferError(
                    "\(path) line \(number + 2): expected {\"account\": …, \"transfer_sub\": …}")
            }
            lines.append(Line(account: account, transferSub: transferSub))
        }
        guard lines.count == users else {
            throw TeamTransferError(
                "\(path) holds \(lines.count) users but its header says \(users): an incomplete or altered copy"
            )
        }
        return TransferList(targetTeam: team, salt: salt, lines: lines)
    }

    /// The entries of this list whose account is among `subs` (the new team's subs), and the number of
    /// lines whose reference matched none.
    public func resolve(subs: some Sequence<String>) -> (entries: [TransferExport.Entry], unresolved: Int) {
        var wanted: [String: [String]] = [:]
        for line in lines { wanted[line.account, default: []].append(line.transferSub) }
        var entries: [TransferExport.Entry] = []
        var found = Set<String>()
        for sub in subs {
            let reference = Self.accountReference(salt: salt, sub: sub)
            guard let transferSubs = wanted[reference], found.insert(reference).inserted else { continue }
            entries += transferSubs.map { TransferExport.Entry(sub: sub, transferSub: $0) }
        }
        return (entries, lines.count - entries.count)
    }
}
