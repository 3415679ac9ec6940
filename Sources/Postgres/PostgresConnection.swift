import CLibPQ

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A notification received on a channel this connection listens to.
public struct PostgresNotification: Sendable, Hashable {
    /// The channel name.
    public let channel: String
    /// The payload given to `NOTIFY`/`pg_notify` (empty when none).
    public let payload: String
    /// The process ID of the server backend that sent it.
    public let senderProcessID: Int32
}

/// One synchronous connection to PostgreSQL over libpq.
///
/// Use it from one thread at a time (it is `Sendable` so it can be handed between threads, e.g. by
/// `PostgresPool`, but it does no locking). Every statement is sent with its parameters separately
/// (never interpolated); results are fully read before a call returns.
// @unchecked: it holds a libpq handle and mutable state without a lock, so it is safe only as the
// contract above says: used by one thread at a time, handed over with a happens-before edge (a pool's
// lock, a thread's start or join). It is Sendable so that such hand-overs compile.
public final class PostgresConnection: @unchecked Sendable {
    /// The connection's state as libpq sees it.
    public struct Status: Hashable, Sendable, CustomStringConvertible {
        private let name: String
        private init(_ name: String) { self.name = name }
        public var description: String { name }

        /// Connected and usable.
        public static let connected = Status("connected")
        /// The connection broke; it cannot be used again.
        public static let broken = Status("broken")
        /// `close()` was called.
        public static let closed = Status("closed")
    }

    /// The configuration this connection was opened with.
    public let configuration: PostgresConfiguration
    /// The owned libpq handle; `PQfinish` is called exactly once, by `close()` or `deinit`.
    private var handle: OpaquePointer?
    private var statementCache: [String: String] = [:]
    private var statementCacheOrder: [String] = []
    private var statementCounter = 0
    /// Set once a statement failed at the connection level (the server may not have closed the socket
    /// yet, but the connection must not be reused).
    private var sawConnectionError = false
    /// Filled by the notice receiver: whether the server reported a FATAL error outside any statement
    /// (e.g. "terminating connection due to administrator command" sent to an idle session), and the
    /// notices and warnings it sent. Retained here, released in `deinit` after the handle is finished.
    private let sink: NoticeSink

    /// Opens a connection, failing after `configuration.connectTimeout` at the latest.
    /// - Throws: `.connectionFailed` with libpq's reason.
    public init(configuration: PostgresConfiguration) throws(PostgresError) {
        self.configuration = configuration
        sink = NoticeSink()
        let parameters = configuration.connectionParameters
        let keywords = parameters.map { UnsafePointer(strdup($0.0)) } + [nil]
        let values = parameters.map { UnsafePointer(strdup($0.1)) } + [nil]
        defer {
            for pointer in keywords + values { free(UnsafeMutablePointer(mutating: pointer)) }
        }
        guard let connection = PQconnectdbParams(keywords, values, 1) else {
            throw PostgresError(code: .connectionFailed, message: "libpq could not allocate a connection")
        }
        guard PQstatus(connection) == CONNECTION_OK else {
            // libpq's reason names host, port, user and database and the server's reason (password
            // authentication failed, database does not exist, no pg_hba.conf entry): safe to log once
            // any password is masked, so it is part of the error's description (see PostgresError).
            let message = configuration.maskingSecrets(
                in: String(cString: PQerrorMessage(connection)).trimmingWhitespace())
            PQfinish(connection)
            throw PostgresError(code: .connectionFailed, message: message)
        }
        // Notices are not printed (libraries never print): they are kept for ``takeNotices()``; a
        // FATAL one marks the session as ended.
        PQsetNoticeReceiver(
            connection,
            { context, result in
                guard let context, let result else { return }
                let sink = Unmanaged<NoticeSink>.fromOpaque(context).takeUnretainedValue()
                func field(_ code: Unicode.Scalar) -> String? {
                    PQresultErrorField(result, Int32(code.value)).map { String(cString: $0) }
                }
                let level = field("V") ?? field("S") ?? "NOTICE"
                if level == "FATAL" || level == "PANIC" { sink.serverEndedSession = true }
                sink.append(
                    PostgresNotice(
                        severity: level, sqlState: field("C"),
                        message: (field("M") ?? "").trimmingWhitespace(), detail: field("D"), hint: field("H")
                    ))
            }, Unmanaged.passUnretained(sink).toOpaque())
        handle = connection
        try ensureSessionSettings()
    }

    deinit {
        close()
    }

    /// The notices and warnings the server sent on this connection since the last call (at most the
    /// latest ``NoticeSink/capacity``), oldest first, and forgets them. Their texts are the server's:
    /// they may name objects or repeat what a function raised, so show them to an operator (as
    /// `siwactl migrate` does), do not log them.
    public func takeNotices() -> [PostgresNotice] {
        sink.take()
    }

    /// Closes the connection (idempotent). Later calls throw `.connectionClosed`.
    public func close() {
        guard let handle else { return }
        self.handle = nil
        PQfinish(handle)
    }

    /// The connection's state.
    public var status: Status {
        guard let handle else { return .closed }
        let usable = PQstatus(handle) == CONNECTION_OK && !sawConnectionError && !sink.serverEndedSession
        return usable ? .connected : .broken
    }

    /// True when the connection is open and libpq considers it usable.
    public var isHealthy: Bool { status == .connected }

    /// True inside a transaction block (including one aborted by an error).
    var isInTransaction: Bool {
        guard let handle else { return false }
        let state = PQtransactionStatus(handle)
        return state == PQTRANS_INTRANS || state == PQTRANS_INERROR
    }

    /// The process ID of the server backend serving this connection (0 when closed).
    public var backendProcessID: Int32 {
        guard let handle else { return 0 }
        return PQbackendPID(handle)
    }

    // MARK: Statements

    /// Runs one statement with `$1…$n` parameters and returns its rows.
    ///
    /// With a statement cache (the default), the statement is prepared on first use and reused.
    @discardableResult
    public func query(_ sql: String, _ parameters: [PostgresData?] = []) throws(PostgresError) -> PostgresRows
    {
        if configuration.statementCacheCapacity > 0 && !parameters.isEmpty {
            return try runCached(sql, parameters)
        }
        return try runUnprepared(sql, parameters)
    }

    /// The columns `sql` would return, without running it: prepared as the unnamed statement and
    /// described (`PQdescribePrepared`); parameter types are inferred by the server.
    public func describe(_ sql: String) throws(PostgresError) -> PostgresColumns {
        let handle = try openHandle()
        _ = try collectResults { PQsendPrepare(handle, "", sql, 0, nil) }
        guard let description = try collectResults({ PQsendDescribePrepared(handle, "") }).last,
            !description.columnTypes.isEmpty
        else { return PostgresColumns(names: [], types: []) }
        let oids = description.columnTypes.map { PostgresData.int(Int64($0)) }
        let names = try query(
            "SELECT pg_catalog.format_type(o, NULL) FROM unnest($1::oid[]) WITH ORDINALITY AS t(o, n) ORDER BY n",
            [.array(oids)]
        ).map { row throws(PostgresError) in try row[0, as: String.self] }
        return PostgresColumns(names: description.columns, types: names)
    }

    /// Runs one statement and returns the number of rows it affected.
    @discardableResult
    public func execute(_ sql: String, _ parameters: [PostgresData?] = []) throws(PostgresError) -> Int {
        try query(sql, parameters).affectedRows
    }

    /// Runs a script of one or more statements without parameters (e.g. a schema file), returning the
    /// rows of each statement in order.
    @discardableResult
    public func simpleQuery(_ sql: String) throws(PostgresError) -> [PostgresRows] {
        let handle = try openHandle()
        return try collectResults { PQsendQuery(handle, sql) }
    }

    /// Runs `body` inside `BEGIN … COMMIT`; rolls back and rethrows if `body` throws. `body` runs right
    /// after `BEGIN`, so it may start with `SET TRANSACTION ISOLATION LEVEL …`.
    ///
    /// - Throws: the error from `body`, or a `PostgresError` from BEGIN/COMMIT (a serializable
    ///   conflict at commit is `.serializationFailure`), or `.queryFailed` if the transaction had
    ///   been aborted by an earlier error that `body` swallowed (the server then rolls back).
    public func transaction<T>(_ body: (PostgresConnection) throws -> T) throws -> T {
        try simpleQuery("BEGIN")
        let value: T
        do {
            value = try body(self)
        } catch {
            if isHealthy && isInTransaction { _ = try? simpleQuery("ROLLBACK") }
            throw error
        }
        let commit = try simpleQuery("COMMIT")
        if commit.last?.commandTag == "ROLLBACK" {
            throw PostgresError(
                code: .queryFailed,
                message: "the transaction was aborted by an earlier error and has been rolled back")
        }
        return value
    }

    // MARK: LISTEN / NOTIFY

    /// Opens a connection that listens on `channel` (closed again if LISTEN fails): a consumer's.
    public static func listening(on channel: String, configuration: PostgresConfiguration)
        throws(PostgresError)
        -> PostgresConnection
    {
        let connection = try PostgresConnection(configuration: configuration)
        do {
            try connection.listen(channel)
        } catch {
            connection.close()
            throw error
        }
        return connection
    }

    /// Starts listening on `channel` (quoted safely as an identifier).
    public func listen(_ channel: String) throws(PostgresError) {
        try simpleQuery("LISTEN " + quotedIdentifier(channel))
    }

    /// Waits until at least one notification has arrived or `timeout` passes.
    ///
    /// Returns the notifications received so far (possibly several), or `[]` on timeout.
    /// - Throws: `.connectionLost` when the server closes the connection while waiting.
    public func waitForNotifications(timeout: Duration) throws(PostgresError) -> [PostgresNotification] {
        try waitForNotifications(timeout: timeout, wakeDescriptor: nil)
    }

    /// Waits as ``waitForNotifications(timeout:)`` does, returning early (with none) as soon as
    /// `wakeDescriptor` becomes readable: a stop signal's descriptor wakes a LISTEN wait at once.
    public func waitForNotifications(timeout: Duration, wakeDescriptor: Int32?) throws(PostgresError)
        -> [PostgresNotification]
    {
        let handle = try openHandle()
        let deadline = ContinuousClock.now + timeout
        if PQconsumeInput(handle) == 0 || PQstatus(handle) != CONNECTION_OK {
            sawConnectionError = true
            throw connectionLost(handle)
        }
        var notifications = drainNotifications(handle)
        while notifications.isEmpty {
            let remaining = deadline - ContinuousClock.now
            guard remaining > .zero else { return [] }
            let socket = PQsocket(handle)
            guard socket >= 0 else {
                sawConnectionError = true
                throw connectionLost(handle)
            }
            var descriptors = [
                pollfd(fd: socket, events: Int16(POLLIN), revents: 0),
                pollfd(fd: wakeDescriptor ?? -1, events: Int16(POLLIN), revents: 0),
            ]
            let ready = poll(
                &descriptors, nfds_t(wakeDescriptor == nil ? 1 : 2), Self.milliseconds(remaining))
            if ready < 0 {
                if errno == EINTR { continue }
                throw PostgresError(code: .connectionLost, message: "poll() failed with errno \(errno)")
            }
            guard ready > 0 else { continue }
            if wakeDescriptor != nil, descriptors[1].revents != 0 { return [] }
            if PQconsumeInput(handle) == 0 || PQstatus(handle) != CONNECTION_OK {
                sawConnectionError = true
                throw connectionLost(handle)
            }
            notifications = drainNotifications(handle)
        }
        return notifications
    }

    // MARK: Pool support

    /// For pools: marks the connection as not to be reused (it reaches a server that cannot write).
    func discard() {
        sawConnectionError = true
    }

    /// For pools: true when an idle connection still looks alive. Reads anything the server sent
    /// (e.g. a shutdown notice followed by end-of-file) without blocking.
    func isAliveWhenIdle() -> Bool {
        guard let handle, PQstatus(handle) == CONNECTION_OK, !sawConnectionError else { return false }
        let socket = PQsocket(handle)
        guard socket >= 0 else { return false }
        // A server that ended the session sent an error and then closed the socket: keep reading
        // while input is pending until libpq sees the end of the stream (bounded, never blocking).
        for _ in 0..<8 {
            var descriptor = pollfd(fd: socket, events: Int16(POLLIN), revents: 0)
            guard poll(&descriptor, 1, 0) > 0 else { break }
            if PQconsumeInput(handle) == 0 { return false }
            _ = PQisBusy(handle)  // Parses what was read, so a FATAL notice reaches the receiver.
        }
        return PQstatus(handle) == CONNECTION_OK && !sink.serverEndedSession
            && PQtransactionStatus(handle) == PQTRANS_IDLE
    }

    // MARK: Internals

    private func openHandle() throws(PostgresError) -> OpaquePointer {
        guard let handle else {
            throw PostgresError(code: .connectionClosed, message: "the connection has been closed")
        }
        return handle
    }

    /// The connect options ask for UTF-8, ISO dates and UTC; a connection string may override
    /// them, so check what the server reports and fix it up.
    private func ensureSessionSettings() throws(PostgresError) {
        let handle = try openHandle()
        func setting(_ name: String) -> String? {
            PQparameterStatus(handle, name).map { String(cString: $0) }
        }
        var statements: [String] = []
        if setting("client_encoding") != "UTF8" { statements.append("SET client_encoding = 'UTF8'") }
        if !(setting("DateStyle")?.hasPrefix("ISO") ?? false) { statements.append("SET DateStyle = 'ISO'") }
        if setting("TimeZone") != "UTC" { statements.append("SET TimeZone = 'UTC'") }
        if !statements.isEmpty { try simpleQuery(statements.joined(separator: "; ")) }
    }

    private func quotedIdentifier(_ identifier: String) throws(PostgresError) -> String {
        let handle = try openHandle()
        let length = identifier.utf8.count
        guard let quoted = PQescapeIdentifier(handle, identifier, length) else {
            throw PostgresError(
                code: .queryFailed,
                message: String(cString: PQerrorMessage(handle)).trimmingWhitespace())
        }
        defer { PQfreemem(quoted) }
        return String(cString: quoted)
    }

    @discardableResult
    private func runUnprepared(_ sql: String, _ parameters: [PostgresData?]) throws(PostgresError)
        -> PostgresRows
    {
        let handle = try openHandle()
        let values = try ParameterValues(parameters)
        defer { values.release() }
        return try lastResult(
            collectResults {
                PQsendQueryParams(
                    handle, sql, Int32(values.count), values.types, values.pointers, values.lengths,
                    values.formats, 0)
            })
    }

    private func runCached(_ sql: String, _ parameters: [PostgresData?]) throws(PostgresError) -> PostgresRows
    {
        let handle = try openHandle()
        let values = try ParameterValues(parameters)
        defer { values.release() }
        let key = values.types.map(String.init).joined(separator: ",") + "|" + sql
        var retried = false
        while true {
            let name = try preparedName(for: key, sql: sql, values: values, handle: handle)
            do {
                return try lastResult(
                    collectResults {
                        PQsendQueryPrepared(
                            handle, name, Int32(values.count), values.pointers, values.lengths,
                            values.formats, 0)
                    })
            } catch {
                // The statement vanished (DEALLOCATE ALL / DISCARD ALL): forget it and, outside a
                // transaction (where the failure aborted nothing), prepare it again once.
                guard error.sqlState == "26000" else { throw error }
                statementCache.removeValue(forKey: key)
                statementCacheOrder.removeAll { $0 == key }
                if retried || isInTransaction { throw error }
                retried = true
            }
        }
    }

    /// The cached statement name for `key`, preparing (and evicting the oldest) on a miss.
    private func preparedName(
        for key: String, sql: String, values: ParameterValues, handle: OpaquePointer
    ) throws(PostgresError) -> String {
        if let cached = statementCache[key] { return cached }
        if statementCacheOrder.count >= configuration.statementCacheCapacity {
            let evicted = statementCacheOrder.removeFirst()
            if let evictedName = statementCache.removeValue(forKey: evicted), !isInTransaction {
                _ = try? simpleQuery("DEALLOCATE " + evictedName)
            }
        }
        statementCounter += 1
        let name = "siwa_stmt_\(statementCounter)"
        _ = try collectResults { PQsendPrepare(handle, name, sql, Int32(values.count), values.types) }
        statementCache[key] = name
        statementCacheOrder.append(key)
        return name
    }

    private func lastResult(_ results: [PostgresRows]) -> PostgresRows {
        results.last
            ?? PostgresRows(columns: [], columnTypes: [], values: [], affectedRows: 0, commandTag: "")
    }

    /// Sends one command with `send`, then reads every result until libpq returns NULL.
    private func collectResults(_ send: () -> Int32) throws(PostgresError) -> [PostgresRows] {
        let handle = try openHandle()
        guard send() == 1 else {
            let message = String(cString: PQerrorMessage(handle)).trimmingWhitespace()
            let code: PostgresError.Code = PQstatus(handle) == CONNECTION_OK ? .queryFailed : .connectionLost
            if code == .connectionLost { sawConnectionError = true }
            throw PostgresError(code: code, message: message)
        }
        var results: [PostgresRows] = []
        var firstError: PostgresError?
        while let result = PQgetResult(handle) {
            defer { PQclear(result) }
            let state = PQresultStatus(result)
            if state == PGRES_COMMAND_OK || state == PGRES_TUPLES_OK || state == PGRES_EMPTY_QUERY {
                results.append(Self.rows(from: result))
            } else if state == PGRES_COPY_IN {
                _ = PQputCopyEnd(handle, "COPY FROM STDIN is not supported by this client")
                firstError = firstError ?? Self.unsupportedCopy
            } else if state == PGRES_COPY_OUT {
                var buffer: UnsafeMutablePointer<CChar>? = nil
                while PQgetCopyData(handle, &buffer, 0) > 0 {
                    PQfreemem(buffer)
                    buffer = nil
                }
                firstError = firstError ?? Self.unsupportedCopy
            } else if state == PGRES_COPY_BOTH {
                firstError = firstError ?? Self.unsupportedCopy
                close()
                break
            } else {
                firstError = firstError ?? error(from: result, handle: handle)
            }
        }
        if self.handle == nil || PQstatus(handle) != CONNECTION_OK || firstError?.code == .connectionLost {
            sawConnectionError = true
            let base = firstError?.message ?? String(cString: PQerrorMessage(handle)).trimmingWhitespace()
            throw PostgresError(code: .connectionLost, message: base, sqlState: firstError?.sqlState)
        }
        if let firstError {
            // A server that accepts no writes (a standby after a failover, or read-only by default): this
            // session stays there, so it is not reused; a new connection may reach the primary.
            if firstError.code == .readOnly { sawConnectionError = true }
            throw firstError
        }
        return results
    }

    private static let unsupportedCopy = PostgresError(
        code: .unsupported, message: "COPY is not supported by this client")

    private func error(from result: OpaquePointer, handle: OpaquePointer) -> PostgresError {
        func field(_ code: Unicode.Scalar) -> String? {
            PQresultErrorField(result, Int32(UInt8(ascii: code))).map { String(cString: $0) }
        }
        let sqlState = field("C")
        let primary =
            field("M") ?? String(cString: PQresultErrorMessage(result)).trimmingWhitespace()
        let code =
            PQstatus(handle) == CONNECTION_OK
            ? PostgresError.code(forSQLState: sqlState) : .connectionLost
        return PostgresError(
            code: code, message: PostgresError.redacted(primary, sqlState: sqlState), sqlState: sqlState,
            constraintName: field("n"))
    }

    private func connectionLost(_ handle: OpaquePointer) -> PostgresError {
        let message = String(cString: PQerrorMessage(handle)).trimmingWhitespace()
        return PostgresError(
            code: .connectionLost,
            message: message.isEmpty ? "the connection to the server was lost" : message)
    }

    private func drainNotifications(_ handle: OpaquePointer) -> [PostgresNotification] {
        var notifications: [PostgresNotification] = []
        while let notify = PQnotifies(handle) {
            notifications.append(
                PostgresNotification(
                    channel: String(cString: notify.pointee.relname),
                    payload: notify.pointee.extra.map { String(cString: $0) } ?? "",
                    senderProcessID: notify.pointee.be_pid))
            PQfreemem(notify)
        }
        return notifications
    }

    private static func rows(from result: OpaquePointer) -> PostgresRows {
        let fieldCount = Int(PQnfields(result))
        let rowCount = Int(PQntuples(result))
        var columns: [String] = []
        var types: [UInt32] = []
        for field in 0..<fieldCount {
            columns.append(String(cString: PQfname(result, Int32(field))))
            types.append(UInt32(PQftype(result, Int32(field))))
        }
        var values: [String?] = []
        values.reserveCapacity(rowCount * fieldCount)
        for row in 0..<rowCount {
            for field in 0..<fieldCount {
                if PQgetisnull(result, Int32(row), Int32(field)) == 1 {
                    values.append(nil)
                } else {
                    let length = Int(PQgetlength(result, Int32(row), Int32(field)))
                    let raw = UnsafeRawPointer(PQgetvalue(result, Int32(row), Int32(field))!)
                    let bytes = UnsafeBufferPointer(
                        start: raw.assumingMemoryBound(to: UInt8.self), count: length)
                    values.append(String(decoding: bytes, as: UTF8.self))
                }
            }
        }
        let tag = String(cString: PQcmdStatus(result))
        let affected = Int(String(cString: PQcmdTuples(result))) ?? rowCount
        return PostgresRows(
            columns: columns, columnTypes: types, values: values, affectedRows: affected, commandTag: tag)
    }

    private static func milliseconds(_ duration: Duration) -> Int32 {
        let (seconds, attoseconds) = duration.components
        let total = seconds * 1000 + (attoseconds + 999_999_999_999_999) / 1_000_000_000_000_000
        return Int32(clamping: max(0, total))
    }
}

/// One statement's parameters as libpq takes them, in one buffer owned here and released with
/// `release()`: text values NUL-terminated, binary ones with their lengths.
private struct ParameterValues {
    let pointers: [UnsafePointer<CChar>?]
    let lengths: [Int32]
    let formats: [Int32]
    let types: [UInt32]
    private let storage: UnsafeMutableRawPointer
    var count: Int { pointers.count }

    init(_ parameters: [PostgresData?]) throws(PostgresError) {
        var buffer: [UInt8] = []
        var offsets: [Int?] = []
        var lengths: [Int32] = []
        var formats: [Int32] = []
        var types: [UInt32] = []
        offsets.reserveCapacity(parameters.count)
        for (position, parameter) in parameters.enumerated() {
            guard let parameter else {
                offsets.append(nil)
                lengths.append(0)
                formats.append(0)
                types.append(0)
                continue
            }
            let start = buffer.count
            let wire: PostgresWireFormat
            do {
                wire = try parameter.encode(into: &buffer)
            } catch {
                throw PostgresError(
                    code: .queryFailed,
                    message:
                        "parameter $\(position + 1) contains a NUL character, which PostgreSQL text cannot hold"
                )
            }
            offsets.append(start)
            lengths.append(wire.isBinary ? Int32(buffer.count - start) : 0)
            formats.append(wire.isBinary ? 1 : 0)
            types.append(wire.typeOID)
        }
        let storage = UnsafeMutableRawPointer.allocate(byteCount: max(1, buffer.count), alignment: 8)
        buffer.withUnsafeBytes { bytes in
            if let base = bytes.baseAddress { storage.copyMemory(from: base, byteCount: bytes.count) }
        }
        self.storage = storage
        self.pointers = offsets.map { offset in
            offset.map { UnsafePointer(storage.advanced(by: $0).assumingMemoryBound(to: CChar.self)) }
        }
        self.lengths = lengths
        self.formats = formats
        self.types = types
    }

    func release() {
        storage.deallocate()
    }
}

/// A notice, warning or other message the server sent outside an error (`RAISE WARNING`, `RAISE
/// NOTICE`, a `NOTICE` of a DDL statement), as ``PostgresConnection/takeNotices()`` returns it.
public struct PostgresNotice: Sendable, Hashable, CustomStringConvertible {
    /// `WARNING`, `NOTICE`, `INFO`, `DEBUG`, `LOG` (or `FATAL` when the server ends the session).
    public var severity: String
    /// The SQLSTATE (`01000` for a plain warning).
    public var sqlState: String?
    /// The primary message.
    public var message: String
    /// The detail, if any.
    public var detail: String?
    /// The hint, if any.
    public var hint: String?

    /// Creates a notice.
    public init(
        severity: String, sqlState: String?, message: String, detail: String? = nil, hint: String? = nil
    ) {
        self.severity = severity
        self.sqlState = sqlState
        self.message = message
        self.detail = detail
        self.hint = hint
    }

    /// `WARNING: message` followed by `DETAIL: …` and `HINT: …` when present, as psql prints it.
    public var description: String {
        var text = "\(severity): \(message)"
        if let detail { text += "\nDETAIL: \(detail)" }
        if let hint { text += "\nHINT: \(hint)" }
        return text
    }
}

/// Where libpq's notice receiver puts what it gets; used on the connection's thread only (libpq calls
/// the receiver synchronously inside the call that reads the server's message).
final class NoticeSink: @unchecked Sendable {
    /// The most notices kept; older ones are dropped (a long-lived connection nobody asks).
    static let capacity = 1000
    var serverEndedSession = false
    private var notices: [PostgresNotice] = []

    func append(_ notice: PostgresNotice) {
        if notices.count >= Self.capacity { notices.removeFirst(notices.count - Self.capacity + 1) }
        notices.append(notice)
    }

    func take() -> [PostgresNotice] {
        defer { notices = [] }
        return notices
    }
}
