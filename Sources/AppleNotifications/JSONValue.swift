import Foundation

/// A parsed JSON value; internal so callers only ever see typed results.
enum JSONValue: Sendable, Equatable, Decodable {
    case null
    case bool(Bool)
    case number(Double)
    case string(String)
    case array([JSONValue])
    case object([String: JSONValue])

    init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if container.decodeNil() {
            self = .null
        } else if let value = try? container.decode(Bool.self) {
            self = .bool(value)
        } else if let value = try? container.decode(Double.self) {
            self = .number(value)
        } else if let value = try? container.decode(String.self) {
            self = .string(value)
        } else if let value = try? container.decode([JSONValue].self) {
            self = .array(value)
        } else {
            self = .object(try container.decode([String: JSONValue].self))
        }
    }

    /// Parses bytes that must hold a JSON object.
    static func object(from data: Data, what: String) throws(NotificationError) -> [String: JSONValue] {
        let value: JSONValue
        do {
            value = try JSONDecoder().decode(JSONValue.self, from: data)
        } catch {
            throw .malformed(.badJSON, "\(what) is not JSON")
        }
        guard case .object(let object) = value else { throw .malformed(.badJSON, "\(what) is not a JSON object") }
        return object
    }

    var stringValue: String? {
        if case .string(let value) = self { value } else { nil }
    }
}
