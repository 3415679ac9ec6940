public import Foundation
public import HTTPClient

/// Amazon SES v2's account-level suppression list, SigV4-signed for service `ses`:
/// `PUT /v2/email/suppression/addresses` with `{"EmailAddress", "Reason"}` (200), and
/// `GET`/`DELETE /v2/email/suppression/addresses/{EmailAddress}` (200; 404 `NotFoundException` when the
/// list does not hold it). 429 is `TooManyRequestsException`, 400 `BadRequestException` (permanent).
///
/// Ownership: an add reads first (an address listed already is not ours); a remove reads first too, and
/// deletes only an entry still ours: its `Reason` the one we put, no `Attributes.MessageId` (SES's own
/// suppressions for a bounce or complaint carry the message's), not updated since we added it.
public struct SESProvider: SuppressionProvider {
    public var kind: String { "ses" }
    /// The region (`eu-west-1`): the signature's scope and the default endpoint's host.
    public let region: String
    /// The API's origin: `https://email.{region}.amazonaws.com` unless overridden.
    public let endpoint: String
    /// The `Reason` our adds give (`BOUNCE` or `COMPLAINT`); SES stops sending to either.
    public let reason: String
    private let credentials: @Sendable () -> SigV4Signer.Credentials
    private let now: @Sendable () -> Date

    /// How much later than our record of an add SES may date it (clocks differ) and it still be ours.
    public static let clockSkew: TimeInterval = 300

    /// An adapter signing with `credentials` (from secret files or the environment) for `region`.
    public init(
        credentials: SigV4Signer.Credentials, region: String, endpoint: String? = nil,
        reason: String = "BOUNCE",
        now: @escaping @Sendable () -> Date = { Date() }
    ) {
        self.init(
            credentials: { credentials }, region: region, endpoint: endpoint, reason: reason, now: now)
    }

    /// An adapter signing each request with the key `credentialsFile` holds at that moment.
    public init(
        credentialsFile: SESCredentialsFile, region: String, endpoint: String? = nil,
        reason: String = "BOUNCE",
        now: @escaping @Sendable () -> Date = { Date() }
    ) {
        self.init(
            credentials: { credentialsFile.current() }, region: region, endpoint: endpoint, reason: reason,
            now: now)
    }

    private init(
        credentials: @escaping @Sendable () -> SigV4Signer.Credentials, region: String, endpoint: String?,
        reason: String, now: @escaping @Sendable () -> Date
    ) {
        self.region = region
        self.endpoint = endpoint ?? "https://email.\(region).amazonaws.com"
        self.reason = reason
        self.credentials = credentials
        self.now = now
    }

    private static let path = "/v2/email/suppression/addresses"

    private func signed(_ method: String, _ path: String, body: [UInt8] = []) -> OutboundHTTP.Request {
        let url = endpoint + path
        var headers: [(String, String)] = [("Accept", "application/json")]
        if !body.isEmpty { headers.append(("Content-Type", "application/json")) }
        let signer = SigV4Signer(credentials: credentials(), region: region, service: "ses")
        let all = signer.sign(method: method, url: url, headers: headers, body: body, date: now())
        return OutboundHTTP.Request(
            method: method, url: url, headers: all.map { OutboundHTTP.Header($0.0, $0.1) },
            body: body.isEmpty ? nil : body)
    }

    private func entryPath(_ address: String) -> String { Self.path + "/" + SigV4Signer.encode(address) }

    public func request(_ action: SuppressionAction, address: String) -> OutboundHTTP.Request {
        switch action {
        case .add:
            signed(
                "PUT", Self.path, body: SuppressionAnswer.json(["EmailAddress": address, "Reason": reason]))
        case .remove: signed("DELETE", entryPath(address))
        }
    }

    /// `GET …/addresses/{EmailAddress}`: 200 with the entry when listed, 404 when not.
    public func lookup(address: String) -> OutboundHTTP.Request { signed("GET", entryPath(address)) }

    public func listed(_ response: OutboundHTTP.Response) -> Bool? {
        switch response.status {
        case 200: Self.destination(response) != nil ? true : nil
        case 404: false
        default: nil
        }
    }

    public func removalCheck(address: String) -> OutboundHTTP.Request? { lookup(address: address) }

    public func entry(_ response: OutboundHTTP.Response, addedAt: Date?) -> SuppressionEntry? {
        if response.status == 404 { return .absent }
        guard response.status == 200, let destination = Self.destination(response) else { return nil }
        if destination["Reason"] as? String != reason { return .notOurs }
        if let attributes = destination["Attributes"] as? [String: Any], attributes["MessageId"] is String {
            return .notOurs
        }
        if let addedAt, let updated = Self.date(destination["LastUpdateTime"]),
            updated.timeIntervalSince(addedAt) > Self.clockSkew
        {
            return .notOurs
        }
        return .ours
    }

    private static func destination(_ response: OutboundHTTP.Response) -> [String: Any]? {
        (try? JSONSerialization.jsonObject(with: response.data) as? [String: Any])?["SuppressedDestination"]
            as? [String: Any]
    }

    /// A JSON timestamp as SES writes it: Unix seconds (a number), or an ISO 8601 string.
    private static func date(_ value: Any?) -> Date? {
        if let seconds = value as? Double { return Date(timeIntervalSince1970: seconds) }
        if let seconds = value as? Int { return Date(timeIntervalSince1970: Double(seconds)) }
        if let text = value as? String {
            let format = ISO8601DateFormatter()
            format.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
            if let date = format.date(from: text) { return date }
            format.formatOptions = [.withInternetDateTime]
            return format.date(from: text)
        }
        return nil
    }
}
