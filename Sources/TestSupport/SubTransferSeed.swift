public import Postgres

/// Seeds one user in every table that holds a sub, with a notification in the history.
public func seedUser(_ connection: PostgresConnection, sub: String, email: String?, isPrivate: Bool?) throws {
    try connection.execute(
        "INSERT INTO siwa.accounts (sub, email, is_private_email) VALUES ($1::text, $2::text, $3::boolean)",
        [.text(sub), email.map(PostgresData.text), isPrivate.map(PostgresData.bool)])
    try connection.execute("INSERT INTO siwa.sessions (sub) VALUES ($1::text), ($1::text)", [.text(sub)])
    try connection.execute(
        "INSERT INTO siwa.refresh_tokens (sub, client_id, token_sha256) VALUES ($1, 'com.example.app', sha256($1::text::bytea))",
        [.text(sub)])
    try connection.execute(
        "INSERT INTO siwa.sign_in_codes (code_sha256, client_id, sub) VALUES (sha256(('c' || $1::text)::bytea), 'com.example.app', $1::text)",
        [.text(sub)])
    try connection.execute(
        "INSERT INTO siwa.sign_ins (sub, client_id) VALUES ($1::text, 'com.example.app')", [.text(sub)])
    try connection.execute(
        "INSERT INTO siwa.revocation_requests (sub, reason) VALUES ($1::text, 'test')", [.text(sub)])
    try connection.execute(
        """
        INSERT INTO siwa.notifications (jti, event_type, sub, audience, event_time, issued_at, state, applied_at)
        VALUES ('before-' || $1::text, 'email-enabled', $1::text, 'com.example.app', now(), now(), 'applied', now())
        """, [.text(sub)])
}

/// Calls the rewrite for pairs (old, new, email, is_private_email); returns the outcome per old sub.
@discardableResult
public func applyTransfer(
    _ connection: PostgresConnection, _ pairs: [(String, String, String?, Bool?)], transferID: String = "t1"
) throws -> [String: String] {
    func array(_ values: [String?]) -> String {
        "{" + values.map { $0.map { "\"\($0)\"" } ?? "NULL" }.joined(separator: ",") + "}"
    }
    let rows = try connection.query(
        "SELECT old_sub, outcome FROM siwa.apply_sub_transfer($1, $2::text[], $3::text[], $4::text[], $5::boolean[])",
        [
            .text(transferID), .text(array(pairs.map(\.0))), .text(array(pairs.map(\.1))),
            .text(array(pairs.map(\.2))), .text(array(pairs.map { $0.3.map { $0 ? "true" : "false" } })),
        ])
    var outcomes: [String: String] = [:]
    for row in rows { outcomes[try row[0, as: String.self]] = try row[1, as: String.self] }
    return outcomes
}
