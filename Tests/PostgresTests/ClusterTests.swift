import Foundation
import Postgres
import TestSupport
import Testing

@Suite("The test clusters' PostgreSQL")
struct ClusterTests {
    @Test(
        "the server is the one found: its major version is its bin directory's, and it runs inside POSTGRES_CLUSTER_CHROOT when that is set"
    )
    func serverIsTheOneFound() throws {
        let cluster = try PostgresCluster.shared
        let connection = try freshConnection()
        defer { connection.close() }
        let row = try connection.query(
            "SELECT current_setting('server_version_num')::integer / 10000, pg_backend_pid()")[0]
        let major = try row[0, as: Int.self]
        // Debian's layout, /usr/lib/postgresql/MAJOR/bin (other builds name no version).
        let components = cluster.binDirectory.split(separator: "/")
        if components.count > 2, let version = Int(components[components.count - 2]) {
            #expect(version == major, "\(cluster.binDirectory) runs PostgreSQL \(major)")
        }
        #expect(major >= 15)
        // A backend's root directory is its postmaster's, the root it was started in (readable as root).
        guard geteuid() == 0 else { return }
        let pid = try row[1, as: Int.self]
        let root = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/root")
        #expect(root == (PostgresCluster.toolRoot ?? "/"))
    }
}
