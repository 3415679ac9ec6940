import CLibPQ

/// How to reach a PostgreSQL server: a connection URL (`postgresql://user:pw@/db?host=/run/postgresql`)
/// or a conninfo string (`host=/run/postgresql dbname=app`), plus a few client settings.
///
/// The connection string is handed to libpq unchanged; it is validated (parsed, not connected) when the
/// configuration is created. `description` never shows a password.
public struct PostgresConfiguration: Sendable, CustomStringConvertible {
    /// The connection string exactly as given (may contain a password: do not log it).
    let connectionString: String
    /// `application_name` reported to the server (visible in `pg_stat_activity`), unless the
    /// connection string sets one.
    public var applicationName: String?
    /// How long opening a connection may take before it fails (libpq's `connect_timeout`, which has
    /// a resolution of whole seconds and a minimum of 2 s), unless the connection string sets one.
    public var connectTimeout: Duration
    /// How many distinct parameterised statements each connection prepares and keeps, keyed by SQL
    /// text; `0` disables the automatic statement cache.
    public var statementCacheCapacity: Int

    /// The database name from the connection string, if it names one.
    public let database: String?
    /// The user name from the connection string, if it names one.
    public let user: String?
    /// The host (name, address or socket directory) from the connection string, if it names one.
    public let host: String?
    /// The port from the connection string, if it names one.
    public let port: String?
    /// `target_session_attrs` from the connection string (e.g. `read-write`: of several hosts, only a
    /// primary), if it sets one.
    public let targetSessionAttributes: String?
    /// The password from the connection string, if it has one: only to mask it in libpq's messages.
    let password: String?

    /// Parses and validates `connectionString` (URL or conninfo form) without connecting.
    /// - Throws: `PostgresError` with code `.invalidConfiguration` when libpq cannot parse it.
    public init(
        _ connectionString: String,
        applicationName: String? = nil,
        connectTimeout: Duration = .seconds(5),
        statementCacheCapacity: Int = 64
    ) throws(PostgresError) {
        var errorMessage: UnsafeMutablePointer<CChar>? = nil
        guard let options = PQconninfoParse(connectionString, &errorMessage) else {
            var libpqMessage = ""
            if let errorMessage {
                libpqMessage = String(cString: errorMessage)
                PQfreemem(errorMessage)
            }
            throw PostgresError(
                code: .invalidConfiguration,
                message: "invalid connection string: " + Self.redactedReason(libpqMessage))
        }
        defer { PQconninfoFree(options) }
        var values: [String: String] = [:]
        var cursor = options
        while let keyword = cursor.pointee.keyword {
            if let value = cursor.pointee.val { values[String(cString: keyword)] = String(cString: value) }
            cursor += 1
        }
        guard connectTimeout > .zero, statementCacheCapacity >= 0 else {
            throw PostgresError(
                code: .invalidConfiguration,
                message: "connectTimeout must be positive and statementCacheCapacity not negative")
        }
        self.connectionString = connectionString
        self.applicationName = applicationName
        self.connectTimeout = connectTimeout
        self.statementCacheCapacity = statementCacheCapacity
        self.database = values["dbname"]
        self.user = values["user"]
        self.host = values["host"] ?? values["hostaddr"]
        self.port = values["port"]
        self.targetSessionAttributes = values["target_session_attrs"]
        self.password = values["password"].flatMap { $0.isEmpty ? nil : $0 }
    }

    /// `text` with the password (as given and percent-encoded) and the connection string itself
    /// replaced by `****`: for libpq's reasons of a failed connection, which name the host, port, user
    /// and database and the server's reason (password authentication failed, database does not exist,
    /// no pg_hba.conf entry), and never a statement's data.
    func maskingSecrets(in text: String) -> String {
        var masked = text
        if connectionString.count >= 8 { masked = masked.replacingAll(connectionString, with: "****") }
        if let password {
            var forms = [password]
            if let encoded = password.addingPercentEncodingForURL(), encoded != password {
                forms.append(encoded)
            }
            for form in forms.sorted(by: { $0.count > $1.count }) {
                masked = masked.replacingAll(form, with: "****")
            }
        }
        return masked
    }

    /// A reason for a parse failure that quotes nothing from the connection string.
    ///
    /// libpq's messages quote the offending token or the whole URL (`invalid percent-encoded token:
    /// "Sup3rS3cret%zz"`), which may be or contain the password; so they are never shown. Known
    /// messages are mapped to fixed text of our own; anything else becomes a generic reason.
    static func redactedReason(_ libpqMessage: String) -> String {
        let reasons: [(String, String)] = [
            ("invalid percent-encoded token", "a %-escape is not followed by two hex digits"),
            ("forbidden value %00", "a %-escape decodes to a NUL byte"),
            ("missing \"=\" after", "a conninfo word has no \"=\" (quote values that contain spaces)"),
            ("unterminated quoted string", "a quoted conninfo value is not terminated"),
            ("invalid connection option", "an unknown connection option is named"),
            ("invalid URI query parameter", "a URL query parameter is not valid"),
            ("extra key/value separator", "a URL query parameter has more than one \"=\""),
            ("missing key/value separator", "a URL query parameter has no \"=\""),
            ("IPv6 host address may not be empty", "the URL's IPv6 host is empty"),
            ("end of string reached when looking for matching \"]\"", "the URL's IPv6 host lacks \"]\""),
            ("unexpected character", "the URL has an unexpected character after the host"),
            ("out of memory", "out of memory"),
        ]
        for (prefix, reason) in reasons where libpqMessage.contains(prefix) {
            return reason + " (the text is not shown: it may contain the password)"
        }
        return "libpq cannot parse it (its message is not shown: it may quote the password)"
    }

    /// A summary such as `postgresql://app@/siwa?host=/run/postgresql&port=5432` or, for several hosts,
    /// `postgresql://app@db-a:5432,db-b:5432/siwa?target_session_attrs=read-write`, without any password.
    public var description: String {
        var text = "postgresql://"
        if let user { text += user + "@" }
        let hosts =
            host.map { $0.split(separator: ",", omittingEmptySubsequences: false).map(String.init) } ?? []
        let ports =
            port.map { $0.split(separator: ",", omittingEmptySubsequences: false).map(String.init) } ?? []
        let hostIsSocket = hosts.contains { $0.hasPrefix("/") }
        if !hostIsSocket && !hosts.isEmpty {
            // libpq pairs the nth host with the nth port, or every host with a single port.
            text += hosts.indices.map { index in
                let hostPort = ports.count == 1 ? ports[0] : index < ports.count ? ports[index] : ""
                return hosts[index] + (hostPort.isEmpty ? "" : ":" + hostPort)
            }.joined(separator: ",")
        } else if !hostIsSocket, let port {
            text += ":" + port
        }
        text += "/" + (database ?? "")
        var query: [String] = []
        if let host, hostIsSocket { query.append("host=" + host) }
        if let port, hostIsSocket { query.append("port=" + port) }
        if let targetSessionAttributes { query.append("target_session_attrs=" + targetSessionAttributes) }
        if !query.isEmpty { text += "?" + query.joined(separator: "&") }
        return text
    }

    /// Keyword/value pairs for `PQconnectdbParams` with `expand_dbname = 1`. Defaults come first so
    /// that anything the connection string sets explicitly wins; the string itself is passed as-is.
    var connectionParameters: [(String, String)] {
        let seconds = connectTimeout.components.seconds + (connectTimeout.components.attoseconds > 0 ? 1 : 0)
        var parameters: [(String, String)] = [
            ("connect_timeout", String(max(2, seconds))),
            ("client_encoding", "UTF8"),
            ("options", "-c DateStyle=ISO,MDY -c TimeZone=UTC -c IntervalStyle=postgres"),
        ]
        if let applicationName { parameters.append(("application_name", applicationName)) }
        parameters.append(("dbname", connectionString))
        return parameters
    }
}

extension String {
    func trimmingWhitespace() -> String {
        var scalars = Substring(self)
        while let last = scalars.last, last.isWhitespace { scalars.removeLast() }
        while let first = scalars.first, first.isWhitespace { scalars.removeFirst() }
        return String(scalars)
    }
}

extension String {
    /// Every occurrence of `target` replaced (without Foundation).
    func replacingAll(_ target: String, with replacement: String) -> String {
        guard !target.isEmpty else { return self }
        var result = ""
        var rest = self[...]
        while let range = rest.firstRange(of: target) {
            result += rest[..<range.lowerBound]
            result += replacement
            rest = rest[range.upperBound...]
        }
        return result + rest
    }

    /// Percent-encoded as in a URL's userinfo: everything but unreserved characters.
    func addingPercentEncodingForURL() -> String? {
        var out = ""
        for byte in utf8 {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "."),
                UInt8(ascii: "_"),
                UInt8(ascii: "~"):
                out.append(Character(Unicode.Scalar(byte)))
            default:
                let hex = Array("0123456789ABCDEF")
                out += "%" + String(hex[Int(byte >> 4)]) + String(hex[Int(byte & 0xF)])
            }
        }
        return out
    }
}
