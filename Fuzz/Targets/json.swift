import Foundation

// libFuzzer target: the strict JSON parser. Whatever it accepts must survive a round trip through a
// plain serialiser, and must respect the depth bound.
@testable import AppleNotifications

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzJSON(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let input = Data(UnsafeBufferPointer(start: data, count: size))
    guard let value = try? JSONParser.parse(input) else { return 0 }
    guard depth(of: value) <= JSONParser.maximumDepth else { fatalError("nesting beyond the bound") }
    var text = ""
    serialise(value, into: &text)
    guard let again = try? JSONParser.parse(Data(text.utf8)) else { fatalError("re-serialised JSON refused") }
    guard again == value else { fatalError("round trip changed the value") }
    return 0
}

private func depth(of value: JSONValue) -> Int {
    switch value {
    case .array(let elements): 1 + (elements.map(depth(of:)).max() ?? 0)
    case .object(let members): 1 + (members.values.map(depth(of:)).max() ?? 0)
    default: 0
    }
}

private func serialise(_ value: JSONValue, into text: inout String) {
    switch value {
    case .null: text += "null"
    case .bool(let flag): text += flag ? "true" : "false"
    case .number(let number): text += number.description
    case .string(let string): quote(string, into: &text)
    case .array(let elements):
        text += "["
        for (offset, element) in elements.enumerated() {
            if offset > 0 { text += "," }
            serialise(element, into: &text)
        }
        text += "]"
    case .object(let members):
        text += "{"
        for (offset, (name, member)) in members.enumerated() {
            if offset > 0 { text += "," }
            quote(name, into: &text)
            text += ":"
            serialise(member, into: &text)
        }
        text += "}"
    }
}

private func quote(_ string: String, into text: inout String) {
    text += "\""
    for scalar in string.unicodeScalars {
        switch scalar {
        case "\"": text += "\\\""
        case "\\": text += "\\\\"
        case _ where scalar.value < 0x20:
            text +=
                "\\u" + String(repeating: "0", count: 4 - String(scalar.value, radix: 16).count)
                + String(scalar.value, radix: 16)
        default: text.unicodeScalars.append(scalar)
        }
    }
    text += "\""
}
