public import Foundation
import Synchronization

/// glibc's `posix_spawn_file_actions_addclosefrom_np` (2.34+), which Swift's Glibc module does not export.
private typealias AddCloseFrom =
    @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32
private let closeFrom: AddCloseFrom? = dlopen(nil, RTLD_NOW).flatMap { handle in
    dlsym(handle, "posix_spawn_file_actions_addclosefrom_np").map { unsafeBitCast($0, to: AddCloseFrom.self) }
}

/// A child process started with `posix_spawn` and reaped with `waitpid`.
///
/// Tests use this instead of `Foundation.Process`, whose SIGCHLD-based exit detection can miss exits
/// when several processes are started concurrently (the test then hangs on a zombie).
public final class Subprocess: Sendable {
    /// How a process ended.
    public enum Termination: Equatable, Sendable {
        case exited(Int32)
        case signaled(Int32)
    }

    /// The child's process id.
    public let pid: pid_t
    /// How the child ended, once reaped. Held while signalling and reaping, so that a signal never
    /// reaches a reaped (and perhaps reused) pid.
    private let termination = Mutex<Termination?>(nil)

    /// Starts `executable` with `arguments`.
    /// - Parameters:
    ///   - environment: the child's environment (default: this process's).
    ///   - standardInput / standardOutput / standardError: file paths (default /dev/null).
    public init(
        _ executable: String, _ arguments: [String], environment: [String: String]? = nil,
        standardInput: String? = nil, standardOutput: String? = nil, standardError: String? = nil,
        workingDirectory: String? = nil
    ) throws {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, standardInput ?? "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(
            &actions, 1, standardOutput ?? "/dev/null", O_WRONLY | O_CREAT | O_APPEND, 0o644)
        posix_spawn_file_actions_addopen(
            &actions, 2, standardError ?? "/dev/null", O_WRONLY | O_CREAT | O_APPEND, 0o644)
        // Nothing else the test process has open leaks into the child: a file another test is writing
        // (say, a copied binary about to be run) would otherwise stay open in a long-lived child and make
        // exec of that file fail with ETXTBSY.
        _ = closeFrom?(&actions, 3)
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        // The child starts with default signal handling and no blocked signals.
        var defaults = sigset_t()
        sigfillset(&defaults)
        var empty = sigset_t()
        sigemptyset(&empty)
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        posix_spawnattr_setsigmask(&attributes, &empty)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK))

        let environment = environment ?? ProcessInfo.processInfo.environment
        // The working directory is set by env(1): posix_spawn's chdir action does not import here.
        let command =
            workingDirectory == nil
            ? [executable] : ["/usr/bin/env", "--chdir=\(workingDirectory!)", executable]
        let argv = (command + arguments).map { strdup($0) } + [nil]
        let envp = environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            for pointer in argv { free(pointer) }
            for pointer in envp { free(pointer) }
        }
        var pid: pid_t = 0
        let status = posix_spawn(&pid, command[0], &actions, &attributes, argv, envp)
        guard status == 0 else {
            throw ExecutableError("cannot start \(executable): \(String(cString: strerror(status)))")
        }
        self.pid = pid
    }

    /// Sends `signal` to the child (if it has not been reaped yet).
    public func send(_ signal: Int32) {
        termination.withLock { termination in
            if termination == nil { kill(pid, signal) }
        }
    }

    /// Whether the child is still running.
    public var isRunning: Bool { poll() == nil }

    /// Waits for the child to end; nil if it is still running after `timeout`.
    @discardableResult
    public func wait(timeout: Duration = .seconds(60)) -> Termination? {
        let deadline = ContinuousClock.now + timeout
        while true {
            if let termination = poll() { return termination }
            if ContinuousClock.now >= deadline { return nil }
            Thread.sleep(forTimeInterval: 0.005)
        }
    }

    private func poll() -> Termination? {
        termination.withLock { termination in
            if let termination { return termination }
            var status: Int32 = 0
            let result = waitpid(pid, &status, WNOHANG)
            guard result == pid else { return nil }
            // WIFEXITED / WEXITSTATUS / WTERMSIG are macros; decode the status word by hand.
            let signal = status & 0x7f
            termination = signal == 0 ? .exited((status >> 8) & 0xff) : .signaled(signal)
            return termination
        }
    }

    deinit {
        if poll() == nil {
            kill(pid, SIGKILL)
            var status: Int32 = 0
            waitpid(pid, &status, 0)
        }
    }

    /// Runs `executable` to completion and returns its status and output.
    public static func run(
        _ executable: String, _ arguments: [String], environment: [String: String]? = nil, input: Data? = nil,
        timeout: Duration = .seconds(120), workingDirectory: String? = nil
    ) throws -> ExecutableLocator.Result {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(
            "siwa-run-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let inputPath = directory.appendingPathComponent("stdin").path
        let outputPath = directory.appendingPathComponent("stdout").path
        let errorPath = directory.appendingPathComponent("stderr").path
        _ = FileManager.default.createFile(atPath: inputPath, contents: input ?? Data())
        let process = try Subprocess(
            executable, arguments, environment: environment, standardInput: inputPath,
            standardOutput: outputPath, standardError: errorPath, workingDirectory: workingDirectory)
        guard let termination = process.wait(timeout: timeout) else {
            process.send(SIGKILL)
            process.wait()
            throw ExecutableError(
                "\((executable as NSString).lastPathComponent) did not finish within \(timeout)")
        }
        let status: Int32
        switch termination {
        case .exited(let code): status = code
        case .signaled(let signal): status = 128 + signal
        }
        return ExecutableLocator.Result(
            status: status,
            standardOutput: (try? String(contentsOfFile: outputPath, encoding: .utf8)) ?? "",
            standardError: (try? String(contentsOfFile: errorPath, encoding: .utf8)) ?? "")
    }
}
