public import Foundation

/// The one rule for a file that holds a secret (the `.p8` Apple key client secrets are minted from,
/// the refresh-token key file, the sign-in API's bearer-token file): a regular file that neither its
/// group nor others may read, write or run (mode 0600 or 0400). Every executable and library reads such
/// a file through ``read(_:setting:)`` and nothing else, so each refuses it the same way.
///
/// The mode is taken from the open file (`fstat` on the descriptor that is then read), so a file swapped
/// between the check and the read is still the one checked. A symbolic link is followed: the mode that
/// counts is the target's.
public enum SecretFile {
    /// The permission bits a secret file must not have: any access by group or others.
    public static let forbiddenBits: mode_t = 0o077

    /// Reads the secret file at `path`. Refused, with a ``ConfigurationError`` that names `setting`
    /// (e.g. `--apple-key-file`), the path and the mode but never the content: a file that cannot be
    /// opened, is not a regular file, or is open to group or others (`chmod 600` fixes it).
    public static func read(_ path: String, setting: String) throws(ConfigurationError) -> Data {
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else {
            throw ConfigurationError("cannot read \(setting) \(path): \(String(cString: strerror(errno)))")
        }
        let handle = FileHandle(fileDescriptor: descriptor, closeOnDealloc: true)
        var info = stat()
        guard fstat(descriptor, &info) == 0 else {
            throw ConfigurationError("cannot read \(setting) \(path): \(String(cString: strerror(errno)))")
        }
        guard info.st_mode & S_IFMT == S_IFREG else {
            throw ConfigurationError("\(setting) \(path) is not a regular file")
        }
        let mode = info.st_mode & 0o7777
        guard mode & forbiddenBits == 0 else {
            throw ConfigurationError(
                "\(setting) \(path) has mode \(octal(mode)): a secret file must be readable by its owner only (chmod 600 \(path))"
            )
        }
        do {
            return try handle.readToEnd() ?? Data()
        } catch {
            throw ConfigurationError("cannot read \(setting) \(path)")
        }
    }

    /// `mode` as four octal digits (`0644`).
    static func octal(_ mode: mode_t) -> String {
        let digits = String(mode, radix: 8)
        return String(repeating: "0", count: max(0, 4 - digits.count)) + digits
    }
}
