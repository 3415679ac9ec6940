public import Foundation
public import HTTPClient

/// SendGrid's global suppressions (v3): `POST /v3/asm/suppressions/global` with
/// `{"recipient_emails": [address]}` (201) and `DELETE /v3/asm/suppressions/global/{email}` (204), a
/// Bearer API key. A 404 to the delete: the list did not hold it.
public struct SendGridProvider: SuppressionProvider {
    public var kind: String { "sendgrid" }
    /// The API's origin (`https://api.sendgrid.com`, or `https://api.eu.sendgrid.com`).
    public var baseURL: String
    private let apiKey: String

    /// An adapter with this API key (from a secret file or the environment).
    public init(apiKey: String, baseURL: String = "https://api.sendgrid.com") {
        self.apiKey = apiKey
        self.baseURL = baseURL
    }

    public func request(_ action: SuppressionAction, address: String) -> OutboundHTTP.Request {
        let path = "/v3/asm/suppressions/global"
        var headers: [OutboundHTTP.Header] = [.init("Authorization", "Bearer \(apiKey)")]
        switch action {
        case .add:
            headers.append(.init("Content-Type", "application/json"))
            return OutboundHTTP.Request(
                method: "POST", url: baseURL + path, headers: headers,
                body: SuppressionAnswer.json(["recipient_emails": [address]]))
        case .remove:
            return OutboundHTTP.Request(
                method: "DELETE", url: baseURL + path + "/" + SuppressionAnswer.pathSegment(address),
                headers: headers)
        }
    }

    /// `GET /v3/asm/suppressions/global/{email}`: the address back when listed, `{}` when not.
    public func lookup(address: String) -> OutboundHTTP.Request {
        OutboundHTTP.Request(
            method: "GET",
            url: baseURL + "/v3/asm/suppressions/global/" + SuppressionAnswer.pathSegment(address),
            headers: [.init("Authorization", "Bearer \(apiKey)"), .init("Accept", "application/json")])
    }

    public func listed(_ response: OutboundHTTP.Response) -> Bool? {
        guard response.status == 200,
            let answer = try? JSONSerialization.jsonObject(with: response.data) as? [String: Any]
        else { return nil }
        return answer["recipient_email"] is String
    }
}

/// Postmark's message-stream suppressions: `POST /message-streams/{stream}/suppressions` and
/// `POST /message-streams/{stream}/suppressions/delete` with `{"Suppressions": [{"EmailAddress": …}]}`,
/// `X-Postmark-Server-Token`. A 200 answers per address: `Suppressed` or `Deleted`, else `Failed` (a
/// suppression Postmark will not delete, such as a spam complaint): permanent.
public struct PostmarkProvider: SuppressionProvider {
    public var kind: String { "postmark" }
    /// The API's origin.
    public var baseURL: String
    /// The message stream whose list is kept (`outbound`: the default transactional stream).
    public var stream: String
    private let serverToken: String

    /// An adapter with this server token (from a secret file or the environment).
    public init(
        serverToken: String, stream: String = "outbound", baseURL: String = "https://api.postmarkapp.com"
    ) {
        self.serverToken = serverToken
        self.stream = stream
        self.baseURL = baseURL
    }

    public func request(_ action: SuppressionAction, address: String) -> OutboundHTTP.Request {
        let path = "/message-streams/\(SuppressionAnswer.pathSegment(stream))/suppressions"
        return OutboundHTTP.Request(
            method: "POST", url: baseURL + path + (action == .remove ? "/delete" : ""),
            headers: [
                .init("Accept", "application/json"), .init("Content-Type", "application/json"),
                .init("X-Postmark-Server-Token", serverToken),
            ],
            body: SuppressionAnswer.json(["Suppressions": [["EmailAddress": address]]]))
    }

    public func outcome(of action: SuppressionAction, response: OutboundHTTP.Response) -> SuppressionOutcome {
        if let failure = SuppressionAnswer.failure(response) { return failure }
        guard
            let answer = try? JSONSerialization.jsonObject(with: response.data) as? [String: Any],
            let first = (answer["Suppressions"] as? [[String: Any]])?.first,
            let status = first["Status"] as? String
        else { return .permanent(reason: "HTTP \(response.status): an answer without a suppression status") }
        switch (action, status) {
        case (.add, "Suppressed"), (.remove, "Deleted"): return .done
        default:
            return .permanent(
                reason: "Postmark answered \(status == "Failed" ? "Failed" : "an unknown status")")
        }
    }

    /// `GET /message-streams/{stream}/suppressions/dump?EmailAddress=…`: the stream's suppressions of it.
    public func lookup(address: String) -> OutboundHTTP.Request {
        OutboundHTTP.Request(
            method: "GET",
            url: baseURL
                + "/message-streams/\(SuppressionAnswer.pathSegment(stream))/suppressions/dump?EmailAddress="
                + SuppressionAnswer.pathSegment(address),
            headers: [.init("Accept", "application/json"), .init("X-Postmark-Server-Token", serverToken)])
    }

    public func listed(_ response: OutboundHTTP.Response) -> Bool? {
        guard response.status == 200,
            let answer = try? JSONSerialization.jsonObject(with: response.data) as? [String: Any],
            let suppressions = answer["Suppressions"] as? [Any]
        else { return nil }
        return !suppressions.isEmpty
    }
}

/// Mailgun's unsubscribes of a sending domain: `POST /v3/{domain}/unsubscribes` (form `address`,
/// `tag=*`) and `DELETE /v3/{domain}/unsubscribes/{address}`, basic auth `api:KEY`. A 404 to the
/// delete: the list did not hold it.
public struct MailgunProvider: SuppressionProvider {
    public var kind: String { "mailgun" }
    /// The API's origin (`https://api.mailgun.net`, or `https://api.eu.mailgun.net`).
    public var baseURL: String
    /// The sending domain whose list is kept.
    public var domain: String
    private let apiKey: String

    /// An adapter for `domain` with this API key (from a secret file or the environment).
    public init(apiKey: String, domain: String, baseURL: String = "https://api.mailgun.net") {
        self.apiKey = apiKey
        self.domain = domain
        self.baseURL = baseURL
    }

    public func request(_ action: SuppressionAction, address: String) -> OutboundHTTP.Request {
        let path = "/v3/\(SuppressionAnswer.pathSegment(domain))/unsubscribes"
        var headers: [OutboundHTTP.Header] = [
            .init("Authorization", "Basic " + Data("api:\(apiKey)".utf8).base64EncodedString())
        ]
        switch action {
        case .add:
            headers.append(.init("Content-Type", "application/x-www-form-urlencoded"))
            let form = "address=\(SuppressionAnswer.pathSegment(address))&tag=%2A"
            return OutboundHTTP.Request(
                method: "POST", url: baseURL + path, headers: headers, body: Array(form.utf8))
        case .remove:
            return OutboundHTTP.Request(
                method: "DELETE", url: baseURL + path + "/" + SuppressionAnswer.pathSegment(address),
                headers: headers)
        }
    }

    /// `GET /v3/{domain}/unsubscribes/{address}`: 200 when listed, 404 when not.
    public func lookup(address: String) -> OutboundHTTP.Request {
        OutboundHTTP.Request(
            method: "GET",
            url: baseURL + "/v3/\(SuppressionAnswer.pathSegment(domain))/unsubscribes/"
                + SuppressionAnswer.pathSegment(address),
            headers: [.init("Authorization", "Basic " + Data("api:\(apiKey)".utf8).base64EncodedString())])
    }

    public func listed(_ response: OutboundHTTP.Response) -> Bool? {
        switch response.status {
        case 200: true
        case 404: false
        default: nil
        }
    }
}
