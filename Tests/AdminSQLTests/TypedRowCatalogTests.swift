import AuthAdapterAdministration
import AuthAdapters
import Foundation
import Postgres
import RelayMail
import SharedSignalsAdministration
import TestSupport
import Testing

@testable import Doctor
@testable import Revoker
@testable import ServiceHealth
@testable import SignIn
@testable import SignalDelivery
@testable import Suppressions
@testable import WebhookAdministration
@testable import WebhookDelivery
@testable import Worker

/// Every typed row the modules read, each checked against the schema here.
private let rowTypes: [any PostgresRowDecodable.Type] = [
    Doctor.Heartbeat.self, Doctor.Activity.self, Doctor.ClientIDUse.self,
    ServiceHealth.Snapshot.self, RoleStanding.self, QueueHealth.self,
    WebhookAdministration.Endpoint.self, WebhookAdministration.Delivery.self,
    WebhookAdministration.DeliveryTotals.self, WebhookAdministration.EndpointStats.self,
    SignInAnswer.self,
    ClaimedNotification.self, ProcessedNotification.self, DueNotification.self, BusyUsers.self,
    ClaimedDelivery.self, RevocationClaim.self, RefreshCheckClaim.self,
    RelayMailDecision.self, RelayMailSingleDecision.self, ClaimedSET.self, ClaimedSuppression.self,
    ClaimedAdapterEvent.self, AuthAdapterAdministration.AdapterOverview.self,
    SharedSignalsAdministration.ReceiverOverview.self, SharedSignalsAdministration.StreamOverview.self,
]

@Suite("Typed rows: every statement's columns, as schema.sql gives them, are those its row type reads")
struct TypedRowCatalogTests {
    @Test("each row type's statement, described on a fresh schema, returns the declared names and types")
    func columnsMatchTheSchema() throws {
        let connection = try AdminDatabase.make().connectAsOwner()
        for type in rowTypes {
            let described = try connection.describe(type.statement)
            #expect(described == type.columns, "\(type): the schema gives \(described)")
        }
    }

    @Test("the list above holds every type in Sources/ that declares itself a typed row")
    func listIsComplete() throws {
        let sources = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
            .deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent("Sources")
        let declaration = #/(?:struct|extension|class|enum)\s+([\w.]+)\s*:[^{]*\bPostgresRowDecodable\b/#
        var declared = Set<String>()
        let files = FileManager.default.enumerator(atPath: sources.path)?.compactMap { $0 as? String } ?? []
        for file in files where file.hasSuffix(".swift") && !file.hasPrefix("Postgres/") {
            let text = try String(contentsOf: sources.appendingPathComponent(file), encoding: .utf8)
            for match in text.matches(of: declaration) {
                declared.insert(String(match.1.split(separator: ".").last ?? match.1))
            }
        }
        #expect(!declared.isEmpty)
        #expect(declared == Set(rowTypes.map { String(describing: $0) }))
    }
}
