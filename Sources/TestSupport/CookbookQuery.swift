public import Foundation

/// One ```sql block of docs/sql.md and the heading it sits under.
public struct CookbookQuery: Sendable, CustomStringConvertible {
    /// The `## ` heading the block sits under.
    public let heading: String
    /// The block's SQL.
    public let sql: String

    public var description: String { heading }

    /// A cookbook that cannot be read or holds no query: the tests fail instead of running over nothing.
    public struct Unreadable: Error, CustomStringConvertible {
        public let description: String
    }

    private static let loaded = Result {
        try load(RepositoryRoot.url.appendingPathComponent("docs/sql.md"))
    }

    /// Every ```sql block of docs/sql.md, in order; throws when there is none.
    public static func all() throws -> [CookbookQuery] { try loaded.get() }

    /// The ```sql blocks of the Markdown file at `url`; throws when it is missing or has none.
    public static func load(_ url: URL) throws -> [CookbookQuery] {
        let queries = try parse(String(contentsOf: url, encoding: .utf8))
        guard !queries.isEmpty else { throw Unreadable(description: "\(url.path) has no ```sql block") }
        return queries
    }

    /// The ```sql blocks of `markdown`; throws on a block that is never closed.
    public static func parse(_ markdown: String) throws -> [CookbookQuery] {
        var queries: [CookbookQuery] = []
        var heading = ""
        var block: [Substring]? = nil
        for line in markdown.split(separator: "\n", omittingEmptySubsequences: false) {
            if var lines = block {
                if line.hasPrefix("```") {
                    queries.append(CookbookQuery(heading: heading, sql: lines.joined(separator: "\n")))
                    block = nil
                } else {
                    lines.append(line)
                    block = lines
                }
            } else if line.hasPrefix("## ") {
                heading = String(line.dropFirst(3))
            } else if line == "```sql" {
                block = []
            }
        }
        if block != nil {
            throw Unreadable(description: "the ```sql block under \"\(heading)\" is not closed")
        }
        return queries
    }

    /// The query under `heading`; throws when there is none.
    public static func under(_ heading: String) throws -> CookbookQuery {
        guard let query = try all().first(where: { $0.heading == heading }) else {
            throw Unreadable(description: "docs/sql.md has no query under \"\(heading)\"")
        }
        return query
    }

    /// The SQL with each psql variable `:'name'` replaced by `values[name]` as a quoted literal.
    public func substituting(_ values: [String: String]) throws -> String {
        var result = ""
        var rest = Substring(sql)
        while let start = rest.range(of: ":'") {
            result += rest[..<start.lowerBound]
            let afterQuote = rest[start.upperBound...]
            guard let end = afterQuote.firstIndex(of: "'") else {
                throw Unreadable(description: "unterminated :'variable' in \(heading)")
            }
            let name = String(afterQuote[..<end])
            guard let value = values[name] else {
                throw Unreadable(description: "no test value for :'\(name)' in \(heading)")
            }
            result += "'" + value.replacingOccurrences(of: "'", with: "''") + "'"
            rest = afterQuote[afterQuote.index(after: end)...]
        }
        return result + rest
    }
}
