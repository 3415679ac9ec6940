public import Foundation
public import Postgres
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// A throwaway PostgreSQL server for tests: `initdb` into a fresh directory under /tmp, a unix socket
/// there (and 127.0.0.1 only when started with `tcp: true`), `fsync=off` (commits still survive an
/// immediate stop).
///
/// Use `PostgresCluster.shared` (started once per test process) with one `createDatabase()` per test;
/// suites that stop the server make their own with `PostgresCluster.start()`. Every cluster is shut
/// down (immediate mode) and its directory removed when the process exits; clusters left behind by a
/// crashed test process are removed by the next one.
public final class PostgresCluster: Sendable {
    /// How `stop(mode:)` shuts the server down.
    public struct StopMode: Sendable, Hashable, CustomStringConvertible {
        let name: String
        private init(_ name: String) { self.name = name }
        public var description: String { name }

        /// Disconnect clients (they receive an admin-shutdown error) and shut down cleanly.
        public static let fast = StopMode("fast")
        /// Kill everything at once, like a crash; the next start runs crash recovery.
        public static let immediate = StopMode("immediate")
    }

    /// An error from starting or controlling the server, with the tool output and server log tail.
    public struct ClusterError: Error, CustomStringConvertible {
        public let description: String
    }

    /// The unix socket's port number, and the TCP port on 127.0.0.1 when ``listensOnTCP``.
    public let port: Int
    /// Whether the server also listens on 127.0.0.1 (``start(tcp:)``); otherwise on its socket only.
    public let listensOnTCP: Bool
    /// The directory holding the unix socket (also the cluster's root directory).
    public let socketDirectory: String
    /// The data directory.
    public let dataDirectory: String
    /// Where the PostgreSQL server binaries are.
    public let binDirectory: String
    private let runAsPostgres: Bool
    private let state = Mutex(State())
    /// The database holding schema.sql that ``createSchemaDatabase()`` copies (made on first use, once
    /// per cluster; its error, when it failed, is kept and thrown to every later caller). Held while the
    /// template is made, so that callers wait for it instead of making it twice.
    let schemaTemplate = Mutex<Result<String, any Error>?>(nil)
    /// The login roles ``loginRole(memberOf:)`` has made sure of.
    private let loginRoles = Mutex<Set<String>>([])

    private struct State {
        var running = false
        var destroyed = false
        var databaseCounter = 0
    }

    // MARK: Lifecycle

    private static let sharedCluster = Mutex<Result<PostgresCluster, any Error>?>(nil)

    /// The cluster shared by every test in this process, started on first use.
    public static var shared: PostgresCluster {
        get throws {
            try sharedCluster.withLock { cached in
                if let cached { return try cached.get() }
                let result = Result { try PostgresCluster.start() }
                cached = result
                return try result.get()
            }
        }
    }

    /// Creates and starts a new, independent cluster (for tests that stop and restart the server); with
    /// `tcp`, it also listens on 127.0.0.1 (for tests of TCP itself: ``tcpURL(database:)``).
    public static func start(tcp: Bool = false) throws -> PostgresCluster {
        try start(basedOn: nil, tcp: tcp)
    }

    /// Creates and starts a streaming standby of this cluster (`pg_basebackup -R`, a hot standby that
    /// accepts reads only) with its own directory, socket and port; ``promote()`` makes it a primary.
    public func startStandby() throws -> PostgresCluster {
        try Self.start(basedOn: self, tcp: listensOnTCP)
    }

    /// Promotes a standby to a primary (`pg_ctl promote`) and waits until it accepts writes.
    public func promote() throws {
        try run(binDirectory + "/pg_ctl", ["-D", dataDirectory, "-w", "-t", "60", "-s", "promote"])
    }

    private static func start(basedOn primary: PostgresCluster?, tcp: Bool) throws -> PostgresCluster {
        Registry.prepare()
        let binDirectory = try findBinDirectory()
        let root = try makeRootDirectory()
        let runAsPostgres = geteuid() == 0
        var lastError: any Error = ClusterError(description: "the server did not start")
        for _ in 0..<(tcp ? 3 : 1) {
            // The socket lives in the cluster's own directory: its number collides with nothing.
            let port = tcp ? try probedTCPPort() : 5432
            let cluster = PostgresCluster(
                root: root, port: port, listensOnTCP: tcp, binDirectory: binDirectory,
                runAsPostgres: runAsPostgres)
            Registry.add(root: root, dataDirectory: cluster.dataDirectory)
            do {
                if !FileManager.default.fileExists(atPath: cluster.dataDirectory + "/PG_VERSION") {
                    if let primary { try cluster.copy(from: primary) } else { try cluster.initialize() }
                }
                try cluster.writeSettings()
                try cluster.start()
                return cluster
            } catch {
                lastError = error  // Most likely the TCP port was taken meanwhile: try another.
            }
        }
        throw lastError
    }

    /// A TCP port that was free a moment ago: the one exception to "bind port 0 and read it back",
    /// because PostgreSQL cannot bind port 0 and report it; ``start(basedOn:tcp:)`` retries when taken.
    private static func probedTCPPort() throws -> Int {
        let (fd, port) = try LoopbackSocket.bound()
        close(fd)
        return port
    }

    private init(root: String, port: Int, listensOnTCP: Bool, binDirectory: String, runAsPostgres: Bool) {
        self.socketDirectory = root
        self.dataDirectory = root + "/data"
        self.port = port
        self.listensOnTCP = listensOnTCP
        self.binDirectory = binDirectory
        self.runAsPostgres = runAsPostgres
    }

    /// Starts the server again after `stop(mode:)`, on the same port and socket; waits until it
    /// accepts connections. Does nothing if it is running.
    public func start() throws {
        guard
            try state.withLock({ state throws -> Bool in
                if state.destroyed { throw ClusterError(description: "the cluster has been destroyed") }
                return !state.running
            })
        else { return }
        try run(
            binDirectory + "/pg_ctl",
            ["-D", dataDirectory, "-l", socketDirectory + "/server.log", "-w", "-t", "60", "-s", "start"])
        try waitUntilAcceptingConnections(timeout: .seconds(30))
        state.withLock { $0.running = true }
    }

    /// Stops the server (`pg_ctl stop -m fast|immediate`) and waits until it has exited.
    public func stop(mode: StopMode = .fast) throws {
        try run(
            binDirectory + "/pg_ctl", ["-D", dataDirectory, "-m", mode.name, "-w", "-t", "60", "-s", "stop"])
        state.withLock { $0.running = false }
    }

    /// Stops the server immediately and deletes its directory. The cluster cannot be used afterwards.
    public func destroy() {
        state.withLock {
            $0.destroyed = true
            $0.running = false
        }
        Registry.destroy(root: socketDirectory)
    }

    // MARK: Databases

    /// A URL for `database` over the unix socket, e.g. `postgresql://postgres@/db?host=/tmp/…&port=…`.
    public func url(database: String, user: String = "postgres") -> String {
        "postgresql://\(user)@/\(database)?host=\(socketDirectory)&port=\(port)"
    }

    /// Creates the login role `owner` (with `attributes`, e.g. `CREATEROLE`) and the database `database`
    /// it owns, as the superuser; returns the owner's URL for it.
    public func createDatabase(_ database: String, ownedBy owner: String, attributes: String = "") throws
        -> String
    {
        let admin = try PostgresConnection(configuration: try configuration(database: "postgres"))
        defer { admin.close() }
        try admin.simpleQuery("CREATE ROLE \(owner) LOGIN \(attributes)")
        try admin.simpleQuery("CREATE DATABASE \(database) OWNER \(owner)")
        return url(database: database, user: owner)
    }

    /// A URL for `database` over TCP on 127.0.0.1 (a cluster started with `tcp: true`).
    public func tcpURL(database: String) -> String {
        precondition(listensOnTCP, "tcpURL needs a cluster started with tcp: true")
        return "postgresql://postgres@127.0.0.1:\(port)/\(database)"
    }

    /// A configuration for `database` over the unix socket.
    public func configuration(database: String, applicationName: String? = nil) throws
        -> PostgresConfiguration
    {
        try PostgresConfiguration(url(database: database), applicationName: applicationName)
    }

    /// Creates a fresh, uniquely named database (optionally running `sql` in it, e.g. schema.sql) and
    /// returns a configuration for it. Safe to call from parallel tests.
    public func createDatabase(applying sql: String? = nil) throws -> PostgresConfiguration {
        try createDatabase(copying: nil, applying: sql)
    }

    /// Creates a fresh, uniquely named database as a copy of `template` (a database nobody is connected
    /// to; nil: the empty `template0`), optionally running `sql` in it.
    func createDatabase(copying template: String?, applying sql: String? = nil) throws
        -> PostgresConfiguration
    {
        let name = try state.withLock { state throws -> String in
            state.databaseCounter += 1
            let name = "test_\(getpid())_\(state.databaseCounter)"
            let admin = try PostgresConnection(configuration: configuration(database: "postgres"))
            defer { admin.close() }
            if let template {
                try admin.simpleQuery("CREATE DATABASE \(name) TEMPLATE \(template)")
            } else {
                try admin.simpleQuery("CREATE DATABASE \(name) TEMPLATE template0 ENCODING 'UTF8' LOCALE 'C'")
            }
            return name
        }
        let result = try configuration(database: name)
        if let sql {
            let connection = try PostgresConnection(configuration: result)
            defer { connection.close() }
            try connection.simpleQuery(sql)
        }
        return result
    }

    /// The login role the tests use for the group role `group` (nil: a login role in no group),
    /// `siwa_test_<group>_login`, created once per cluster on a connection of its own (so that tests
    /// on several threads may ask at once).
    public func loginRole(memberOf group: String?) throws -> String {
        let login = "siwa_test_\(group ?? "nobody")_login"
        try loginRoles.withLock { created in
            guard !created.contains(login) else { return }
            let admin = try PostgresConnection(configuration: configuration(database: "postgres"))
            defer { admin.close() }
            let membership = group.map { " IN ROLE \($0)" } ?? ""
            try admin.simpleQuery(
                """
                DO $$ BEGIN
                    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '\(login)') THEN
                        CREATE ROLE \(login) LOGIN\(membership);
                    END IF;
                END $$
                """)
            created.insert(login)
        }
        return login
    }

    // MARK: Setup

    private func initialize() throws {
        try run(
            binDirectory + "/initdb",
            ["-D", dataDirectory, "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8", "--locale=C"])
    }

    /// A base backup of `primary` set up to stream from it (`standby.signal`, `primary_conninfo`).
    private func copy(from primary: PostgresCluster) throws {
        try run(
            binDirectory + "/pg_basebackup",
            [
                "-D", dataDirectory, "-h", primary.socketDirectory, "-p", String(primary.port), "-U",
                "postgres",
                "-R", "-X", "stream", "--checkpoint=fast", "--no-sync",
            ])
    }

    private func writeSettings() throws {
        let settings = """

            # Test cluster settings (appended by PostgresCluster).
            port = \(port)
            listen_addresses = '\(listensOnTCP ? "127.0.0.1" : "")'
            unix_socket_directories = '\(socketDirectory)'
            # fsync only matters when the OS crashes; commits stay durable across stop -m immediate.
            fsync = off
            full_page_writes = off
            max_connections = 300
            shared_buffers = 32MB
            log_min_messages = warning

            """
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: dataDirectory + "/postgresql.conf"))
        defer { try? handle.close() }
        try handle.seekToEnd()
        try handle.write(contentsOf: Data(settings.utf8))
    }

    private func waitUntilAcceptingConnections(timeout: Duration) throws {
        let deadline = ContinuousClock.now + timeout
        let configuration = try PostgresConfiguration(url(database: "postgres"), connectTimeout: .seconds(2))
        while true {
            do {
                let connection = try PostgresConnection(configuration: configuration)
                connection.close()
                return
            } catch {
                if ContinuousClock.now >= deadline {
                    throw ClusterError(description: "PostgreSQL did not accept connections in time: \(error)")
                }
                Thread.sleep(forTimeInterval: 0.05)  // Poll interval, not a wait-and-hope.
            }
        }
    }

    /// Runs a PostgreSQL tool (as `postgres` via runuser when we are root, inside ``toolRoot`` when set)
    /// from the socket directory (a directory the tool may read), without PG* variables; throws with its
    /// output when it fails.
    private func run(_ executable: String, _ arguments: [String]) throws {
        let command: String
        let commandArguments: [String]
        if let root = Self.toolRoot {
            let user = try Self.postgresUser()
            command = "/usr/bin/unshare"
            commandArguments =
                ["--mount", "--", "/bin/sh", "-ec", Self.chrootScript, "sh", root, "\(user.uid):\(user.gid)"]
                + [executable] + arguments
        } else if runAsPostgres {
            command = Self.runuserPath()
            commandArguments = ["-u", "postgres", "--", executable] + arguments
        } else {
            command = executable
            commandArguments = arguments
        }
        let result = try Subprocess.run(
            command, commandArguments,
            environment: ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("PG") },
            workingDirectory: socketDirectory)
        guard result.status == 0 else {
            let log = (try? String(contentsOfFile: socketDirectory + "/server.log", encoding: .utf8)) ?? ""
            throw ClusterError(
                description: "\((executable as NSString).lastPathComponent) \(arguments.last ?? "") failed "
                    + "(status \(result.status)): \(result.standardOutput)\(result.standardError)\n"
                    + "server log tail: \(log.suffix(2000))")
        }
    }

    private static func runuserPath() -> String {
        for path in ["/usr/sbin/runuser", "/sbin/runuser", "/usr/bin/runuser"]
        where FileManager.default.isExecutableFile(atPath: path) {
            return path
        }
        return "/usr/sbin/runuser"
    }

    /// The root file system whose PostgreSQL the clusters run (the environment variable
    /// `POSTGRES_CLUSTER_CHROOT`, e.g. Debian 13's from `make test-postgres17`), or nil: this machine's.
    /// Its binaries need its own libc, so every tool runs inside it, as root only.
    public static let toolRoot: String? = ProcessInfo.processInfo.environment["POSTGRES_CLUSTER_CHROOT"]
        .flatMap {
            $0.isEmpty ? nil : $0
        }

    /// In a mount namespace of its own: /tmp (the clusters' directories, at the same paths), /dev and
    /// /proc bound into the root "$1", then "$3…" run there as uid:gid "$2".
    private static let chrootScript = """
        /usr/bin/mount --rbind /tmp "$1/tmp"
        /usr/bin/mount --rbind /dev "$1/dev"
        /usr/bin/mount --rbind /proc "$1/proc"
        root=$1 user=$2
        shift 2
        exec /usr/sbin/chroot --userspec="$user" --groups="${user#*:}" "$root" "$@"
        """

    /// This machine's `postgres` user, whom the root's must match (the clusters' files are his).
    private static func postgresUser() throws -> (uid: uid_t, gid: gid_t) {
        guard let user = getpwnam("postgres") else {
            throw ClusterError(
                description: "running as root but there is no 'postgres' user to run the server")
        }
        return (user.pointee.pw_uid, user.pointee.pw_gid)
    }

    /// The bin directory of the newest PostgreSQL in ``toolRoot`` (a path inside it), after checking that
    /// we are root and that its `postgres` user has this machine's uid and gid.
    private static func findBinDirectory(inRoot root: String) throws -> String {
        guard geteuid() == 0 else {
            throw ClusterError(description: "POSTGRES_CLUSTER_CHROOT needs root (unshare, chroot)")
        }
        let user = try postgresUser()
        let passwd = (try? String(contentsOfFile: root + "/etc/passwd", encoding: .utf8)) ?? ""
        let entry = passwd.split(separator: "\n").first { $0.hasPrefix("postgres:") }?.split(separator: ":")
        guard let entry, entry.count > 3, entry[2] == "\(user.uid)", entry[3] == "\(user.gid)" else {
            throw ClusterError(
                description: "POSTGRES_CLUSTER_CHROOT \(root): its postgres user is not uid \(user.uid), gid "
                    + "\(user.gid) like this machine's (rebuild it: scripts/container-images postgres17)")
        }
        guard let bin = newestBinDirectory(in: root) else {
            throw ClusterError(
                description: "POSTGRES_CLUSTER_CHROOT \(root): no /usr/lib/postgresql/*/bin/initdb in it")
        }
        return bin
    }

    /// The newest /usr/lib/postgresql/*/bin with an initdb in the file system at `root` (a path inside it).
    private static func newestBinDirectory(in root: String = "") -> String? {
        let base = "/usr/lib/postgresql"
        let versions = ((try? FileManager.default.contentsOfDirectory(atPath: root + base)) ?? [])
            .compactMap { Int($0) }.sorted(by: >)
        return versions.map { "\(base)/\($0)/bin" }.first {
            FileManager.default.isExecutableFile(atPath: root + $0 + "/initdb")
        }
    }

    /// `pg_config --bindir` when it has the server binaries, else the newest /usr/lib/postgresql/*/bin
    /// (inside ``toolRoot`` when it is set).
    private static func findBinDirectory() throws -> String {
        if let root = toolRoot { return try findBinDirectory(inRoot: root) }
        let fileManager = FileManager.default
        for directory in ["/usr/bin", "/usr/local/bin", "/usr/local/pgsql/bin"]
        where fileManager.isExecutableFile(atPath: directory + "/pg_config") {
            if let result = try? Subprocess.run(directory + "/pg_config", ["--bindir"]), result.status == 0 {
                let bin = result.standardOutput.trimmingCharacters(in: .whitespacesAndNewlines)
                if fileManager.isExecutableFile(atPath: bin + "/initdb") { return bin }
            }
        }
        if let bin = newestBinDirectory() { return bin }
        throw ClusterError(
            description: "PostgreSQL server binaries not found (install the Debian package 'postgresql')")
    }

    /// A new directory /tmp/siwa-pg-XXXXXX (short, for the socket path), owned by `postgres` when root.
    private static func makeRootDirectory() throws -> String {
        var template = Array("/tmp/siwa-pg-XXXXXX".utf8CString)
        guard let pointer = mkdtemp(&template) else {
            throw ClusterError(description: "mkdtemp failed with errno \(errno)")
        }
        let root = String(cString: pointer)
        try Data("\(getpid())\n".utf8).write(to: URL(fileURLWithPath: root + "/owner.pid"))
        if geteuid() == 0 {
            let user = try postgresUser()
            for path in [root, root + "/owner.pid"] where chown(path, user.uid, user.gid) != 0 {
                throw ClusterError(description: "chown \(path) failed with errno \(errno)")
            }
        }
        return root
    }

}

/// Clusters started by this process, shut down at exit; also sweeps clusters of dead processes.
private enum Registry {
    private static let roots = Mutex<[String: String]>([:])
    private static let prepared = Mutex(false)

    static func prepare() {
        let first = prepared.withLock { done in
            defer { done = true }
            return !done
        }
        guard first else { return }
        sweepAbandoned()
        atexit { Registry.destroyAll() }
    }

    static func add(root: String, dataDirectory: String) {
        roots.withLock { $0[root] = dataDirectory }
    }

    static func destroy(root: String) {
        guard let data = roots.withLock({ $0.removeValue(forKey: root) }) else { return }
        shutDown(root: root, dataDirectory: data)
    }

    static func destroyAll() {
        let all = roots.withLock { roots in
            defer { roots.removeAll() }
            return roots
        }
        for (root, data) in all { shutDown(root: root, dataDirectory: data) }
    }

    /// SIGQUIT to the postmaster (immediate shutdown), wait for it to exit (bounded), remove the files.
    private static func shutDown(root: String, dataDirectory: String) {
        if let text = try? String(contentsOfFile: dataDirectory + "/postmaster.pid", encoding: .utf8),
            let line = text.split(separator: "\n").first,
            let pid = pid_t(line.trimmingCharacters(in: .whitespaces)),
            pid > 0
        {
            kill(pid, SIGQUIT)
            let deadline = ContinuousClock.now + .seconds(10)
            while kill(pid, 0) == 0 && ContinuousClock.now < deadline { usleep(10_000) }
        }
        try? FileManager.default.removeItem(atPath: root)
    }

    /// Removes /tmp/siwa-pg-* directories whose owning test process no longer exists.
    private static func sweepAbandoned() {
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/tmp")) ?? []
        for entry in entries where entry.hasPrefix("siwa-pg-") {
            let root = "/tmp/" + entry
            guard let text = try? String(contentsOfFile: root + "/owner.pid", encoding: .utf8),
                let owner = pid_t(text.trimmingCharacters(in: .whitespacesAndNewlines)), owner > 0
            else { continue }
            if kill(owner, 0) != 0 && errno == ESRCH { shutDown(root: root, dataDirectory: root + "/data") }
        }
    }
}

/// The repository's root directory (the one holding Package.swift), e.g. to find schema.sql.
public enum RepositoryRoot {
    /// Found by walking up from this source file.
    public static let url: URL = {
        var directory = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        while directory.path != "/" {
            if FileManager.default.fileExists(atPath: directory.appendingPathComponent("Package.swift").path)
            {
                return directory
            }
            directory.deleteLastPathComponent()
        }
        return URL(fileURLWithPath: FileManager.default.currentDirectoryPath)
    }()
}
