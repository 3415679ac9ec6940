import Foundation
import Postgres
import SharedSignalsAdministration
import TestSupport
import Testing

@Suite("SharedSignalsAdministration: siwactl ssf's calls, each write a siwa.* function")
struct SharedSignalsAdministrationTests {
    @Test("receivers: add, list with counts, remove (false when unknown)")
    func receivers() throws {
        let connection = try AdminDatabase.make().connectAsOwner()
        defer { connection.close() }
        let administration = SharedSignalsAdministration(connection)
        try administration.addReceiver(
            name: "okta", clientID: "cid", salt: Data(count: 16), secretHash: Data(count: 32),
            scopes: ["ssf.manage", "ssf.read"], audience: "aud")
        #expect(
            try administration.receivers().map { [$0.name, $0.clientID, $0.scopes, $0.audience] }
                == [["okta", "cid", "ssf.manage,ssf.read", "aud"]])
        #expect(try administration.receivers().map { [$0.streams, $0.liveTokens] } == [[0, 0]])
        #expect(try administration.removeReceiver(name: "okta"))
        #expect(try !administration.removeReceiver(name: "okta"))
        #expect(try administration.receivers().isEmpty)
    }

    @Test("streams: add, list, status, remove (false when unknown)")
    func streams() throws {
        let connection = try AdminDatabase.make().connectAsOwner()
        defer { connection.close() }
        let administration = SharedSignalsAdministration(connection)
        let id = try administration.addStream(
            receiver: "r", audience: "aud", endpointURL: "https://example.com/ssf",
            authorizationReference: "file:/etc/ssf", events: nil)
        var listed = try administration.streams()
        #expect(listed.map(\.id) == [id])
        #expect(listed.first?.status == "enabled")
        #expect(listed.first?.hasAuthorization == true)
        #expect(try administration.setStatus(stream: Int64(id), .paused))
        listed = try administration.streams()
        #expect(listed.first?.status == "paused")
        #expect(try !administration.setStatus(stream: Int64(id) + 1, .enabled))
        #expect(try administration.removeStream(Int64(id)))
        #expect(try !administration.removeStream(Int64(id)))
        #expect(try administration.streams().isEmpty)
    }
}
