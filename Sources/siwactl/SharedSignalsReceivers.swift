import Foundation
import Postgres
import ServiceSupport
import SharedSignals
import SharedSignalsAdministration

/// `siwactl ssf receivers`: the OAuth clients of the transmitter API (client credentials).
extension SharedSignalsVerb {
    static let receiversVerb = Verb(
        name: "receivers",
        abstract: "Add, list or remove the receivers allowed to use the Shared Signals API.",
        subverbs: [
            .parsing("add", receiversAddSpec) { parsed, _ in try addReceiver(parsed) },
            .parsing("list", receiversListSpec) { parsed, _ in try listReceivers(parsed) },
            .parsing("remove", receiversRemoveSpec) { parsed, _ in try removeReceiver(parsed) },
        ])

    static let receiversAddSpec = CommandSpec(
        name: "siwactl ssf receivers add",
        abstract: """
            Register a receiver NAME as an OAuth 2.0 client of the Shared Signals API (POST /ssf/token,
            client credentials). Prints its client_id and client_secret once: the database keeps only a
            salted SHA-256 of the secret.
            """,
        options: [
            .databaseURL,
            CommandOption(
                "scopes", valueName: "SCOPE,…", help: "ssf.manage (change streams), ssf.read (read, poll).",
                defaultValue: "ssf.manage,ssf.read"),
            CommandOption(
                "audience", valueName: "AUD", help: "The aud of its streams' SETs (default: the client_id)."),
        ], positionals: [CommandPositional("NAME", help: "The receiver's name (letters, digits, . _ -).")])

    static let receiversListSpec = CommandSpec(
        name: "siwactl ssf receivers list", abstract: "List the receivers (never a secret).",
        options: [.databaseURL])

    static let receiversRemoveSpec = CommandSpec(
        name: "siwactl ssf receivers remove",
        abstract: "Remove a receiver, its tokens, its streams and their SETs.",
        options: [.databaseURL], positionals: [CommandPositional("NAME", help: "The receiver's name.")])

    static func addReceiver(_ parsed: ParsedCommand) throws {
        guard let name = parsed.positionals.first,
            name.range(of: "^[A-Za-z0-9._-]{1,64}$", options: .regularExpression) != nil
        else { throw UsageError("NAME: 1 to 64 letters, digits, '.', '_' or '-'") }
        let scopes = (parsed.value("scopes") ?? "ssf.manage,ssf.read").split(separator: ",").map {
            $0.trimmingCharacters(in: .whitespaces)
        }
        guard !scopes.isEmpty, scopes.allSatisfy({ $0 == "ssf.manage" || $0 == "ssf.read" }) else {
            throw UsageError("--scopes: ssf.manage and/or ssf.read")
        }
        let clientID = ReceiverCredentials.newClientID()
        let secret = ReceiverCredentials.newSecret()
        let salt = ReceiverCredentials.newSalt()
        let connection = try connect(parsed)
        defer { connection.close() }
        try database("adding the receiver") {
            try SharedSignalsAdministration(connection).addReceiver(
                name: name, clientID: clientID, salt: salt,
                secretHash: ReceiverCredentials.secretHash(secret, salt: salt),
                scopes: Array(Set(scopes)).sorted(),
                audience: parsed.value("audience") ?? clientID)
        }
        writeStandardOutput(
            "receiver \(name)\nclient_id: \(clientID)\nclient_secret: \(secret)\n"
                + "(the secret is shown only now: the database keeps a salted hash)\n")
    }

    static func listReceivers(_ parsed: ParsedCommand) throws {
        let connection = try connect(parsed)
        defer { connection.close() }
        let receivers = try database("reading the receivers") {
            try SharedSignalsAdministration(connection).receivers()
        }
        let rows = receivers.map {
            [$0.name, $0.clientID, $0.scopes, $0.audience, String($0.streams), String($0.liveTokens)]
        }
        writeStandardOutput(
            renderTable(
                header: ["name", "client_id", "scopes", "audience", "streams", "live tokens"], rows: rows))
    }

    static func removeReceiver(_ parsed: ParsedCommand) throws {
        guard let name = parsed.positionals.first else { throw UsageError("NAME: the receiver's name") }
        let connection = try connect(parsed)
        defer { connection.close() }
        let removed = try database("removing the receiver") {
            try SharedSignalsAdministration(connection).removeReceiver(name: name)
        }
        guard removed else { throw ToolFailure("no receiver \(name)") }
        writeStandardOutput("receiver \(name): removed\n")
    }
}
