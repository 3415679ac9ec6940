import HTTPServer
import Testing

@Suite("HTTPHeaders")
struct HTTPHeadersTests {
    @Test(
        "lookup ignores case and returns the first value",
        arguments: ["content-type", "CONTENT-TYPE", "Content-Type"])
    func caseInsensitive(name: String) {
        let headers: HTTPHeaders = ["Content-Type": "application/json", "content-type": "text/plain"]

        #expect(headers[name] == "application/json")
        #expect(headers.values(for: name) == ["application/json", "text/plain"])
    }

    @Test("replaceOrAdd leaves exactly one field of that name")
    func replace() {
        var headers: HTTPHeaders = ["X-A": "1", "x-a": "2", "X-B": "3"]

        headers.replaceOrAdd(name: "X-A", value: "9")

        #expect(headers.values(for: "x-a") == ["9"])
        #expect(headers["X-B"] == "3")
        #expect(headers.count == 2)
    }

    @Test("a missing header is nil")
    func missing() {
        let headers: HTTPHeaders = ["A": "1"]
        #expect(headers["B"] == nil)
        #expect(!headers.contains("B"))
    }
}
