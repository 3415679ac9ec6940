import MailGate
import Testing

@Suite("PolicyReader: Postfix policy requests from a connection's bytes")
struct PolicyReaderTests {
    /// Feeds `text` and returns every outcome until the reader needs more.
    func outcomes(_ text: String, into reader: inout PolicyReader) -> [Result<PolicyRequest, PolicyRefusal>] {
        reader.feed(Array(text.utf8))
        var all: [Result<PolicyRequest, PolicyRefusal>] = []
        while let next = reader.next() {
            all.append(next)
            if case .failure = next { break }
        }
        return all
    }

    @Test("several requests in one read come out one by one, in order, with their attributes")
    func severalInOneRead() throws {
        var reader = PolicyReader()
        let text =
            "request=smtpd_access_policy\nprotocol_state=RCPT\nrecipient=a@x\n\n"
            + "protocol_state=DATA\nrecipient=b@x\nsasl_username=\n\n"
        let all = outcomes(text, into: &reader)
        #expect(all.count == 2)
        let first = try all[0].get()
        #expect(first.protocolState == "RCPT" && first.recipient == "a@x")
        #expect(first.attributes["request"] == "smtpd_access_policy")
        let second = try all[1].get()
        #expect(second.protocolState == "DATA" && second.recipient == "b@x")
        #expect(second.attributes["sasl_username"] == "")
        #expect(reader.isIdle)
    }

    @Test("a request arriving a byte at a time is complete only at its empty line")
    func byteByByte() throws {
        var reader = PolicyReader()
        let text = Array("protocol_state=RCPT\nrecipient=x=y@z\n\n".utf8)
        for byte in text.dropLast() {
            reader.feed([byte])
            let next = reader.next()
            #expect(next == nil)
        }
        reader.feed([text.last!])
        let next = reader.next()
        let request = try #require(next).get()
        #expect(request.recipient == "x=y@z")  // the first '=' splits name from value
        let after = reader.next()
        #expect(after == nil)
    }

    @Test(
        "a line that is not name=value is malformed",
        arguments: ["recipient\n", "=value\n", "recipient=a\u{0}b\n"])
    func malformedLine(line: String) {
        var reader = PolicyReader()
        #expect(outcomes("protocol_state=RCPT\n" + line + "\n", into: &reader).last == .failure(.malformed))
    }

    @Test("bytes that are not UTF-8 are malformed")
    func notUTF8() {
        var reader = PolicyReader()
        reader.feed(Array("recipient=".utf8) + [0xff, 0xfe] + Array("\n\n".utf8))
        let next = reader.next()
        #expect(next == .failure(.malformed))
    }

    @Test("a request over the byte bound is refused before its end arrives, and one over the attribute bound")
    func oversized() {
        var bytes = PolicyReader(maximumBytes: 1024)
        #expect(
            outcomes("recipient=" + String(repeating: "a", count: 2000), into: &bytes) == [
                .failure(.oversized)
            ])
        var lines = PolicyReader(maximumAttributes: 200)
        let many = (0..<201).map { "name\($0)=value\n" }.joined()
        #expect(outcomes(many, into: &lines) == [.failure(.oversized)])
        var exactly = PolicyReader(maximumAttributes: 200)
        let enough = (0..<200).map { "name\($0)=value\n" }.joined() + "\n"
        #expect(outcomes(enough, into: &exactly).count == 1)
    }
}
