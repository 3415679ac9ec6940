/// Why a cryptographic operation or key was refused; `description` never holds key material.
public struct CryptoError: Error, Sendable, Equatable, CustomStringConvertible {
    /// What went wrong, broadly.
    public enum Kind: Sendable, Equatable {
        /// The key bytes or text could not be read as a key.
        case unreadableKey
        /// The key was read but is not of the type or size asked for.
        case wrongKeyType
        /// OpenSSL failed (or refused the input) while computing.
        case operationFailed
    }

    /// The broad reason.
    public let kind: Kind
    /// One line for people.
    public let description: String

    /// An error of `kind` described by `description`.
    public init(_ kind: Kind, _ description: String) {
        self.kind = kind
        self.description = description
    }
}
