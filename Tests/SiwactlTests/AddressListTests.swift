import RelayMail
import Testing

@Suite("AddressList: the lists siwactl mail check reads")
struct AddressListTests {
    @Test("one address per line: white space and CR dropped, empty lines skipped, duplicates kept")
    func lines() {
        #expect(
            AddressList.lines("a@b.c\r\n\n  d@e.f \n\t\na@b.c") == ["a@b.c", "d@e.f", "a@b.c"])
        #expect(AddressList.lines("") == [])
    }

    @Test("a CSV column by position or header name; quotes, doubled quotes, commas and line breaks inside")
    func csv() throws {
        let text = [
            #"id,email,"note, with comma"\#r"#, #"1, a@b.c ,"x ""y"""\#r"#, #"2,"d,e@f.g","two"#, #"lines""#,
            "3", "\r", "4,h@i.j",
        ].joined(separator: "\n")
        #expect(try AddressList.csv(text, column: .name("email")) == ["a@b.c", "d,e@f.g", nil, "h@i.j"])
        #expect(try AddressList.csv(text, column: .position(3)) == ["x \"y\"", "two\nlines", nil, nil])
        #expect(AddressList.Column("2") == .position(2))
        #expect(AddressList.Column("0") == .name("0"))
        #expect(AddressList.Column("email") == .name("email"))
        #expect(throws: AddressList.ListError.self) { try AddressList.csv(text, column: .position(4)) }
        #expect(throws: AddressList.ListError.self) { try AddressList.csv(text, column: .name("mail")) }
        #expect(throws: AddressList.ListError.self) { try AddressList.csv("a\n\"open", column: .position(1)) }
        #expect(try AddressList.csv("\u{FEFF}email\na@b.c", column: .name("email")) == ["a@b.c"])
        #expect(AddressList.lines("\u{FEFF}a@b.c") == ["a@b.c"])
        #expect(try AddressList.csv("", column: .position(1)) == [])
        #expect(try AddressList.csv("email", column: .name("email")) == [])
    }
}
