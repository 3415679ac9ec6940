/// An ordered list of HTTP header fields with case-insensitive lookup by name.
public struct HTTPHeaders: Sendable, Equatable, Sequence, ExpressibleByDictionaryLiteral {
    /// One header field as it appeared (or will appear) on the wire.
    public struct Field: Sendable, Equatable {
        public var name: String
        public var value: String

        public init(name: String, value: String) {
            self.name = name
            self.value = value
        }
    }

    /// The fields in order; a name may repeat.
    public private(set) var fields: [Field]

    /// Creates headers from `(name, value)` pairs, keeping their order.
    public init(_ pairs: [(String, String)] = []) {
        fields = pairs.map { Field(name: $0.0, value: $0.1) }
    }

    /// Creates headers from fields as they stand.
    init(fields: [Field]) {
        self.fields = fields
    }

    public init(dictionaryLiteral elements: (String, String)...) {
        self.init(elements)
    }

    /// The first value for `name` (compared case-insensitively), or `nil`.
    public subscript(name: String) -> String? {
        let wanted = name.lowercased()
        return fields.first { $0.name.lowercased() == wanted }?.value
    }

    /// Every value for `name` (compared case-insensitively), in order.
    public func values(for name: String) -> [String] {
        let wanted = name.lowercased()
        return fields.filter { $0.name.lowercased() == wanted }.map(\.value)
    }

    /// Appends a field, keeping any existing ones with the same name.
    public mutating func add(name: String, value: String) {
        fields.append(Field(name: name, value: value))
    }

    /// Replaces every field named `name` (case-insensitively) with a single one.
    public mutating func replaceOrAdd(name: String, value: String) {
        let wanted = name.lowercased()
        fields.removeAll { $0.name.lowercased() == wanted }
        fields.append(Field(name: name, value: value))
    }

    /// Whether a field named `name` is present (case-insensitively).
    public func contains(_ name: String) -> Bool {
        self[name] != nil
    }

    public var count: Int { fields.count }

    public func makeIterator() -> IndexingIterator<[Field]> {
        fields.makeIterator()
    }
}
