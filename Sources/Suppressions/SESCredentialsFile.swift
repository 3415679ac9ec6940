public import Foundation
public import ServiceSupport
import Synchronization

/// SES's access key from a secret file (`--ses-credentials-file`), read again when the file changes, so
/// a rotated key is used without a restart.
public final class SESCredentialsFile: Sendable {
    /// What tells one version of the file from another: device, inode, size, modification and change times.
    struct Version: Equatable {
        var device: UInt64
        var inode: UInt64
        var size: Int64
        var modified: timespec
        var changed: timespec

        static func == (lhs: Version, rhs: Version) -> Bool {
            lhs.device == rhs.device && lhs.inode == rhs.inode && lhs.size == rhs.size
                && lhs.modified.tv_sec == rhs.modified.tv_sec && lhs.modified.tv_nsec == rhs.modified.tv_nsec
                && lhs.changed.tv_sec == rhs.changed.tv_sec && lhs.changed.tv_nsec == rhs.changed.tv_nsec
        }
    }

    private struct State {
        var credentials: SigV4Signer.Credentials
        /// The version last read, good or not (a bad one is reported once, not at every call).
        var version: Version?
    }

    /// The file's path.
    public let path: String
    private let setting: String
    private let logger: Logger?
    private let state: Mutex<State>

    /// Reads the file at `path` (``SecretFile/read(_:setting:)``: owner-only mode) now; `logger` gets
    /// the errors of later reads.
    /// - Throws: `ConfigurationError` naming `setting` and the path, never a value.
    public init(path: String, setting: String = "--ses-credentials-file", logger: Logger? = nil) throws {
        self.path = path
        self.setting = setting
        self.logger = logger
        let version = Self.version(of: path)
        state = Mutex(State(credentials: try Self.read(path, setting: setting), version: version))
    }

    /// The key to sign with now: the file is read again when its version changed since the last read
    /// (one `stat`); a file that cannot be read or parsed keeps the last good key, and is logged.
    public func current() -> SigV4Signer.Credentials {
        state.withLock { state in
            let version = Self.version(of: path)
            guard let version, version != state.version else { return state.credentials }
            state.version = version
            do {
                state.credentials = try Self.read(path, setting: setting)
                logger?.info("SES credentials file read again", ["path": .string(path)])
            } catch {
                // The reader's errors name the setting, path and mode, never a value.
                let reason = (error as? ConfigurationError)?.message ?? "cannot read \(setting) \(path)"
                logger?.error(
                    "SES credentials file changed but cannot be used; keeping the last good key: \(reason)",
                    ["path": .string(path)])
            }
            return state.credentials
        }
    }

    private static func read(_ path: String, setting: String) throws -> SigV4Signer.Credentials {
        try SigV4Signer.Credentials(
            fileText: String(decoding: try SecretFile.read(path, setting: setting), as: UTF8.self))
    }

    private static func version(of path: String) -> Version? {
        var info = stat()
        guard stat(path, &info) == 0 else { return nil }
        return Version(
            device: UInt64(info.st_dev), inode: UInt64(info.st_ino), size: Int64(info.st_size),
            modified: info.st_mtim, changed: info.st_ctim)
    }
}
