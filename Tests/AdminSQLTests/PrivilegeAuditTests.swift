import Foundation
import Postgres
import TestSupport
import Testing

/// A static audit of the schema's grants: a SECURITY INVOKER function runs with its caller's rights and
/// a trigger with those of the role whose write fired it, so every relation such a function reads or
/// writes (and every function it calls, and every trigger its writes fire) must be allowed to each role
/// that may call it or fire it. A gap is an error at the first event that reaches the statement
/// (42501), which is how turning Shared Signals on once stopped every notification.
@Suite("Privilege audit: each role may touch what its functions and triggers touch")
struct PrivilegeAuditTests {
    /// The group roles of schema/80-roles.sql.
    static let roles = [
        "siwa_admin", "siwa_receiver", "siwa_worker", "siwa_signin", "siwa_app", "siwa_webhook_admin",
        "siwa_mail", "siwa_bounce", "siwa_ssf",
    ]

    struct Function {
        var name: String
        var securityDefiner: Bool
        var body: String
    }

    struct Trigger {
        var table: String
        var function: UInt32
        /// INSERT, UPDATE or DELETE.
        var events: [String]
    }

    /// What a body does: the relations it reads or writes (with the privilege each needs), the
    /// functions it calls.
    struct Access {
        var relations: [(relation: String, privilege: String)] = []
        var calls: [String] = []
    }

    /// Reads `body` (comments and string literals removed) for its `siwa.` names.
    static func access(of body: String, relations: Set<String>) -> Access {
        var text = body.lowercased()
        text = text.replacing(/--[^\n]*/, with: "")
        text = text.replacing(/\/\*[\s\S]*?\*\//, with: "")
        text = text.replacing(/'(?:[^']|'')*'/, with: "''")
        var access = Access()
        for match in text.matches(of: /(insert\s+into|update(?:\s+only)?|delete\s+from)\s+siwa\.(\w+)/) {
            let verb = String(match.output.1)
            let privilege =
                verb.hasPrefix("insert") ? "INSERT" : verb.hasPrefix("update") ? "UPDATE" : "DELETE"
            access.relations.append((String(match.output.2), privilege))
        }
        for match in text.matches(of: /(::\s*)?siwa\.(\w+)(\s*\(|\s*%|\s*\[)?/) {
            let name = String(match.output.2)
            if let follower = match.output.3 {
                if follower.hasSuffix("(") { access.calls.append(name) }
                continue  // a call, or a type (%ROWTYPE, an array of a row type)
            }
            guard match.output.1 == nil, relations.contains(name) else { continue }
            access.relations.append((name, "SELECT"))
        }
        return access
    }

    @Test("every relation and function reached by a role's functions and triggers is granted to the role")
    func audit() throws {
        let database = try TestDatabase()
        var functions: [UInt32: Function] = [:]
        for row in try database.query(
            """
            SELECT p.oid::bigint, p.proname::text, p.prosecdef,
                   CASE WHEN p.prosrc = '' THEN pg_get_functiondef(p.oid) ELSE p.prosrc END
              FROM pg_proc p WHERE p.pronamespace = 'siwa'::regnamespace AND p.prokind = 'f'
            """)
        {
            functions[UInt32(try row[0, as: Int.self])] = Function(
                name: try row[1], securityDefiner: try row[2], body: try row[3])
        }
        let relations = Set(
            try database.query(
                """
                SELECT c.relname::text FROM pg_class c
                 WHERE c.relnamespace = 'siwa'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
                """
            ).map { row throws -> String in try row[0] })
        let triggers = try database.query(
            """
            SELECT c.relname::text, t.tgfoid::bigint, t.tgtype::integer FROM pg_trigger t
              JOIN pg_class c ON c.oid = t.tgrelid
             WHERE NOT t.tgisinternal AND c.relnamespace = 'siwa'::regnamespace
            """
        ).map { row throws -> Trigger in
            let type: Int = try row[2]
            let events = [(4, "INSERT"), (8, "DELETE"), (16, "UPDATE")].filter { type & $0.0 != 0 }.map(\.1)
            return Trigger(table: try row[0], function: UInt32(try row[1, as: Int.self]), events: events)
        }
        // What each role may do with each relation and function, from the catalog's own checks.
        var allowed: Set<String> = []
        for row in try database.query(
            """
            SELECT r.rolname::text, c.relname::text, p.privilege
              FROM pg_roles r, pg_class c, unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE']) AS p(privilege)
             WHERE r.rolname = ANY ('{\(Self.roles.joined(separator: ","))}'::text[]) AND c.relnamespace = 'siwa'::regnamespace
               AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
               AND CASE p.privilege WHEN 'DELETE' THEN has_table_privilege(r.oid, c.oid, 'DELETE')
                   ELSE has_any_column_privilege(r.oid, c.oid, p.privilege) END
            """)
        {
            allowed.insert(
                "\(try row[0, as: String.self]) \(try row[2, as: String.self]) \(try row[1, as: String.self])"
            )
        }
        for row in try database.query(
            """
            SELECT r.rolname::text, p.proname::text FROM pg_roles r, pg_proc p
             WHERE r.rolname = ANY ('{\(Self.roles.joined(separator: ","))}'::text[]) AND p.pronamespace = 'siwa'::regnamespace
               AND has_function_privilege(r.oid, p.oid, 'EXECUTE')
            """)
        {
            allowed.insert("\(try row[0, as: String.self]) EXECUTE \(try row[1, as: String.self])")
        }
        // The functions granted to each role by name (not through PUBLIC), and the triggers its writes fire.
        var entries: [(role: String, function: UInt32, via: String)] = []
        for row in try database.query(
            """
            SELECT r.rolname::text, p.oid::bigint FROM pg_proc p, aclexplode(p.proacl) a, pg_roles r
             WHERE p.pronamespace = 'siwa'::regnamespace AND r.oid = a.grantee AND r.rolname = ANY ('{\(Self.roles.joined(separator: ","))}'::text[])
               AND a.privilege_type = 'EXECUTE'
            """)
        {
            let function = UInt32(try row[1, as: Int.self])
            entries.append((try row[0], function, "calls siwa.\(functions[function]?.name ?? "?")"))
        }
        for role in Self.roles {
            for trigger in triggers
            where trigger.events.contains(where: { allowed.contains("\(role) \($0) \(trigger.table)") }) {
                entries.append((role, trigger.function, "writes siwa.\(trigger.table)"))
            }
        }

        var gaps: Set<String> = []
        for entry in entries {
            var seen: Set<UInt32> = []
            var stack = [(entry.function, "\(entry.role) \(entry.via)")]
            while let (oid, path) = stack.popLast() {
                guard seen.insert(oid).inserted, let function = functions[oid], !function.securityDefiner
                else { continue }
                let access = Self.access(of: function.body, relations: relations)
                for (relation, privilege) in access.relations
                where !allowed.contains("\(entry.role) \(privilege) \(relation)") {
                    gaps.insert("\(path) → siwa.\(function.name) needs \(privilege) on siwa.\(relation)")
                }
                for (relation, privilege) in access.relations where privilege != "SELECT" {
                    for trigger in triggers
                    where trigger.table == relation && trigger.events.contains(privilege) {
                        stack.append(
                            (trigger.function, "\(path) → siwa.\(function.name) writes siwa.\(relation)"))
                    }
                }
                for name in Set(access.calls) {
                    let callees = functions.filter { $0.value.name == name }
                    guard !callees.isEmpty else { continue }  // not a function: a type's name
                    if !allowed.contains("\(entry.role) EXECUTE \(name)") {
                        gaps.insert("\(path) → siwa.\(function.name) needs EXECUTE on siwa.\(name)")
                    }
                    for callee in callees.keys { stack.append((callee, "\(path) → siwa.\(function.name)")) }
                }
            }
        }
        #expect(gaps.sorted() == [], "\(gaps.sorted().joined(separator: "\n"))")
    }
}
