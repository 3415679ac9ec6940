public import Foundation

/// The recipient team of the tests: a second team the local Apple knows.
public struct TransferRecipient {
    /// Its team ID.
    public static let teamID = "TEAMB00000"
    /// Its team key's ID.
    public static let keyID = "KEYB000000"
    /// Where its key files are.
    public let directory: URL
    /// Its team key (`AuthKey_<keyID>.p8`, P-256, mode 0600).
    public var keyFile: URL { directory.appendingPathComponent("AuthKey_\(Self.keyID).p8") }
    /// The team key's public half (PEM).
    public var publicKeyFile: URL { directory.appendingPathComponent("recipient-public.pem") }

    /// Makes its team key with the openssl CLI in `directory`.
    public init(directory: URL) throws {
        self.directory = directory
        try openssl([
            "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", keyFile.path,
        ])
        try openssl(["pkey", "-in", keyFile.path, "-pubout", "-out", publicKeyFile.path])
        chmod(keyFile.path, 0o600)
    }

    /// The recipient as the local Apple knows it.
    public var transferTeam: LocalApple.TransferTeam {
        LocalApple.TransferTeam(teamID: Self.teamID, keyID: Self.keyID, publicKeyFile: publicKeyFile)
    }
}
