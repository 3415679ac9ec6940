import Foundation
import Postgres
import ServiceSupport
import SharedSignals
import SharedSignalsAdministration
import Webhooks

/// `siwactl ssf streams`: push streams to Shared Signals receivers, until the SSF management API exists.
extension SharedSignalsVerb {
    static let streamsVerb = Verb(
        name: "streams", abstract: "Add, list, pause, resume or remove Shared Signals push streams.",
        subverbs: [
            .parsing("add", addSpec) { parsed, _ in try add(parsed) },
            .parsing("list", listSpec) { parsed, _ in try list(parsed) },
            .parsing("pause", statusSpec("pause")) { parsed, _ in try setStatus(parsed, .paused) },
            .parsing("resume", statusSpec("resume")) { parsed, _ in try setStatus(parsed, .enabled) },
            .parsing("disable", statusSpec("disable")) { parsed, _ in try setStatus(parsed, .disabled) },
            .parsing("remove", statusSpec("remove")) { parsed, _ in try remove(parsed) },
        ])

    static let addSpec = CommandSpec(
        name: "siwactl ssf streams add",
        abstract: """
            Add a push stream (RFC 8935): SETs for AUD POSTed to URL. The Authorization header the receiver
            expects is read by the worker from FILE at send time (--authorization-file): it is never stored
            in the database. Prints the stream's id.
            """,
        options: [
            .databaseURL,
            CommandOption("receiver", valueName: "NAME", help: "A name for the receiver.", isRequired: true),
            CommandOption("audience", valueName: "AUD", help: "The SETs' aud.", isRequired: true),
            CommandOption("url", valueName: "URL", help: "The receiver's push endpoint.", isRequired: true),
            CommandOption(
                "authorization-file", valueName: "FILE",
                help: "Absolute path of the file holding the Authorization header's value (default: none)."),
            CommandOption(
                "events", valueName: "URI,…",
                help:
                    "Only these event types (default: all): \(SecurityEventToken.EventType.all.joined(separator: ", "))."
            ),
        ])

    static let listSpec = CommandSpec(
        name: "siwactl ssf streams list", abstract: "List the push streams with their SET counts.",
        options: [.databaseURL])

    static func statusSpec(_ verb: String) -> CommandSpec {
        CommandSpec(
            name: "siwactl ssf streams \(verb)",
            abstract: verb == "pause"
                ? "Pause a stream: its SETs are kept, in order, and pushed after resume."
                : verb == "resume"
                    ? "Resume (enable) a stream."
                    : verb == "disable"
                        ? "Disable a stream: no new SETs; pending ones wait."
                        : "Remove a stream and its SETs.",
            options: [
                .databaseURL,
                CommandOption("stream", valueName: "ID", help: "The stream's id.", isRequired: true),
            ])
    }

    static func add(_ parsed: ParsedCommand) throws {
        let url = parsed.value("url") ?? ""
        // The webhooks' rule: https, or http to a loopback IP literal.
        if let problem = StandardWebhooks.endpointProblem(url) { throw UsageError("--url: \(problem)") }
        var reference: String?
        if let file = parsed.value("authorization-file") {
            guard file.hasPrefix("/") else { throw UsageError("--authorization-file: an absolute path") }
            reference = "file:" + file
        }
        let events = parsed.value("events").map { $0.split(separator: ",").map(String.init) }
        let connection = try connect(parsed)
        defer { connection.close() }
        let id = try database("adding the stream") {
            try SharedSignalsAdministration(connection).addStream(
                receiver: parsed.value("receiver")!, audience: parsed.value("audience")!, endpointURL: url,
                authorizationReference: reference, events: events)
        }
        writeStandardOutput("stream \(id): \(url)\n")
    }

    static func list(_ parsed: ParsedCommand) throws {
        let connection = try connect(parsed)
        defer { connection.close() }
        let streams = try database("reading the streams") {
            try SharedSignalsAdministration(connection).streams()
        }
        let rows = streams.map {
            [
                String($0.id), $0.receiver, $0.audience, $0.endpointURL, $0.status,
                String($0.hasAuthorization),
                String($0.pending), String($0.delivered), String($0.failed),
            ]
        }
        writeStandardOutput(
            renderTable(
                header: [
                    "id", "receiver", "audience", "url", "status", "authorization", "pending", "delivered",
                    "failed",
                ],
                rows: rows))
    }

    static func setStatus(
        _ parsed: ParsedCommand, _ status: SharedSignalsAdministration.StreamStatus
    ) throws {
        let stream = try streamID(parsed)
        let connection = try connect(parsed)
        defer { connection.close() }
        let found = try database("setting the stream's status") {
            try SharedSignalsAdministration(connection).setStatus(stream: Int64(stream), status)
        }
        guard found else { throw ToolFailure("no stream \(stream)") }
        writeStandardOutput("stream \(stream): \(status.rawValue)\n")
    }

    static func remove(_ parsed: ParsedCommand) throws {
        let stream = try streamID(parsed)
        let connection = try connect(parsed)
        defer { connection.close() }
        let removed = try database("removing the stream") {
            try SharedSignalsAdministration(connection).removeStream(Int64(stream))
        }
        guard removed else { throw ToolFailure("no stream \(stream)") }
        writeStandardOutput("stream \(stream): removed\n")
    }

    private static func streamID(_ parsed: ParsedCommand) throws -> Int {
        guard let id = parsed.value("stream").flatMap({ Int($0) }), id > 0 else {
            throw UsageError("--stream: a stream's id")
        }
        return id
    }
}
